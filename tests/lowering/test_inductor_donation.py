"""Inductor's donated backward inputs (``bw_donated_idxs``) index the whole backward graph's inputs. Each
segment gets its own positions, for the donated inputs it reads last; a later reader never sees them
overwritten."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._guards import TracingContext, tracing
from torch._inductor.utils import get_donated_idxs

from airgraph.lowering import aot
from airgraph.lowering.lower import donated_inputs
from tests.helpers import assert_close, compile_with


def traced_with(donated: list[int]) -> tuple[TracingContext, SimpleNamespace]:
    metadata = SimpleNamespace(bw_donated_idxs=donated)
    context = TracingContext(fake_mode=None)
    context.fw_metadata = metadata
    return context, metadata


def test_a_segment_sees_its_own_positions_and_the_graph_s_are_put_back():
    context, metadata = traced_with([0, 2])
    with tracing(context):
        with aot.donating([1]):
            assert get_donated_idxs() == [1]
        assert get_donated_idxs() == [0, 2]
        with aot.donating(None):  # not a backward graph: left alone
            assert get_donated_idxs() == [0, 2]
    assert metadata.bw_donated_idxs == [0, 2]


def backward_like_graph() -> tuple[list[torch.fx.Node], dict[str, torch.fx.Node]]:
    """Placeholders a, b, c, d; t = a view of c; the nodes by name."""
    graph = torch.fx.Graph()
    a, b, c, d = (graph.placeholder(name) for name in "abcd")
    t = graph.call_function(torch.ops.aten.view.default, (c, [-1]))
    graph.output((a, t))
    return [a, b, c, d], {"a": a, "b": b, "c": c, "d": d, "t": t}


def test_a_donated_input_goes_to_the_one_segment_using_its_memory_at_its_position():
    placeholders, n = backward_like_graph()
    first = SimpleNamespace(id=0, inputs=[n["d"], n["b"]], outputs=[])
    second = SimpleNamespace(id=1, inputs=[n["b"], n["a"]], outputs=[])
    context, _ = traced_with([0, 3])  # a and d donated
    with tracing(context):
        donated = donated_inputs([first, second], placeholders)
    assert donated == {1: [1], 0: [0]}  # a at position 1 of the second, d at 0 of the first


def test_memory_another_segment_reads_or_returns_is_not_donated():
    placeholders, n = backward_like_graph()
    # c is read by the first segment, and its view t by the second: overwriting c would change what t reads
    first = SimpleNamespace(id=0, inputs=[n["c"]], outputs=[])
    second = SimpleNamespace(id=1, inputs=[n["t"], n["b"]], outputs=[])
    # b is read by both segments; a is returned by a segment
    third = SimpleNamespace(id=2, inputs=[n["b"], n["a"]], outputs=[n["a"]])
    context, _ = traced_with([0, 1, 2])  # a, b and c donated
    with tracing(context):
        assert donated_inputs([first, second, third], placeholders) == {}


@pytest.mark.slow
def test_training_with_donated_buffers_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    compiled, backend = compile_with(model, kernel_backend="inductor")
    for _ in range(2):
        x = torch.randn(5, 8)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_close(p.grad, q.grad)
    assert {r.kind for r in backend.reports} == {"forward", "backward"}
