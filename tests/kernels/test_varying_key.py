"""kernels/shapes.py's VaryingKey: a static-kernel segment (kernels/dispatch.py) and a warm graph (kernels/warm.py)
tell calls apart, name them in the library and label them the same way (no compile, stub kernels)."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.kernels.dispatch import LoadedKernel, StaticKernelSegment
from airgraph.kernels.shapes import VaryingKey, shape_id, spec
from airgraph.kernels.warm import WarmGraph
from airgraph.lowering.keys import shape_key
from airgraph.lowering.request import LowerRequest
from airgraph.lowering.select import Impl


def _traced() -> tuple[torch.fx.GraphModule, list[Any]]:
    """x (sizes symbolic), y (1 x 1: static), n (a SymInt)."""

    def f(x, y, n):
        return ((x * n + y).sum(0),)

    gm = make_fx(f, tracing_mode="symbolic")(torch.ones(3, 4), torch.ones(1, 1), 5)
    return gm, [p.meta["val"] for p in gm.graph.find_nodes(op="placeholder")]


class _Library:
    """Answers every load with a kernel that notes what it was asked for and what it was given."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []
        self.inputs: list[list[torch.Tensor]] = []

    def load(self, graph_key: str, sid: str, device: torch.device) -> LoadedKernel:
        self.loads.append((graph_key, sid))

        def run(tensors: list) -> list:
            self.inputs.append(list(tensors))
            return [torch.zeros(tensors[0].shape[1])]

        return LoadedKernel(kid=f"{graph_key}/{sid}", run=run, model=None)

    def building_elsewhere(self, graph_key: str, sid: str) -> bool:
        return False


def test_the_key_label_and_shape_id_of_a_call():
    _, traced = _traced()
    varying = VaryingKey(traced)
    assert (varying.tensors, varying.values) == ([0], [2])  # y's sizes are all 1: it never varies
    args = [torch.ones(2, 4), torch.ones(1, 1), 7]
    assert varying.key(args) == (torch.Size([2, 4]), (4, 1), 7)
    assert varying.key([torch.ones(2, 4).t().contiguous().t(), *args[1:]]) != varying.key(args)  # strides count
    assert varying.label(args) == "[2, 4] 7"
    assert varying.spec_label([spec(a, {}) for a in args]) == "[2, 4] 7"
    assert varying.shape_id_of(args) == shape_id(shape_key(args))
    nothing = VaryingKey([torch.ones(2)])
    assert (nothing.key([torch.ones(2)]), nothing.label([torch.ones(2)])) == ((), "static")


def test_a_segment_and_a_warm_graph_key_name_and_label_a_call_alike():
    """The warm graph reads the segment's inputs from a Dynamo graph's, in another order and with one more: its
    key, the shape id it loads and its label must be the segment's for the same call."""
    gm, traced = _traced()
    x, y, n = traced
    library = _Library()
    request = LowerRequest(gm, traced, "inference", torch.device("cpu"), config=None)
    segment = StaticKernelSegment(library, request, Impl("aten", "default"), "g")
    other = torch.ones(5)  # a Dynamo graph input the segment does not read
    warm = WarmGraph(library, gm, "g", "warm", [other, n, x, y], positions=[2, 3, 1])  # type: ignore[arg-type]
    for batch, value in ((2, 7), (3, 7), (2, 8)):
        xs, ys = torch.ones(batch, 4), torch.ones(1, 1)
        segment([xs, ys, value])
        warm(other, value, xs, ys)
        (seg_load, warm_load), library.loads = library.loads, []
        assert seg_load == warm_load == ("g", shape_id(shape_key([xs, ys, value])))
        (seg_inputs, warm_inputs), library.inputs = library.inputs, []
        assert [id(t) for t in seg_inputs] == [id(t) for t in warm_inputs] == [id(xs), id(ys)]
    assert list(segment._runs) == list(warm.runs)
    assert sorted(segment.static_keys) == warm.source["static_keys"] == ["[2, 4] 7", "[2, 4] 8", "[3, 4] 7"]
