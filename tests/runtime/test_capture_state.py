"""The GPU state a capture touches, checked on the simulator (runtime/simulated_state.py models it) and, where a
GPU can show it, on CUDA (`cuda`): failed captures leave the device as it was, ops that synchronise with the
host are refused (and fail a recording that tries), cuBLAS workspaces and static buffers outlive their users."""

from __future__ import annotations

import logging

import pytest
import torch

import airgraph.lowering.capture_plan as capture_plan
from airgraph.runtime.device import UNCACHED_ALLOCATOR, CaptureError, _CudaRecording, record
from airgraph.runtime.simulated import SimulatedCuda
from airgraph.runtime.simulated_state import BREAK_POINTS, SimGraph, SimulatedCudaError
from tests.helpers import assert_close, compile_with, cuda_unusable, unsafe_double


def call(sim: SimulatedCuda | None, fn, *args):
    """``fn(*args)`` checked by the simulator (a call it follows), or on CUDA."""
    if sim is None:
        return fn(*args)
    with sim.call():
        return fn(*args)


def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand_like(x)


def assert_random_graph_captured(sim: SimulatedCuda | None, backend, device: str) -> None:
    """A random graph compiled by ``backend`` warms up (a random op outside any capture), records and replays,
    drawing what eager draws: the generator is out of capture mode and the pool takes captures. With the simulator,
    ``device="cuda"`` places the input on its device (the pool of the backend's CUDA graphs), "cpu" does not."""
    compiled = torch.compile(noisy, backend=backend)
    x = (
        torch.zeros(4, device=device)
        if sim is None
        else sim.to_device(torch.zeros(4))
        if device == "cuda"
        else torch.zeros(4)
    )
    torch.manual_seed(0)
    want = [noisy(x) for _ in range(3)]
    torch.manual_seed(0)
    got = [call(sim, compiled, x) for _ in range(3)]
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)
    report = backend.reports[-1]
    assert report.captured and report.uncaptured_reason is None, report.uncaptured_reason


# -- a capture that fails at any step leaves the device as it was --------------------------------------------


@pytest.mark.parametrize("point", BREAK_POINTS)
def test_a_capture_broken_at_any_step_leaves_the_device_as_it_was(point, captures):
    sim = SimulatedCuda()
    model = torch.nn.Linear(8, 8)
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(4, 8)
    with torch.no_grad():
        call(sim, compiled, x)  # recorded: the pool exists (with its keeper) and holds this graph
        pool = captures[0]._pool.handle(torch.device("cpu"))
        uses = sim.allocator.use_counts[pool]
        sim.break_capture_at = point
        doubled = torch.compile(lambda t: (t * 2).relu(), backend=backend)
        assert_close(call(sim, doubled, x), (x * 2).relu())  # warm-up, then a recording that fails at `point`
        assert point in backend.reports[1].uncaptured_reason
        assert not sim.generator.capturing and not sim.allocator.recording and not sim.capturing
        retired = captures[0]._pool.handle(torch.device("cpu")) is not pool  # spent once the allocators began
        assert retired == (point in ("begin: allocator", "recording", "end: stream"))
        assert sim.allocator.use_counts[pool] == uses - retired  # a retired pool's keeper is gone; its graph holds it
        assert_random_graph_captured(sim, backend, "cpu")  # into the same pool, or a fresh one if that one is spent
        assert_close(call(sim, compiled, x), model(x))  # the first graph still replays
    sim.check()


def test_a_pool_whose_capture_failed_after_the_allocators_began_is_spent():
    """The pinned host allocator still captures into the pool (no call ends it): the next capture into that pool
    fails as it does on a GPU, so the backend's graphs go on in a fresh pool."""
    sim = SimulatedCuda()
    pool = sim.pool_handle()
    graph = SimGraph(sim, pool)

    def synchronises(args: list) -> list:  # what an op that synchronises does inside a capture
        graph.invalidated = "an op synchronised"
        raise SimulatedCudaError("operation not permitted when stream is capturing")

    with sim.use(sim.new_stream()):
        keeper = SimGraph(sim, pool)  # a graph that holds a use of the pool, as MemoryPool's keeper does
        record(keeper, lambda args: [], [])
        with pytest.raises(CaptureError, match="operation not permitted") as failed:
            record(graph, synchronises, [])
        assert failed.value.pool_spent and pool in sim.host_allocator.recording and pool not in sim.allocator.recording
        with pytest.raises(CaptureError, match="already recording to mempool_id"):
            record(SimGraph(sim, pool), lambda args: [], [])
        record(SimGraph(sim, sim.pool_handle()), lambda args: [], [])


