"""PaddedRun (runtime/padding.py): calls of any batch run at the next capture size and give the unpadded results."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import torch

from airgraph.lowering.padding import PadPlan, plan_padding
from airgraph.runtime.padding import PaddedRun
from tests.lowering.test_padding import aten_graph

SIZES = [2, 4, 8]


def report() -> SimpleNamespace:
    return SimpleNamespace(id=7, capture_sizes=[], padded_calls=0, padded_rows=0)


class Recorder:
    """The wrapped run: the graph itself, remembering the batch of every call it got."""

    def __init__(self, gm: torch.fx.GraphModule, source: int) -> None:
        self.gm, self.source, self.batches = gm, source, []

    def __call__(self, args: list) -> list:
        self.batches.append(args[self.source].shape[0])
        return list(self.gm(*args))


def _mlp(x, scale):
    h = torch.nn.functional.gelu(x @ scale)
    return h * 2, h.sum(-1)


def test_random_batches_run_at_capture_sizes_and_equal_the_unpadded_graph():
    scale = torch.randn(6, 6)
    gm, inputs = aten_graph(_mlp, torch.randn(3, 6), scale)
    plan = plan_padding(gm, dim=0)
    assert isinstance(plan, PadPlan)
    run = Recorder(gm, plan.source)
    padded = PaddedRun(run, plan, SIZES, rep := report())
    rng = random.Random(0)
    for _ in range(20):
        batch = rng.randint(1, 8)
        args = [batch if i in plan.symints else a for i, a in enumerate(inputs)]
        args[plan.source] = torch.randn(batch, 6)
        want = gm(*args)
        got = padded(list(args))
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
    assert set(run.batches) <= set(SIZES)  # only capture sizes reached the graph
    assert rep.capture_sizes == SIZES
    assert rep.padded_rows > 0


def test_a_batch_above_the_largest_size_runs_unpadded_and_warns_once(caplog):
    gm, inputs = aten_graph(lambda x: x * 3, torch.randn(3, 2))
    plan = plan_padding(gm, dim=0)
    run = Recorder(gm, plan.source)
    padded = PaddedRun(run, plan, SIZES, report())
    with caplog.at_level(logging.WARNING, logger="airgraph"):
        for batch in (11, 12):
            args = [batch if i in plan.symints else a for i, a in enumerate(inputs)]
            args[plan.source] = x = torch.randn(batch, 2)
            torch.testing.assert_close(padded(args)[0], x * 3)
    assert run.batches == [11, 12]
    warned = [r for r in caplog.records if "above its largest capture size 8" in r.getMessage()]
    assert len(warned) == 1 and "capture_sizes" in warned[0].getMessage()


def test_an_input_the_graph_writes_gets_its_real_rows_back_and_nothing_else():
    """A graph that writes its input in place (as airgraph's graphs keep input mutations) gets the buffer; the
    caller's tensor gets the real rows back, and the rows it does not have are never touched."""
    seen = []

    def run(args: list) -> list:
        n, x = args
        seen.append(n)
        x.add_(torch.arange(x.shape[0]).unsqueeze(1))
        return [x * 2]

    plan = PadPlan(symbol=None, dim=0, source=1, symints=(0,), padded=((1, 0, 1),), sliced=((0, 0, 1),), scalars=())
    padded = PaddedRun(run, plan, SIZES, report(), mutated_indices=[1])
    whole = torch.zeros(5, 2)
    x = whole[:3]  # the caller's rows; the two after them are not the call's
    out = padded([3, x])
    assert seen == [4]
    want = torch.arange(3.0).unsqueeze(1).expand(3, 2)
    torch.testing.assert_close(x, want)
    torch.testing.assert_close(out[0], want * 2)
    torch.testing.assert_close(whole[3:], torch.zeros(2, 2))


def test_record_sizes_runs_every_size_largest_first():
    gm, inputs = aten_graph(lambda x: x + 1, torch.randn(3, 2))
    plan = plan_padding(gm, dim=0)
    run = Recorder(gm, plan.source)
    PaddedRun(run, plan, SIZES, report()).record_sizes(list(inputs), calls=2)
    assert run.batches == [8, 8, 4, 4, 2, 2]
