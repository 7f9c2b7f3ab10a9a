"""The compile cache (airgraph/cache): a second process starts from what the first compiled, safely (issue #35).

Processes are real where the issue says "a process": tests/cache/worker.py compiles a small mixer and reports what
it traced and lowered. Each test has a compile cache of its own (tests/conftest.py sets ``AIRGRAPH_CACHE_DIR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.cache.folder import CacheFolder
from airgraph.runtime.simulated import SimulatedCuda
from tests.cache.common import cache_dir, compiled_mixer, entries, run_once
from tests.helpers import assert_close, make_config

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"


def worker(*args: str, env: dict[str, str] | None = None) -> dict:
    """tests/cache/worker.py in a fresh process, with this test's compile cache; its JSON line."""
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- a fresh process ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel_backend", ["aten", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_fresh_process_warm_starts_tracing_and_lowering_nothing(kernel_backend, tmp_path):
    inductor = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cold = worker("--backend", kernel_backend, env=inductor)
    assert cold["reports"] == ["stored"] and cold["aot_traces"] == 1 and len(entries()) == 1
    warm = worker("--backend", kernel_backend, env=inductor)
    assert warm["reports"] == ["hit"] and warm["counts"] == {"hit": 1}
    assert warm["aot_traces"] == 0  # AOTAutograd traced nothing
    assert warm["lowerings"] == 0  # Inductor lowered no graph (its kernels came from its FX graph cache)
    if kernel_backend == "inductor":
        assert cold["lowerings"] >= 1 and warm["fx_hits"] >= 1
    assert warm["max_abs_diff"] <= 1e-5 and warm["sum"] == pytest.approx(cold["sum"], rel=1e-5)


@pytest.mark.cuda
def test_a_fresh_process_on_cuda_warm_starts_and_captures(tmp_path):
    """On a GPU, reduce-overhead: the warm process traces and lowers nothing and records its CUDA graph at load."""
    args = ("--device", "cuda", "--mode", "reduce-overhead", "--backend", "inductor")
    inductor = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cold = worker(*args, env=inductor)
    warm = worker(*args, env=inductor)
    assert cold["reports"] == ["stored"] and warm["reports"] == ["hit"] and warm["captured"] == [True]
    assert (warm["aot_traces"], warm["lowerings"]) == (0, 0) and warm["max_abs_diff"] <= 1e-4


def test_other_weights_hit_the_entry_and_give_their_own_outputs():
    first = worker("--seed", "0")
    other = worker("--seed", "1")  # the same architecture, other weights: inputs, not constants
    assert first["reports"] == ["stored"] and other["reports"] == ["hit"]
    assert other["max_abs_diff"] <= 1e-5  # the new model's outputs (compared with its own eager run)
    assert other["sum"] != pytest.approx(first["sum"], rel=1e-3)
    assert len(entries()) == 1


def test_another_architecture_misses():
    worker("--blocks", "2")
    deeper = worker("--blocks", "3")
    assert deeper["reports"] == ["stored"] and deeper["aot_traces"] == 1 and deeper["max_abs_diff"] <= 1e-5
    other_op = worker("--activation", "relu")  # the same inputs (weights, shapes), another computation
    assert other_op["reports"] == ["stored"] and other_op["aot_traces"] == 1 and other_op["max_abs_diff"] <= 1e-5
    assert len(entries()) == 3


def test_two_processes_writing_one_entry_leave_one_whole_entry(tmp_path):
    barrier = str(tmp_path / "barrier")
    command = [sys.executable, str(WORKER), "--barrier", barrier]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in "ab"]
    results = []
    for process in both:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["reports"] for r in results] == [["stored"], ["stored"]]  # both wrote, at once (the barrier)
    (entry,) = entries()
    folder = CacheFolder(cache_dir())
    assert folder.check(entry.stem) is None
    assert not [p for p in entry.parent.iterdir() if p.name.endswith(".tmp")]
    assert worker()["reports"] == ["hit"]


# -- what misses, what is checked --------------------------------------------------------------------------------