def test_a_capture_on_the_default_stream_is_refused_before_the_generator_is_flagged():
    """torch 2.11 flags the default generator before it refuses the default stream; a reset on that stream would
    be refused too. So the capture is never begun there: random ops and captures work after."""
    sim = SimulatedCuda()
    with pytest.raises(CaptureError, match="non-default stream") as refused:
        record(SimGraph(sim, sim.pool_handle()), lambda args: [], [])
    assert not refused.value.pool_spent
    assert not sim.generator.capturing and not sim.allocator.recording and not sim.host_allocator.recording
    sim.generator.draw(recording=False)  # "Offset increment outside graph capture" if the flag stayed
    backend = compile_with(noisy, runtime=sim, mode="reduce-overhead", kernel_backend="aten")[1]
    assert_random_graph_captured(sim, backend, "cpu")


def test_the_generator_reset_works_from_the_default_stream():
    """A capture_begin that PyTorch refuses after flagging the generator (the flag is set first in torch 2.11)."""
    sim = SimulatedCuda()
    graph = SimGraph(sim, sim.pool_handle())
    with pytest.raises(SimulatedCudaError, match="non-default stream"):
        graph.capture_begin()  # what record() no longer does
    assert sim.generator.capturing
    graph.reset_generator()
    assert not sim.generator.capturing


@pytest.mark.cuda
def test_a_capture_begin_that_fails_leaves_cuda_usable():
    """capture_begin refuses the default stream, after torch 2.11 has flagged the default generator as capturing:
    the clean-up takes it out of capture mode, so random ops and captures work after."""
    pool = torch.cuda.graph_pool_handle()
    with pytest.raises(RuntimeError, match="non-default stream"):
        record(_CudaRecording(torch.cuda.current_device(), pool), lambda args: [], [])
    torch.rand(4, device="cuda")  # "Offset increment outside graph capture" if the flag stayed
    backend = compile_with(noisy, mode="reduce-overhead", kernel_backend="aten")[1]
    assert_random_graph_captured(None, backend, "cuda")


@pytest.mark.cuda
def test_the_check_after_each_cuda_test_finds_a_flagged_generator_and_resets_it():
    """tests/conftest.py fails a `cuda` test that leaves CUDA unusable; torch's own capture_begin on the default
    stream leaves torch 2.11's generator flagged (later versions flag nothing there)."""
    with pytest.raises(RuntimeError, match="non-default stream"):
        torch.cuda.CUDAGraph().capture_begin()
    try:
        torch.rand(1, device="cuda")
        flagged = False
    except RuntimeError as exc:
        assert "Offset increment outside graph capture" in str(exc)
        flagged = True
    reason = cuda_unusable()
    assert (reason is not None and "Offset increment" in reason) == flagged, reason
    assert cuda_unusable() is None  # the check reset the generator
    torch.rand(1, device="cuda")


# -- ops that synchronise with the host --------------------------------------------------------------------


