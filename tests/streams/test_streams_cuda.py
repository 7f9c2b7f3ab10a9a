"""In-graph multi-stream on CUDA: real side streams, captured in one CUDA graph. Run on the GPU machine."""

from __future__ import annotations

import pytest
import torch

from airgraph import ops, scope
from tests.helpers import assert_close, compile_with
from tests.streams.models import SeedModel

pytestmark = pytest.mark.cuda


def cuda_inputs(size: int = 256) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(size, size, device="cuda") for _ in range(4)]


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_seed_model_on_cuda(kernel_backend, mode):
    model, inputs = SeedModel(size=256), cuda_inputs()
    compiled, backend = compile_with(model, kernel_backend=kernel_backend, mode=mode, fullgraph=True)
    expected = model(*inputs)  # eager on CUDA switches real streams too
    torch.cuda.synchronize()
    kept = [compiled(*inputs) for _ in range(4)]  # warm-up, record, replays; every result kept
    torch.cuda.synchronize()
    for outputs in kept:
        for got, want in zip(outputs, expected, strict=True):
            assert_close(got, want)
    (report,) = backend.reports
    assert report.captured == (mode == "reduce-overhead")
    assert {s.stream for s in report.segments} >= {"1", "2"}


def test_side_streams_are_real_and_distinct():
    assert ops.stream_for("1") == ops.stream_for("1")
    assert ops.stream_for("1") != ops.stream_for("2")
    assert ops.stream_for("1") != torch.cuda.current_stream()


def test_cross_stream_consumer_under_memory_pressure_never_reads_reused_memory():
    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("producer"):
            big = x @ x  # produced on a side stream
        with scope.stream_switch("consumer"):
            out = (big * 2).sum(dim=0)  # read on another stream, after the executor's wait
        churn = x + 1  # the default stream allocates right away: must not get `big`'s memory early
        return out + churn.sum(dim=0)

    compiled, _ = compile_with(fn, kernel_backend="aten", mode="reduce-overhead", fullgraph=True)
    x = torch.randn(1024, 1024, device="cuda") / 32
    # The reference without streams: in eager, a scope waits for the caller's stream on entry only (as
    # torch.cuda.stream does), so fn itself would read `big` on "consumer" before "producer" is done with it.
    expected = ((x @ x) * 2).sum(dim=0) + (x + 1).sum(dim=0)
    for _ in range(5):
        assert_close(compiled(x), expected)
        # Allocate and scribble over freed memory between calls.
        junk = [torch.full((1024, 1024), float("nan"), device="cuda") for _ in range(4)]
        del junk
    torch.cuda.synchronize()