def test_a_changed_config_torch_or_airgraph_misses(monkeypatch):
    assert run_once().reports[0].compile_cache == "stored"
    assert run_once().reports[0].compile_cache == "hit"
    assert run_once(mode="reduce-overhead").reports[0].compile_cache == "stored"
    assert run_once(**{"passes.remove_noops": False}).reports[0].compile_cache == "stored"
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "2.99.0")
        assert run_once().reports[0].compile_cache == "stored"
    with monkeypatch.context() as patch:
        patch.setattr(airgraph, "__version__", "9.9.9")
        assert run_once().reports[0].compile_cache == "stored"
    with monkeypatch.context() as patch:
        from torch._inductor import config as inductor_config

        patch.setattr(inductor_config, "max_autotune", True)
        assert run_once().reports[0].compile_cache == "stored"
    assert len(entries()) == 6
    assert run_once().reports[0].compile_cache == "hit"


def test_global_state_is_part_of_the_key():
    """What Dynamo's global-state guard checks changes the traced graph without changing Dynamo's graph (a tensor
    made in the default dtype): it is in the key."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(x.shape[-1])

    for dtype in (torch.float32, torch.float64, torch.float32):
        torch._dynamo.reset()
        backend = AirgraphBackend(make_config(kernel_backend="aten"))
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.no_grad():
                out = torch.compile(fn, backend=backend)(torch.randn(3, 4, dtype=torch.float32))
        finally:
            torch.set_default_dtype(previous)
        assert out.dtype == torch.promote_types(torch.float32, dtype)
    assert [r.compile_cache for r in backend.reports] == ["hit"] and len(entries()) == 2


def test_guards_are_still_checked():
    """A graph from the cache keeps Dynamo's guards: other shapes or dtypes go through Dynamo, which traces again."""
    run_once(batch=2)
    torch._dynamo.reset()
    model, compiled, backend = compiled_mixer()
    with torch.no_grad():
        for batch in (2, 3, 2):
            x = model.example_input(batch)
            assert_close(compiled(x), model(x))
    assert backend.dynamo_graphs == 2  # batch 3 failed the guards and was traced again
    assert backend.reports[0].compile_cache == "hit" and backend.reports[1].compile_cache != "hit"

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2

    for _ in range(2):
        torch._dynamo.reset()
        backend = AirgraphBackend(make_config(kernel_backend="aten"))
        compiled = torch.compile(fn, backend=backend)
        with torch.no_grad():
            for dtype in (torch.float32, torch.float64):
                x = torch.randn(5, dtype=dtype)
                assert_close(compiled(x), fn(x))
    assert backend.dynamo_graphs == 2 and [r.compile_cache for r in backend.reports] == ["hit", "hit"]


def test_training_graphs_and_dynamic_shapes_compile_as_before():
    torch._dynamo.reset()
    model, compiled, backend = compiled_mixer()
    x = model.example_input(2)
    assert_close(compiled(x), model(x))  # autograd on: a forward and a backward graph
    assert [r.compile_cache for r in backend.reports] == [None] and backend.compile_cache.counts["training"] == 1
    torch._dynamo.reset()
    model, _, backend = compiled_mixer()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    assert backend.compile_cache.counts["dynamic"] >= 1 and not entries()
    assert [r.compile_cache for r in backend.reports] == [None]  # not even looked up


def test_reduce_overhead_from_the_cache_is_captured_on_the_simulator(monkeypatch):
    """A hit compiles on as any graph does: here captured (the simulated CUDA runtime), its parameters static inputs
    as AOTAutograd said when the entry was written (lowering/aot.py replaying), so not copied before each replay."""
    from airgraph.runtime.capture import GraphCapture

    static: list[list[int]] = []
    init = GraphCapture.__init__

    def recorded(self, run, **kwargs):
        static.append(list(kwargs["static_indices"]))
        init(self, run, **kwargs)

    monkeypatch.setattr(GraphCapture, "__init__", recorded)
    for expected in ("stored", "hit"):
        torch._dynamo.reset()
        model, compiled, backend = compiled_mixer(runtime=SimulatedCuda(), mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 8, 16)
                assert_close(compiled(x), model(x))
        (report,) = backend.reports
        assert report.compile_cache == expected and report.captured and report.capture_keys == 1
    assert static[0] == static[1] and len(static[0]) == len(list(model.parameters()))


