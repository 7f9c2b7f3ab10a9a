"""airgraph.compare with streams and host placement, on the simulated CUDA runtime: a correct model is ok, a planted
divergence is found at its node and line, in max-autotune and in reduce-overhead (its last call a replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from airgraph import ops, scope
from airgraph.backend import AirgraphBackend
from airgraph.precision.api import compare_with
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import make_config

aten = torch.ops.aten
MODES = ["max-autotune", "reduce-overhead"]


class TwoStreams(torch.nn.Module):
    """The side stream "side" computes s while the caller's stream computes m; tagged events order them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.ready, self.done = ops.create_tagged_event(tag="cmp_ready"), ops.create_tagged_event(tag="cmp_done")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        ops.tagged_event_record(self.ready)
        with scope.stream_switch("side"):
            ops.tagged_event_wait(self.ready)
            s = torch.tanh(h) * 2  # the planted node (streams)
            ops.tagged_event_record(self.done)
        m = h.sin()
        ops.tagged_event_wait(self.done)
        return s + m


class Positions(torch.nn.Module):
    """Position arithmetic from sizes alone: host placement keeps it on the host (static per shape key)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        pos = torch.arange(n - 2, n, device=x.device) + 1
        scale = pos.sum() * 0.5
        return self.fc(x[-2:]).sigmoid() * pos[:, None] + scale  # the planted node (host)


_LINES = Path(__file__).read_text().splitlines()


def line_of(mark: str) -> str:
    return f"{__file__}:{next(i for i, line in enumerate(_LINES, 1) if mark in line)}"


def replayed_last(captures) -> bool:
    """The compared call was a replay: the recording call replays once, the last call once more (an earlier
    call's output still held would have made it run uncaptured)."""
    return bool(captures) and all(e.replays == 2 for c in captures for e in c.keys.values())


@pytest.mark.parametrize("mode", MODES)
def test_streams_ok_and_a_side_stream_divergence_found(mode, wrong_backend, captures):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    for kernel_backend in ("aten", wrong_backend(aten.tanh.default, aten.relu.default)):
        backend = AirgraphBackend(make_config(kernel_backend=kernel_backend, mode=mode), runtime=SimulatedCuda())
        with torch.no_grad():
            report = compare_with(backend, TwoStreams(), (x,), {})
        (graph,) = backend.reports
        assert {s.stream for s in graph.segments} == {None, "side"}
        assert sum(s.backend == "sync" for s in graph.segments) == 4  # two records, two waits
        assert report.ok == (kernel_backend == "aten")
    first = report.first
    side = next(s for s in graph.segments if s.id == first.segment)
    assert (first.op, first.source, side.stream) == ("aten.tanh.default", line_of("(streams)"), "side")
    assert first.backend == "wrong" and first.chosen_by == "config"
    assert (mode == "reduce-overhead") == replayed_last(captures)


@pytest.mark.parametrize("mode", MODES)
def test_host_placement_ok_and_a_divergence_after_host_work_found(mode, wrong_backend, captures):
    for kernel_backend in ("aten", wrong_backend(aten.sigmoid.default, aten.relu.default)):
        sim = SimulatedCuda()  # placed tensors trace as CUDA ones: host placement runs (runtime/simulated_device.py)
        model, x = sim.to_device(Positions()), sim.to_device(torch.randn(6, 3))
        backend = AirgraphBackend(make_config(kernel_backend=kernel_backend, mode=mode), runtime=sim)
        with torch.no_grad():
            report = compare_with(backend, model, (x,), {})
        (graph,) = backend.reports
        assert graph.device == "cuda:0" and [s.placement for s in graph.segments] == ["host", "device"]
        assert bool(graph.host_prologue) == (mode == "reduce-overhead")  # split off the CUDA graph there
        assert report.ok == (kernel_backend == "aten") and not report.notes
    first = report.first
    assert (first.op, first.source, first.segment) == ("aten.sigmoid.default", line_of("(host)"), 1)
    assert (mode == "reduce-overhead") == replayed_last(captures)
