"""airgraph's one machine fingerprint (airgraph/machine.py), read from one fixed machine: benchmark results keep
the fields and values they always had (the other views, pinned in tests/kernels/test_machine.py and
tests/tuning/test_tune_env.py, are the persisted keys of kernels and banks); what costs something is read once."""

from __future__ import annotations

import os

import pytest
import torch

from airgraph import machine
from airgraph.bench.results import environment
from airgraph.kernels.machine import describe

# Written by airgraph at 22b9af8 (before bench/results.py took its facts from airgraph/machine.py) on the machine of
# the fixed_machine fixture (tests/conftest.py) with 2 cores and Python 3.11.7; less its commit and timestamp.
PINNED = {
    "cpu": {"device": "x86_64 (2 cores)", "torch": "2.11.0+cu128", "airgraph": "0.1.0", "python": "3.11.7"},
    "cuda": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu128", "airgraph": "0.1.0", "python": "3.11.7"},
}


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["cpu", "gpu"])  # ("cuda" would mark it a GPU test)
def test_benchmark_results_keep_their_fields_and_values(fixed_machine, monkeypatch, device):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("platform.python_version", lambda: "3.11.7")
    result = environment(torch.device(device))
    assert list(result) == ["device", "torch", "airgraph", "commit", "python", "timestamp"]
    assert {k: v for k, v in result.items() if k not in ("commit", "timestamp")} == PINNED[device]


def test_one_fingerprint_of_the_fixed_machine(fixed_machine, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cpu, gpu = machine.fingerprint(torch.device("cpu")), machine.fingerprint(torch.device("cuda"))
    assert (cpu.torch, cpu.airgraph, cpu.cuda, cpu.git, cpu.threads, cpu.cores) == (
        "2.11.0+cu128",
        "0.1.0",
        "12.8",
        "0123abcd",
        8,
        2,
    )
    assert cpu.cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+" and cpu.gpu is None
    assert gpu.gpu == {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "cuda": "12.8"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # planning on fake CUDA tensors
    assert machine.fingerprint(torch.device("cuda")).gpu is None


def test_the_machine_is_read_once_per_process(fixed_machine, monkeypatch):
    reads = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: reads.append(index) or (9, 0))
    text = machine.CPUINFO.read_text
    monkeypatch.setattr(type(machine.CPUINFO), "read_text", lambda self, **kw: reads.append("cpuinfo") or text(**kw))
    for _ in range(3):
        machine.fingerprint(torch.device("cuda", 0))
    assert reads == ["cpuinfo", 0]


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
    from torch._inductor import config as inductor_config  # (imported here: torch's config, not airgraph's)

    before = inductor_config.cpp.cxx
    monkeypatch.setattr(machine, "VERSION_TIMEOUT", 0.5)
    machine.compiler.cache_clear()
    try:  # torch's own patch: pytest's monkeypatch may leave the setting hidden ("cpp.cxx does not exist")
        with inductor_config.patch({"cpp.cxx": (None, str(hung))}):
            assert "compiler" not in describe(torch.device("cpu"))
            assert machine.compiler() == {"command": str(hung), "path": str(hung), "version": ""}
    finally:
        machine.compiler.cache_clear()
    assert inductor_config.cpp.cxx == before  # what every later Inductor CPU compile in this worker reads