# -- damaged entries ---------------------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage_payload(path: Path) -> None:
    import hashlib

    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    payload = b"not a pickle"
    header.update(payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)


def _other_version(path: Path) -> None:
    head, payload = path.read_bytes().split(b"\n", 1)
    header = json.loads(head)
    header["version"] = 99
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize(
    "damage, why",
    [
        (_truncate, "payload bytes"),
        (_flip, "does not match its sha256"),
        (_garbage_payload, "its graph does not load"),
        (_other_version, "version 99"),
    ],
)
def test_a_damaged_entry_is_refused_with_one_warning_and_rebuilt(damage, why):
    run_once()
    (entry,) = entries()
    damage(entry)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rebuilt = run_once()
        again = run_once()  # the same process: warned once only (and the entry is whole again anyway)
    refused = [w for w in caught if "compile cache entry" in str(w.message)]
    assert len(refused) == 1, [str(w.message) for w in caught]
    assert str(entry) in str(refused[0].message) and why in str(refused[0].message)
    assert "compiled again and the entry rewritten" in str(refused[0].message)
    assert rebuilt.reports[0].compile_cache == "stored" and again.reports[0].compile_cache == "hit"
    assert CacheFolder(cache_dir()).check(entry.stem) is None


# -- switching it off, moving it ---------------------------------------------------------------------------------


def test_the_cache_can_be_switched_off_or_moved(tmp_path, monkeypatch):
    assert run_once(compile_cache=False).compile_cache is None
    assert not entries()
    moved = tmp_path / "elsewhere"
    backend = run_once(compile_cache=str(moved))
    assert backend.compile_cache.root == moved and len(list((moved / "entries").glob("*.entry"))) == 1
    monkeypatch.setenv("AIRGRAPH_CACHE_DIR", str(tmp_path / "from-env"))
    assert airgraph.CompilerConfig().resolved_cache_dir() == str(tmp_path / "from-env")
    run_once()
    assert len(list((tmp_path / "from-env" / "entries").glob("*.entry"))) == 1
    with pytest.raises(ValueError, match="compile_cache: invalid value 3"):
        airgraph.CompilerConfig().compile_cache = 3
    with pytest.raises(ValueError, match="an empty path"):
        airgraph.CompilerConfig().compile_cache = " "


def test_the_default_cache_is_in_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRGRAPH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert airgraph.CompilerConfig().resolved_cache_dir() == str(tmp_path / "airgraph" / "compile-cache")


@pytest.mark.parametrize("kernel_backend", ["aten", pytest.param("inductor", marks=pytest.mark.slow)])
def test_frozen_parameters_stay_out_of_the_entry(kernel_backend, tmp_path):
    """With config.frozen_parameters, weights become constants while the graph compiles (lowering/freeze.py), after
    its entry was taken: an entry holds no weights, and a model with other weights hits it and is frozen with its
    own (the issue asked for the weights in the key; with them left out of the entry one entry serves them all)."""
    env = {"AIRGRAPH_FROZEN_PARAMETERS": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    first = worker("--seed", "0", "--backend", kernel_backend, env=env)
    other = worker("--seed", "1", "--backend", kernel_backend, env=env)  # Inductor compiles its own constants
    assert first["reports"] == ["stored"] and other["reports"] == ["hit"]
    assert first["frozen"] and first["frozen"] == other["frozen"]  # the weights were constants in both
    assert other["max_abs_diff"] <= 1e-5 and other["sum"] != pytest.approx(first["sum"], rel=1e-3)


def test_a_hit_with_frozen_parameters_keeps_their_identity_guards():
    """A graph compiled from its entry freezes this call's parameters and guards their identity in Dynamo's
    guards (lowering/freeze.py): a parameter replaced afterwards recompiles instead of running the old weights."""
    run_once(frozen_parameters=True)
    torch._dynamo.reset()
    model, compiled, backend = compiled_mixer(frozen_parameters=True)
    x = model.example_input(2)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        model.head.weight = torch.nn.Parameter(torch.randn_like(model.head.weight))
        assert_close(compiled(x), model(x))
    assert [r.compile_cache for r in backend.reports][:1] == ["hit"] and backend.dynamo_graphs == 2
    assert all(r.frozen_parameters for r in backend.reports)
