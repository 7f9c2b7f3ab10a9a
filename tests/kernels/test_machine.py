"""What a kernel was built for (kernels/machine.py), read from one fixed machine: the build record a package's
manifest carries (its installed name digests the manifest) and the load probe's environment digest (the key of its
verdicts) stay what earlier airgraph versions wrote, and the tuning bank reads the same facts."""

from __future__ import annotations

import json

import pytest
import torch

from airgraph.kernels import machine, probe
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
    assert json.dumps(machine.build_record(torch.device(device))) == record
    assert probe._digest(probe.environment(torch.device(device))) == digest


def test_the_tuning_bank_reads_the_same_facts(fixed_machine):
    cpu, gpu = machine.cpu(), machine.gpu(torch.device("cuda"))
    assert environment(torch.device("cpu"))["device"] == cpu["model"]
    assert environment(torch.device("cpu"))["isa"] == cpu["isa"]
    assert environment(torch.device("cuda"))["device"] == gpu["name"]
    assert environment(torch.device("cuda"))["capability"] == gpu["capability"]


def test_a_cpu_without_cpuinfo_is_named_by_platform(fixed_machine, tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr("platform.processor", lambda: "arm")
    machine._cpu.cache_clear()
    assert machine.cpu() | {"isa": None} == {
        "type": "cpu",
        "machine": "x86_64",
        "model": "arm",
        "isa": None,
        "flags": [],
    }
    machine.cpu()["flags"].append("x")  # the caller's copy
    assert machine.cpu()["flags"] == []


def test_a_hung_compiler_wrapper_costs_its_time_limit_and_loads_never_ask(tmp_path, monkeypatch):
    """``CXX`` may be a wrapper script (the H200 machine's is); one that hangs is given up after
    VERSION_TIMEOUT, and loading a kernel (describe) never runs the compiler at all."""
    hung = tmp_path / "c++"
    hung.write_text("#!/bin/sh\nsleep 60\n")
    hung.chmod(0o755)
    from torch._inductor import config as inductor_config

    before = inductor_config.cpp.cxx
    monkeypatch.setattr(machine, "VERSION_TIMEOUT", 0.5)
    machine.compiler.cache_clear()
    try:  # torch's own patch: pytest's monkeypatch may leave the setting hidden ("cpp.cxx does not exist")
        with inductor_config.patch({"cpp.cxx": (None, str(hung))}):
            assert "compiler" not in machine.describe(torch.device("cpu"))
            assert machine.compiler() == {"command": str(hung), "path": str(hung), "version": ""}
    finally:
        machine.compiler.cache_clear()
    assert inductor_config.cpp.cxx == before  # what every later Inductor CPU compile in this worker reads
