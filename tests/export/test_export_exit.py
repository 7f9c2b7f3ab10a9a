"""Issue #14: the seed's multi-card example exits cleanly, every time (leftovers.py, multirank.py).

It used to die at exit now and then (SIGABRT after ``terminate called without an active exception``: a gloo
worker thread dropping the tensors of the export's ``all_gather_object`` while the interpreter finalized,
with the process group kept alive past ``destroy_process_group`` by the export). That race shows only under
load or a debugger, so besides the exit codes each run asserts the conditions that rule it out, which hold
or fail every time: the export runs no collective of its own (the model's ``all_reduce`` in the eager
reference run is the only one), and once the seed's ``destroy_process_group`` returned no gloo or store
thread is left, nor tqdm's monitor thread.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from airgraph.export.leftovers import dynamo_capture_scope, no_leftovers
from tests.export import seed_multicard
from tests.export.export_models import SeedModel
from tests.helpers import free_port

RUNS = 20
WORLD = 2
SEED_FILES = {"mp_rank0.onnx", "mp_rank1.onnx", "model_relation_config.json", "numa_config.json", "rank_0", "rank_1"}
# x + y + p1 + p2 (int32 ones, float parameters), summed over the two ranks
EXPECTED = 2 * (2 + np.array([[1.1, 1.1], [1.1, 1.1]]) + np.array([[2.2, 2.2], [3.3, 3.3]]))


def _spawn_seed(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """One run of the seed's ``mp()``: two spawned ranks in ``workdir``; None if both exited 0, else why not."""
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        torch.multiprocessing.spawn(seed_multicard.run_rank, args=(WORLD,), nprocs=WORLD, join=True)
    except torch.multiprocessing.ProcessExitedException as exc:  # a signal or a non-zero exit code
        return str(exc)
    except torch.multiprocessing.ProcessRaisedException as exc:
        return str(exc).strip().splitlines()[-1]
    return None


def _check_run(workdir: Path) -> None:
    root = workdir / "mp"
    assert {p.name for p in root.iterdir()} == SEED_FILES
    relation = json.loads((root / "model_relation_config.json").read_text())
    assert [d["submodel_name"] for d in relation["deploy_config"]] == ["mp_rank0.onnx", "mp_rank1.onnx"]
    for rank in range(WORLD):
        meta = json.loads((root / f"rank_{rank}" / "export.json").read_text())
        assert meta["rank"] == rank and meta["distributed"]["groups"] == {"0": [0, 1]}
        model = onnx.load(str(root / f"mp_rank{rank}.onnx"))
        onnx.checker.check_model(model)
        assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == ["AllReduce"]
        with np.load(root / f"rank_{rank}" / "reference_outputs.npz") as ref:
            np.testing.assert_allclose(ref["output"], EXPECTED, rtol=1e-6)
        report = json.loads((workdir / f"report_rank{rank}.json").read_text())
        assert report["collectives_in_export"] == 1, report  # the eager run's all_reduce, nothing of the export's
        if report["os_threads"] is not None:
            assert not set(report["os_threads"]) & set(seed_multicard.GLOO_THREADS), report
        assert report["python_threads"] == ["MainThread"], report


@pytest.mark.slow
def test_seed_multicard_example_exits_cleanly_20_times(tmp_path, monkeypatch):
    failures, start = {}, time.perf_counter()
    for run in range(RUNS):
        workdir = tmp_path / f"run{run}"
        workdir.mkdir()
        failure = _spawn_seed(workdir, monkeypatch)
        if failure is not None:
            failures[run] = failure
            continue
        _check_run(workdir)
    assert not failures, f"{len(failures)} of {RUNS} runs failed: {failures}"
    print(f"{RUNS} two-rank runs in {time.perf_counter() - start:.1f} s")


@pytest.mark.slow
def test_export_leaves_no_dynamo_globals_or_monitor_thread(tmp_path):
    """The captured program is not kept in Dynamo's globals, and tqdm's monitor does not outlive the export."""
    import threading

    import airgraph

    scope = dynamo_capture_scope()
    assert scope is not None  # torch 2.11 to 2.13 trace torch._dynamo.functional_export's ModuleToTrace
    before = set(scope)
    monitors = {t for t in threading.enumerate() if t.name == "tqdm_monitor"}  # another test's, if any
    model = SeedModel()
    airgraph.dynamo_export(torch.randn(2, 2), torch.randn(2, 2), model=model, export_path=tmp_path / "a")
    assert set(scope) == before
    assert {t for t in threading.enumerate() if t.name == "tqdm_monitor"} == monitors

    with no_leftovers():  # and what it removes is what Dynamo added
        torch.export.export(model, (torch.randn(2, 2), torch.randn(2, 2)), strict=True)
        added = set(scope) - before
        assert any(name.startswith("__compiled_fn") for name in added), added
    assert set(scope) == before


