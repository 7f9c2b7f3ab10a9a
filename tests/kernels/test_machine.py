"""What a kernel was built for (kernels/machine.py, a view of airgraph/machine.py's fingerprint), read from one fixed
machine: the build record a package's manifest carries (its installed name digests the manifest) and the load probe's
environment digest (the key of its verdicts) stay what earlier airgraph versions wrote, and the tuning bank reads the
same facts."""

from __future__ import annotations

import json

import pytest
import torch

from airgraph import machine
from airgraph.kernels import machine as kernels_machine
from airgraph.kernels import probe
from airgraph.tuning.env import environment

VERSIONS = '{"torch": "2.11.0+cu128", "airgraph": "0.1.0", '
COMPILER = '"compiler": {"command": "g++", "path": "/usr/bin/g++-13", "version": "g++ 13.3.0"}}'
# Written by airgraph at 7a69cc2 on the machine of the fixed_machine fixture (tests/conftest.py): describe() as
# json.dumps writes it (in its key order) and the probe's environment digest.
PINNED = {
    "cpu": (
        VERSIONS + '"device": {"type": "cpu", "machine": "x86_64", "model": "Intel(R) Xeon(R) Platinum 8480+", '
        '"isa": "AVX512", "flags": ["amx_tile", "avx2", "avx512bw", "avx512f", "fpu", "sse2"]}, ' + COMPILER,
        "9c583f6ada0b9d50",
    ),
    "cuda": (
        VERSIONS
        + '"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "cuda": "12.8"}, '
        + COMPILER,
        "c8d4fe9ad030a7fd",
    ),
}


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["cpu", "gpu"])  # ("cuda" would mark it a GPU test)
def test_build_records_and_probe_keys_stay_those_of_earlier_versions(fixed_machine, device):
    record, digest = PINNED[device]
    assert json.dumps(kernels_machine.build_record(torch.device(device))) == record
    assert probe._digest(probe.environment(torch.device(device))) == digest


def test_the_tuning_bank_reads_the_same_facts(fixed_machine):
    cpu, gpu = machine.cpu(), machine.gpu(torch.device("cuda"))
    assert environment(torch.device("cpu"))["device"] == cpu["model"]
    assert environment(torch.device("cpu"))["isa"] == cpu["isa"]
    assert environment(torch.device("cuda"))["device"] == gpu["name"]
    assert environment(torch.device("cuda"))["capability"] == gpu["capability"]