def _masked_zero(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    # index_put with a boolean mask: nonzero on CUDA. (Written as index_put_ with a tensor: torch 2.15 traces
    # ``y[x > 0] = 0`` as masked_fill, which does not synchronise.)
    y.index_put_((x > 0,), torch.zeros(1, device=x.device))
    return y * 2


SYNCS = {  # name -> (function, what the refusal names)
    "nonzero": (lambda x: torch.nonzero(x > 0).sum() * x, "aten.nonzero"),
    "boolean index": (lambda x: x[x > 0].sum() * x, "aten.index.Tensor"),
    "boolean index_put": (_masked_zero, "boolean mask"),
    "masked_select": (lambda x: torch.masked_select(x, x > 0).sum() * x, "aten.masked_select"),
    "item": (lambda x: x * (x > 0).sum().item(), "_local_scalar_dense"),
    "cudagraph_unsafe op": (lambda x: unsafe_double(x) + 1, "cudagraph_unsafe"),
    "device-to-host copy": (lambda x: x * x.sum().cpu(), "copies a device value to the host"),
}


def sync_run(name: str, *, refused: bool, monkeypatch) -> tuple:
    """SYNCS[name] compiled for the simulated device (x placed on it) and called three times; the report."""
    fn, _ = SYNCS[name]
    if not refused:  # a refusal missed: the recording itself must fail
        monkeypatch.setattr(capture_plan, "find_uncapturable", lambda gm, **_: None)
    sim = SimulatedCuda()
    compiled, backend = compile_with(fn, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    for _ in range(3):
        x = sim.to_device(torch.randn(8))
        assert_close(call(sim, compiled, x), fn(x))
    sim.check()
    assert not sim.generator.capturing and not sim.allocator.recording and not sim.capturing
    return sim, backend


@pytest.mark.parametrize("name", SYNCS)
def test_ops_that_synchronise_are_refused_naming_the_op(name, data_dependent_ops, monkeypatch):
    _, backend = sync_run(name, refused=True, monkeypatch=monkeypatch)
    (report,) = backend.reports
    assert report.device == "cuda:0" and not report.captured
    assert SYNCS[name][1] in report.uncaptured_reason and "capture failed" not in report.uncaptured_reason


@pytest.mark.parametrize("name", SYNCS)
def test_a_recording_fails_on_ops_that_synchronise_and_the_key_runs_uncaptured(name, data_dependent_ops, monkeypatch):
    sim, backend = sync_run(name, refused=False, monkeypatch=monkeypatch)
    (report,) = backend.reports
    assert not report.captured
    assert report.uncaptured_reason.startswith("CUDA graph capture failed: SimulatedCudaError: operation not permitted")
    assert_random_graph_captured(
        sim, backend, "cuda"
    )  # the same backend and device: the failed recording spent its pool


@pytest.mark.cuda
def test_a_recording_that_fails_on_a_sync_leaves_cuda_usable(data_dependent_ops, monkeypatch):
    monkeypatch.setattr(capture_plan, "find_uncapturable", lambda gm, **_: None)
    fn = SYNCS["item"][0]
    compiled, backend = compile_with(fn, mode="reduce-overhead", kernel_backend="aten")
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        assert_close(compiled(x), fn(x))
    assert "capture failed" in backend.reports[0].uncaptured_reason
    assert_random_graph_captured(None, backend, "cuda")


# -- cuBLAS workspaces -------------------------------------------------------------------------------------


def test_a_replay_never_writes_a_cublas_workspace_freed_to_the_allocator():
    """CUDAGraph Trees clear every cuBLAS workspace around their own warm-ups and recordings (any
    torch.compile(mode="reduce-overhead") in the process): a graph that kept a workspace of the ordinary
    allocator would write memory that may belong to a user's tensor by then."""
    sim = SimulatedCuda()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    with torch.no_grad():
        for step in range(4):
            if step == 2:
                sim.clear_blas_workspaces()  # what CUDAGraph Trees do in the same process
            x = torch.randn(4, 8)
            assert_close(call(sim, compiled, x), model(x))
    assert backend.reports[0].captured
    sim.check()


def test_dropping_one_graph_frees_no_workspace_another_graph_replays():
    """In torch 2.13 (not 2.11), destroying a graph frees the cuBLAS workspaces of its capture stream, which every graph
    of the pool shares: the other graph's replay must not depend on them."""
    sim = SimulatedCuda(reset_clears_stream_workspaces=True)
    first = torch.nn.Linear(8, 8)
    second = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())  # other code: its own graph
    backend = compile_with(first, runtime=sim, mode="reduce-overhead", kernel_backend="aten")[1]
    one, two = torch.compile(first, backend=backend), torch.compile(second, backend=backend)
    with torch.no_grad():
        for step in range(4):
            if step == 2:
                first.weight.data = torch.randn(8, 8)  # `one` records again: its old graph is destroyed
            x = torch.randn(4, 8)
            assert_close(call(sim, one, x), first(x))
            assert_close(call(sim, two, x), second(x))
    assert [r.captured for r in backend.reports] == [True, True] and backend.reports[0].recaptures == 1
    sim.check()


# -- memory outlives its last user ------------------------------------------------------------------------


def test_a_key_that_gives_up_frees_its_buffers_after_the_last_replay(caplog):
    """Each recording's buffers are allocated on the caller's stream of that call and read by the next replay,
    on another stream; when the parameters move once more the key gives up and frees them, which the caching
    allocator may hand to that stream's next allocation at once: the free must wait for the replay's stream."""
    sim = SimulatedCuda()
    model = torch.nn.Linear(4, 4)
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    recorder, replayer = sim.new_stream(name="recording caller"), sim.new_stream(name="replaying caller")
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for step in range(10):
            if step % 2 == 0 and step:
                model.weight.data = torch.randn(4, 4)  # moved: recorded again, and the 4th time given up
            with sim.use(replayer if step % 2 else recorder):  # nothing orders the two callers' streams
                x = torch.randn(2, 4)
                assert_close(call(sim, compiled, x), model(x))
    (report,) = backend.reports
    assert report.recaptures == 3 and "update them in place" in report.uncaptured_reason
    sim.check()


# -- what PyTorch refuses too ------------------------------------------------------------------------------


def test_no_caching_allocator_no_capture_with_one_warning(caplog):
    sim = SimulatedCuda(caching_allocator=False)  # PYTORCH_NO_CUDA_MEMORY_CACHING=1
    model = torch.nn.Linear(8, 8)
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8)
            assert_close(call(sim, compiled, x), model(x))
    (report,) = backend.reports
    assert not report.captured and report.uncaptured_reason == UNCACHED_ALLOCATOR
    assert sum("caching allocator is disabled" in r.getMessage() for r in caplog.records) == 1


