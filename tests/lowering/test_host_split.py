"""reduce-overhead with host work, run end to end on the simulator: tensors placed on its device are traced as CUDA
tensors (runtime/simulated_device.py), so host placement moves work to the host, the capture plan splits it off
and GraphCapture runs it around the replays (static work once per key, per-call work and its copies to the device
before every replay), with CPU tensors standing for CUDA ones. Results are compared with eager, accesses are
race-checked; test_host_capture.py runs the same on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.graph.fake_guard import fake_cuda_guard
from airgraph.lowering.capture_plan import NOTHING_TO_CAPTURE, find_uncapturable, plan_host_work
from airgraph.models import build_tiny_llama, decode_inputs
from airgraph.passes import run_pipeline
from airgraph.runtime.capture import CaptureState
from airgraph.runtime.host import HostSplit
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import assert_close, compile_with
from tests.passes.test_host_placement import context, fragment, scaled_fragment


def run(sim: SimulatedCuda, compiled, *args):
    with sim.call():
        return compiled(*args)


def gather_rows(x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ramp = torch.arange(4, device=x.device) + 1  # static: no input data
    index = (lengths + ramp.cpu()).clamp(max=3)  # per call: a CPU input's data
    return x[index.to(x.device)] * ramp.sum(), index


def test_host_work_is_classified_static_or_per_call():
    with fake_cuda_guard():
        with FakeTensorMode(allow_non_fake_inputs=True):
            gm = make_fx(gather_rows)(torch.empty(4, 3, device="cuda"), torch.zeros(4, dtype=torch.long))
        run_pipeline(gm, context())
    assert find_uncapturable(gm) is None
    plan = plan_host_work(gm)
    assert plan.problem is None
    assert [n.name for n in plan.per_call] == ["add_1", "clamp"]
    assert {"arange", "add", "sum_1"} <= {n.name for n in plan.static}
    assert len(plan.transfers) == 2 and not plan.feeds


@pytest.fixture
def scalar_outputs():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        yield


def test_seed_fragment_runs_its_host_work_once_per_key_around_the_replays(scalar_outputs, captures):
    """Seed 003's Shape -> Gather -> Concat -> Reshape: on the host, once per shape key; the reshape and the
    scaling replayed."""
    sim = SimulatedCuda()
    compiled, backend = compile_with(scaled_fragment, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    for shape in [(4, 6)] * 3 + [(3, 8)] * 3:
        x = sim.to_device(torch.randn(shape))
        assert_close(run(sim, compiled, x), scaled_fragment(x))
    sim.check()
    assert len(backend.reports) == 2  # one graph per shape (static shapes)
    for report, capture in zip(backend.reports, captures, strict=True):
        assert report.device == "cuda:0" and report.captured and report.uncaptured_reason is None
        assert report.host_placement["syncs_removed"] >= 2
        assert {"gather", "cat", "_local_scalar_dense"} <= set(report.host_prologue["static"])
        assert not report.host_prologue["per_call"]
        assert [s.placement for s in report.segments] == ["host", "device"]
        (entry,) = capture.keys.values()
        assert entry.state is CaptureState.CAPTURED and entry.replays == 2


def test_a_graph_left_without_device_work_is_not_captured(scalar_outputs, captures, monkeypatch, recwarn):
    """Placed, the fragment alone leaves the device a reshape of its input (a view): no kernel. Captured, its CUDA
    graph would be empty (the H100 warned "The CUDA Graph is empty" four times in test_host_capture.py) and each
    replay would still copy the input into its buffer first. It runs uncaptured, with the reason, and no warning."""
    recordings, real = [], SimulatedCuda.capture

    def recorded(self, fn, args, **kwargs):
        recordings.append(fn)
        return real(self, fn, args, **kwargs)

    monkeypatch.setattr(SimulatedCuda, "capture", recorded)
    sim = SimulatedCuda()
    compiled, backend = compile_with(fragment, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    for shape in [(4, 6)] * 3 + [(3, 8)] * 2:
        x = sim.to_device(torch.randn(shape))
        out = run(sim, compiled, x)
        assert_close(out, fragment(x))
        assert out.data_ptr() == x.data_ptr()  # the view eager returns: no copy either
    assert len(backend.reports) == 2 and not captures and not recordings
    for report in backend.reports:
        assert not report.captured and report.uncaptured_reason == NOTHING_TO_CAPTURE
        assert report.host_placement["syncs_removed"] >= 2
    assert not [str(w.message) for w in recwarn if "airgraph" in str(w.message)]


@pytest.mark.parametrize("input_copies", ["launch", "in-graph"])
def test_dynamic_tiny_llama_decode_is_captured_with_per_call_transfers(captures, input_copies):
    """Dynamic positions: Dynamo passes the model's float constants as CPU scalars, which host placement sends to
    the device; in reduce-overhead they are per-call host values copied into the graph's buffers before each
    replay, and the positions (a device input) are copied into their static buffer (or, with in-graph input
    copies, by the graph itself: the host values' transfers stay as they are)."""
    sim = SimulatedCuda()
    model = sim.to_device(build_tiny_llama("micro", seed=0))
    reference = build_tiny_llama("micro", seed=0)
    options = {"reduce_overhead.input_copies": input_copies}
    compiled, backend = compile_with(
        model, runtime=sim, mode="reduce-overhead", kernel_backend="aten", dynamic=True, **options
    )
    with torch.no_grad():
        for step in range(6):
            tokens, pos = sim.to_device(*decode_inputs(model.config, 1, 4 + step, seed=step))
            assert_close(run(sim, compiled, tokens, pos), reference(tokens, pos))
    sim.check()
    for buf, ref in zip(model.buffers(), reference.buffers(), strict=True):  # the KV caches, updated in place
        assert_close(buf, ref)
    (report,) = backend.reports
    assert report.device == "cuda:0" and report.captured and report.uncaptured_reason is None
    assert report.host_prologue["per_call"] and report.host_prologue["transfers"]
    ((entry,),) = [c.keys.values() for c in captures]
    assert entry.replays == 5 and entry.recorded.refill and not any(t.static for _, t in entry.recorded.refill)
    assert bool(entry.recorded.fed) == (input_copies == "in-graph") and bool(entry.recorded.batches) != bool(
        entry.recorded.fed
    )


def test_host_work_runs_once_per_call_and_static_work_once_per_key(captures, monkeypatch):
    calls = {"static": 0, "per_call": 0}
    for name in calls:
        method = getattr(HostSplit, f"run_{name}")

        def counted(self, *args, method=method, name=name):
            calls[name] += 1
            return method(self, *args)

        monkeypatch.setattr(HostSplit, f"run_{name}", counted)
    sim = SimulatedCuda()
    compiled, backend = compile_with(gather_rows, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    x = sim.to_device(torch.randn(4, 3))
    kept = []
    for step in range(4):
        lengths = torch.tensor([step, 0, 2, step // 2])  # a host tensor: not placed
        kept.append((run(sim, compiled, x, lengths), gather_rows(x, lengths)))
    sim.check()
    for (rows, index), (want_rows, want_index) in kept:  # every step's outputs are still that step's
        assert_close(rows, want_rows)
        assert torch.equal(index, want_index)
    (report,) = backend.reports
    assert report.captured and report.host_prologue["per_call"] and report.host_prologue["transfers"]
    (entry,) = captures[0].keys.values()
    assert entry.state is CaptureState.CAPTURED and entry.replays == 3
    # the warm-up call runs everything once and is recorded from (its host values reused: random or mutating
    # per-call work must run once a call); each replay runs the per-call work only
    assert calls == {"static": 1, "per_call": 4}
    assert [t.static for _, t in entry.recorded.refill] == [False]  # only the per-call transfer is refilled
    assert entry.recorded.copy_indices == (0,)  # the device input gets a static buffer, the host input does not
    split = captures[0]._recorder._split
    assert sorted((t.static, t.pin) for t in split.transfers) == [(False, True), (True, True)]
    assert [where for where, _ in split.program.recipe] == ["device", "host"]


def test_a_host_value_of_data_dependent_shape_keeps_the_graph_uncaptured():
    """nonzero of a CPU input runs on the host; its device copy has a size only the data decides, which one
    recorded CUDA graph buffer cannot hold: refused, naming the copy."""

    def fn(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        idx = torch.nonzero(lengths > 0).flatten()
        return x.index_select(0, idx.to(x.device)) * 2

    sim = SimulatedCuda()
    compiled, backend = compile_with(fn, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for step in range(3):
            x, lengths = sim.to_device(torch.randn(4, 3)), torch.tensor([step, 0, 1, 1])
            assert_close(run(sim, compiled, x, lengths), fn(x, lengths))
    sim.check()
    (report,) = backend.reports
    assert not report.captured and "copies view to the device with a data-dependent shape" in report.uncaptured_reason
    assert "nonzero" in {n.name.rstrip("_0123456789") for n in report.nodes if n.placement == "host"}


def test_the_caller_gets_host_values_themselves_not_the_buffers_an_async_copy_reads(monkeypatch):
    """max-autotune: `index` is both a graph output and the source of an asynchronous copy to the device.
    The copy reads a pinned copy of it; the caller gets the value itself and may write to it at once."""
    sim = SimulatedCuda()
    handed_to_copies: list[torch.Tensor] = []
    for name in ("pinned", "pinned_copy"):
        pin = getattr(sim, name)

        def spy(t: torch.Tensor, pin=pin) -> torch.Tensor:
            handed_to_copies.append(pin(t))
            return handed_to_copies[-1]

        monkeypatch.setattr(sim, name, spy)
    compiled, _ = compile_with(gather_rows, runtime=sim, kernel_backend="aten")
    x, lengths = sim.to_device(torch.randn(4, 3)), torch.tensor([1, 0, 2, 1])
    rows, index = run(sim, compiled, x, lengths)
    want_rows, want_index = gather_rows(x, lengths)
    assert_close(rows, want_rows)
    assert torch.equal(index, want_index)
    assert handed_to_copies and all(index is not copy for copy in handed_to_copies)
    index.add_(100)  # the caller writes to its output: nothing the copies read changes
    assert all(copy.max() < 100 for copy in handed_to_copies)
    sim.check()


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_an_input_copied_to_the_device_and_updated_in_place_is_the_caller_s(mode, monkeypatch):
    """`idx` (a host input) is read by a device op through a copy and then updated in place: the update reaches
    the caller's tensor, and no pinned copy of it is made for nothing (the copy reads it before the update)."""

    def fn(x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor]:
        out = x[idx] * 2
        idx.add_(1)
        return (out,)

    sim = SimulatedCuda()
    copied: list[torch.Tensor] = []
    pinned_copy = sim.pinned_copy
    monkeypatch.setattr(sim, "pinned_copy", lambda t: copied.append(t) or pinned_copy(t))
    compiled, backend = compile_with(fn, runtime=sim, mode=mode, kernel_backend="aten")
    x = sim.to_device(torch.randn(10, 3))
    idx, want_idx = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    for _ in range(3):
        (got,) = run(sim, compiled, x, idx)
        (want,) = fn(x, want_idx)
        assert_close(got, want)
        assert torch.equal(idx, want_idx)  # the caller's idx was updated, every call
    assert all(t is not idx for t in copied)
    (report,) = backend.reports
    if mode == "reduce-overhead":  # the update is device work reading a per-call host value: not recordable
        assert not report.captured and "copy_ = aten.copy_.default reads arg1_1" in report.uncaptured_reason
    sim.check()
