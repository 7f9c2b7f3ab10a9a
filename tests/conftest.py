"""Shared test set-up: the `cuda` marker is skipped here, centrally, when no GPU is present, and each `cuda` test that
leaves the device unusable fails (so its neighbours in the worker do not); every simulated CUDA runtime a test makes
is checked when it ends; the tuning bank and the devices' tuning locks are fresh folders for the session (a user's bank
must not change what the tests compile), and the compile cache a fresh folder for each test (an entry another test
wrote must not change what a test compiles)."""

from __future__ import annotations

import pytest
import torch

import airgraph.runtime.capture as capture_module
from airgraph.log import forget_warnings
from tests.helpers import cuda_unusable

pytest_plugins = ["tests.plugins.shuffle"]  # --shuffle=SEED (make test runs a shuffled order)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees airgraph's warn-once warnings (airgraph/log.py) as a fresh process would."""
    forget_warnings()
    yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches would otherwise carry compiled code across tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _cuda_left_usable(request: pytest.FixtureRequest):
    """After each `cuda` test: a random op and a small capture still work, or this test fails (in its teardown) naming
    why, and the generator is reset for the worker's next tests."""
    yield
    if request.node.get_closest_marker("cuda") is None or not torch.cuda.is_available():
        return
    reason = cuda_unusable()
    if reason is not None:
        pytest.fail(f"this test left CUDA unusable for the tests after it: {reason}", pytrace=False)


@pytest.fixture(autouse=True)
def _simulators_checked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Every SimulatedCuda a test makes is checked when the test ends: no replay read a tensor at an address other than
    the one its graph was recorded with, no race, no early free. An output equal to eager's does not show those: the
    simulator computes on the tensors it is given and only records the problem. Tests of the simulator's own reports
    (marked ``simulator_problems``) look at them themselves."""
    if request.node.get_closest_marker("simulator_problems") is not None:
        yield
        return
    from airgraph.runtime.simulated import SimulatedCuda

    made = instances_made(monkeypatch, SimulatedCuda)
    yield
    for sim in made:
        sim.check()


def instances_made(monkeypatch: pytest.MonkeyPatch, cls: type) -> list:
    """Every instance of ``cls`` made from now until the test ends, in order (its ``__init__`` wrapped)."""
    made: list = []
    init = cls.__init__

    def tracked(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(cls, "__init__", tracked)
    return made


@pytest.fixture(autouse=True)
def _fresh_compile_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """Each test (and the processes it starts) has a compile cache of its own, empty (airgraph/cache)."""
    monkeypatch.setenv("AIRGRAPH_CACHE_DIR", str(tmp_path_factory.mktemp("compile-cache")))
    yield


@pytest.fixture
def cuda_device() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(autouse=True, scope="session")
def _session_tuning_bank(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRGRAPH_TUNE_BANK", str(tmp_path_factory.mktemp("tuning-bank")))
        # the devices' measuring turns (tuning/turns.py): this session's own, not the user's nor another session's
        patch.setenv("AIRGRAPH_TUNE_LOCK_DIR", str(tmp_path_factory.mktemp("device-locks")))
        for name in ("AIRGRAPH_TUNE_MODE", "AOE_MODE", "TUNE_BANK_PATH", "REPEAT_TUNE", "ASCEND_WORK_PATH"):
            patch.delenv(name, raising=False)
        yield


FIXED_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2
"""


@pytest.fixture
def fixed_machine(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """One fixed machine (an H100 beside a Xeon, torch 2.11.0+cu128, 8 threads) for airgraph/machine.py, the one
    reader of the machine's facts, so that tests can pin the keys computed from them; the real facts are read
    again after the test."""
    import platform
    import sys

    import airgraph
    from airgraph import machine
    from airgraph.tuning import env

    cpuinfo = tmp_path_factory.mktemp("machine") / "cpuinfo"
    cpuinfo.write_text(FIXED_CPUINFO)
    monkeypatch.setattr(machine, "CPUINFO", cpuinfo)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    monkeypatch.setattr(airgraph, "__version__", "0.1.0")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "git_version", "0123abcd")
    monkeypatch.setattr(sys, "version", "3.11.7 (main) [GCC 12.2.0]")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    compiler = {"command": "g++", "path": "/usr/bin/g++-13", "version": "g++ 13.3.0"}
    monkeypatch.setattr(machine, "compiler", lambda: compiler)
    caches = (machine._cpu, machine._gpu, env._current)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[capture_module.GraphCapture]:
    """Every GraphCapture made during the test, in order (their keys say what was recorded and replayed)."""
    return instances_made(monkeypatch, capture_module.GraphCapture)