def test_cuda_runtime_asks_torch_or_the_environment_for_the_caching_allocator(monkeypatch):
    from airgraph.runtime.device import CUDA

    device = torch.device("cuda", 0)
    monkeypatch.delenv("PYTORCH_NO_CUDA_MEMORY_CACHING", raising=False)
    monkeypatch.setattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled", lambda: True, raising=False)
    assert CUDA.capture_refusal(device) is None
    monkeypatch.setattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled", lambda: False)  # torch 2.13's switch
    assert CUDA.capture_refusal(device) == UNCACHED_ALLOCATOR
    monkeypatch.delattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled")  # torch 2.11: the environment only
    assert CUDA.capture_refusal(device) is None
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    assert CUDA.capture_refusal(device) == UNCACHED_ALLOCATOR
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0")
    assert CUDA.capture_refusal(device) is None


# -- the same on a GPU (`cuda`) --------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", [n for n in SYNCS if n != "device-to-host copy"])
def test_ops_that_synchronise_are_refused_on_cuda(name, data_dependent_ops):
    fn, says = SYNCS[name]
    compiled, backend = compile_with(fn, mode="reduce-overhead", kernel_backend="aten")
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        assert_close(compiled(x), fn(x))
    (report,) = backend.reports
    assert not report.captured and says in report.uncaptured_reason


@pytest.mark.cuda
def test_a_replay_after_cublas_workspaces_are_freed_writes_nothing_else():
    """CUDAGraph Trees' clear, then memory churn: what the replays write stays in their pool."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)).cuda()
    compiled, backend = compile_with(model, mode="reduce-overhead", kernel_backend="aten")
    with torch.no_grad():
        for step in range(6):
            if step >= 2:
                torch._C._cuda_clearCublasWorkspaces()
                canaries = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(8)]  # may reuse freed memory
            x = torch.randn(64, 256, device="cuda")
            assert_close(compiled(x), model(x))
            if step >= 2:
                torch.cuda.synchronize()
                assert all(bool((c == 7.0).all()) for c in canaries)
    assert backend.reports[0].captured


@pytest.mark.cuda
def test_no_caching_allocator_no_capture_on_cuda(monkeypatch):
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # read when the graph is compiled
    model = torch.nn.Linear(8, 8).cuda()
    compiled, backend = compile_with(model, mode="reduce-overhead", kernel_backend="aten")
    with torch.no_grad():
        x = torch.randn(2, 8, device="cuda")
        assert_close(compiled(x), model(x))
    assert backend.reports[0].uncaptured_reason == UNCACHED_ALLOCATOR
