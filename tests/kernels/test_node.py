"""Several processes on a node: LOCAL_WORLD_SIZE required and equal (the seed's rule); one builder per kernel, the
others run dynamic kernels until it is installed, then switch."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from airgraph.backend import AirgraphBackend
from airgraph.kernels import dispatch, node
from airgraph.kernels.node import StaticKernelsError, register_process
from airgraph.store import read_json, write_json_atomic
from tests.helpers import assert_close, exited_pid
from tests.kernels.conftest import ROOT, static_config
from tests.kernels.models import Step, inputs


@pytest.mark.parametrize("ranks", [{"local_rank": 1}, {"world_size": 4}, {"local_rank": 0, "world_size": 2}])
def test_several_local_processes_without_local_world_size_is_an_error(tmp_path, ranks):
    with pytest.raises(StaticKernelsError, match=r"LOCAL_WORLD_SIZE is not set, but .* say several processes"):
        AirgraphBackend(static_config(tmp_path, **ranks))
    AirgraphBackend(static_config(tmp_path, local_world_size=2, **ranks))  # set: fine


def test_local_rank_from_the_environment_needs_local_world_size(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(StaticKernelsError, match="set LOCAL_WORLD_SIZE to the number of processes on this node"):
        AirgraphBackend(static_config(tmp_path))


REGISTER = """
import sys
from pathlib import Path
from airgraph.kernels.node import register_process
register_process(Path(sys.argv[1]), local_world_size=int(sys.argv[2]), local_rank=0, world_size=None)
print("registered", flush=True)
sys.stdin.readline()
"""


def test_local_world_size_differing_between_processes_is_an_error(tmp_path):
    other = subprocess.Popen(
        [sys.executable, "-c", REGISTER, str(tmp_path / "static_kernel_outputs"), "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    try:
        assert other.stdout.readline().strip() == "registered"
        with pytest.raises(StaticKernelsError, match="LOCAL_WORLD_SIZE differs between processes sharing") as info:
            AirgraphBackend(static_config(tmp_path, local_world_size=2, local_rank=1))
        assert f"process {other.pid} has LOCAL_WORLD_SIZE=4, this one LOCAL_WORLD_SIZE=2" in str(info.value)
        AirgraphBackend(static_config(tmp_path, local_world_size=4, local_rank=1))  # the same value: fine
    finally:
        other.communicate("done\n", timeout=60)
    AirgraphBackend(static_config(tmp_path, local_world_size=2, local_rank=1))  # the other process has exited


def test_the_registry_forgets_exited_processes_of_this_host_and_keeps_other_hosts(tmp_path):
    outputs, here, dead = tmp_path / "static_kernel_outputs", socket.gethostname(), exited_pid()
    processes = {  # the exited one would disagree on LOCAL_WORLD_SIZE
        f"{here}:{dead}": {"pid": dead, "host": here, "local_world_size": 2, "time": 0.0},
        f"another-host:{dead}": {"pid": dead, "host": "another-host", "local_world_size": 4, "time": 0.0},
    }
    write_json_atomic(outputs / "node.json", {"processes": processes}, format=node.FORMAT, version=node.VERSION)
    register_process(outputs, local_world_size=4, local_rank=0, world_size=None)
    registry = read_json(outputs / "node.json", format=node.FORMAT, version=node.VERSION)["processes"]
    assert sorted(registry) == sorted([f"another-host:{dead}", f"{here}:{os.getpid()}"])
    with pytest.raises(StaticKernelsError, match=f"process {dead} has LOCAL_WORLD_SIZE=4, this one LOCAL_WORLD_SIZE=2"):
        register_process(outputs, local_world_size=2, local_rank=0, world_size=None)  # another host's still counts


HOLD = """
import sys
from airgraph.kernels.library import KernelLibrary
library = KernelLibrary(sys.argv[1])
print(library.claim(sys.argv[2]), flush=True)  # building it, as far as the others know
sys.stdin.readline()
library.install(sys.argv[3])
library.release(sys.argv[2])
print("installed", flush=True)
"""


@pytest.mark.slow
def test_a_kernel_another_process_builds_runs_dynamic_until_installed_then_static(built, tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    kernel = built.kernel("[2]")
    kid = f"{kernel['graph_key']}/{kernel['shape_id']}"
    library = tmp_path / "library"
    package = shutil.copy(built.package, tmp_path)
    builder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(library), kid, str(package)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    model, reference = Step(), Step()
    backend = AirgraphBackend(static_config(tmp_path, library_dir=str(library), local_world_size=2))
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    tokens, pos = inputs(2)
    try:
        assert builder.stdout.readline().strip() == "claimed"
        with torch.no_grad():  # the other process holds the claim: nothing is built here, dynamic kernels run
            assert_close(compiled(tokens, pos), reference(tokens, pos))
        (segment,) = backend.reports[0].segments
        assert (segment.chosen_by, segment.source["dynamic_keys"], segment.source["static_keys"]) == (
            "config",
            ["[2]"],
            [],
        )
        assert not list(backend.static_kernels.recorder.outputs.glob("static_kernel_*.zip"))
        builder.stdin.write("install\n")
        builder.stdin.flush()
        assert builder.stdout.readline().strip() == "installed"
    finally:
        builder.communicate(timeout=60)
    with torch.no_grad():  # the same key, the next call: the installed kernel runs
        assert_close(compiled(tokens, pos), reference(tokens, pos))
        assert_close(model.cache, reference.cache)
    assert (segment.chosen_by, segment.source["static_keys"], segment.source["dynamic_keys"]) == (
        "static_kernels",
        ["[2]"],
        [],
    )
