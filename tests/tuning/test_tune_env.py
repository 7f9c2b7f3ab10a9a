"""The environment a bank file is for (tuning/env.py): its fields and digest stay what earlier airgraph versions
computed from the same machine (a bank file is named by the digest, each entry's key contains it), and they are
computed once per device and thread count, not once per segment looked up."""

from __future__ import annotations

import pytest
import torch

from airgraph.tuning import env
from airgraph.tuning.bank import bank_file_name
from airgraph.tuning.keys import unit_key

VERSIONS = {"torch": "2.11.0+cu128", "airgraph": "0.1.0"}
# Computed by airgraph at 7a69cc2 (before tuning/env.py took its facts from kernels/machine.py) on the machine of
# the fixed_machine fixture (tests/conftest.py): (environment, digest, bank file name, key of base "0" * 24).
PINNED = {
    "cpu": (
        {"device_type": "cpu", "device": "Intel(R) Xeon(R) Platinum 8480+", "isa": "AVX512", "threads": 8, **VERSIONS},
        "0c4f5df89609",
        "cpu-torch2.11.0+cu128-0c4f5df89609.jsonl",
        "ebc8aede21be80242455",
    ),
    "cuda": (
        {"device_type": "cuda", "device": "NVIDIA H100 80GB HBM3", "capability": "9.0", "cuda": "12.8", **VERSIONS},
        "58fe13921fdd",
        "cuda-torch2.11.0+cu128-58fe13921fdd.jsonl",
        "20534a3e7323ebc0131b",
    ),
}


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["cpu", "gpu"])  # ("cuda" would mark it a GPU test)
def test_bank_keys_of_a_machine_stay_those_of_earlier_versions(fixed_machine, device):
    environment, digest, file_name, key = PINNED[device]
    assert env.environment(torch.device(device)) == environment
    assert env.current(torch.device(device)) == (environment, digest)
    assert env.env_digest(environment) == digest
    assert bank_file_name(environment, digest) == file_name
    assert unit_key("0" * 24, digest, 1) == key


def test_planning_on_fake_cuda_tensors_keys_no_gpu(fixed_machine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    unavailable = {"device_type": "cuda", "device": "unavailable", **VERSIONS}
    assert env.current(torch.device("cuda")) == (unavailable, "bdb417a3522e")


def test_the_environment_is_computed_once_per_device_and_thread_count(fixed_machine, monkeypatch):
    calls = []
    environment = env.environment
    monkeypatch.setattr(env, "environment", lambda device: calls.append(device) or environment(device))
    cpu = env.current(torch.device("cpu"))
    assert env.current(torch.device("cpu")) == cpu and len(calls) == 1  # a segment after the first: no work
    cpu[0]["threads"] = 1  # the caller's copy
    assert env.current(torch.device("cpu")) == PINNED["cpu"][:2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # torch.set_num_threads: another environment
    four = env.current(torch.device("cpu"))
    assert four[0]["threads"] == 4 and four[1] != cpu[1] and len(calls) == 2
    assert env.current(torch.device("cuda")) == env.current(torch.device("cuda", 0)) == PINNED["cuda"][:2]
    assert len(calls) == 3  # the current CUDA device is device 0