_TORCH_IN = """
import os, sys
when = sys.argv[1]
if when == "before import":
    os.rmdir(os.getcwd())
import torch
if when == "after import":
    os.rmdir(os.getcwd())
a = torch.randn(64, 64)
torch.linalg.inv(a @ a.T + 64 * torch.eye(64))  # MKL's first LAPACK call, then the interpreter's exit
"""
MKL_CANNOT_LOAD = "Intel oneMKL FATAL ERROR: Cannot load"
MKL_SETTINGS = {"MKL_VERBOSE": "1", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "COMPATIBLE", "MKL_NUM_THREADS": "1"}
_linux_mkl = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and torch.backends.mkl.is_available()), reason="torch with MKL on Linux"
)


@_linux_mkl
@pytest.mark.parametrize("when", ["never", "after import", "before import", "before import, MKL settings"])
def test_mkl_fatal_error_is_a_torch_import_in_a_removed_folder(tmp_path, when):
    """Issues #20 and #38: "Intel oneMKL FATAL ERROR: Cannot load .../torch/lib/libtorch_cpu.so" (exit 2) is printed
    by ``_Init_MKL_Loader``, a constructor of the MKL linked into libtorch_cpu.so (torch 2.13.0+cpu, and
    2.14.1+cu130 the same), when the library is loaded, that is at ``import torch``: it calls ``dladdr`` on itself,
    then ``getcwd`` into a 4096-byte buffer, and when getcwd fails it prints that line with the library's path and
    exits 2. It reads no setting first (no MKL_* variable saves it), and in this build it is the only code that
    prints this line for libtorch_cpu.so (MKL's only other ``dlopen`` is of libmemkind). So a process dies so only
    when its working folder is gone (or its path is 4096 bytes or longer) at its ``import torch``; a process whose
    folder goes after the import makes its first MKL calls and exits cleanly. A seed run that dies so had a process
    start in a folder removed under it: a rank spawned by torch.multiprocessing imports torch after its ``chdir``
    into the parent's working folder, so that folder removed then kills the rank. scripts/stress_export_exit.py
    records every process of a run whose working folder goes."""
    folder = tmp_path / "run"
    folder.mkdir()
    env = {**os.environ, **(MKL_SETTINGS if "MKL settings" in when else {})}
    done = subprocess.run(
        [sys.executable, "-c", _TORCH_IN, when.split(",")[0]],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    if when.startswith("before import"):
        assert done.returncode == 2, done.stderr
        assert MKL_CANNOT_LOAD in done.stderr and "libtorch_cpu.so" in done.stderr
    else:
        assert (done.returncode, done.stderr) == (0, "")


_LONG_CWD = """
import os, subprocess, sys
for _ in range(18):  # 18 * 256 bytes: a path longer than MKL's 4096-byte buffer, entered step by step
    os.mkdir("d" * 255)
    os.chdir("d" * 255)
sys.exit(subprocess.run([sys.executable, "-c", "import torch"]).returncode)
"""


@_linux_mkl
def test_mkl_fatal_error_on_a_working_folder_path_of_4096_bytes_or_more(tmp_path):
    """The other way getcwd fails: a working folder that exists, with a path longer than MKL's buffer."""
    done = subprocess.run([sys.executable, "-c", _LONG_CWD], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert MKL_CANNOT_LOAD in done.stderr and "libtorch_cpu.so" in done.stderr


_FIRST_USE = """
import os, shutil, sys
shadow = sys.argv[1]
sys.path.insert(0, shadow)
import torch
assert torch.__file__.startswith(shadow), torch.__file__
lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
open(lib + ".new", "wb").close()
os.replace(lib + ".new", lib)  # another file in the library's place, as an installer puts it
shutil.rmtree(shadow)  # then the whole package gone
a = torch.randn(96, 96, dtype=torch.float64)
torch.linalg.inv(a @ a.T + 96 * torch.eye(96, dtype=torch.float64))  # MKL's first BLAS and LAPACK calls
torch.linalg.eigh(a + a.T)
torch.fft.rfft(torch.randn(4096))  # its first DFT
print("ok")
"""


@_linux_mkl
def test_mkl_first_use_does_not_load_libtorch_cpu_again(tmp_path):
    """What a concurrent reinstall of torch would break if MKL loaded its kernels from libtorch_cpu.so by path
    on first use: it does not. torch imported from a copy of its package (hard links: nothing copied, nothing
    of the real one written), the copy's libtorch_cpu.so replaced by an empty file and the copy removed, and
    MKL's first BLAS, LAPACK and DFT calls run cleanly."""
    source = Path(torch.__file__).parent
    shadow = tmp_path / "shadow"
    try:
        shutil.copytree(source, shadow / "torch", copy_function=os.link)
    except OSError as exc:  # another file system than the temporary folder's
        pytest.skip(f"cannot hard-link torch's package into {tmp_path}: {exc}")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_USE, str(shadow)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
    assert "oneMKL" not in done.stderr
    assert (source / "lib" / "libtorch_cpu.so").stat().st_size > 0  # the real one untouched
