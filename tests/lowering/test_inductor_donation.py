"""Inductor's donated backward inputs (``bw_donated_idxs``) index the whole backward graph's inputs. Each
segment gets its own positions, for the donated inputs it reads last; a later reader never sees them
overwritten."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch._guards import TracingContext, tracing
from torch._inductor.utils import get_donated_idxs

from airgraph.lowering import donated_inputs
from airgraph.lowering.inductor import _donating
from tests.helpers import assert_close, compile_with


def traced_with(donated: list[int]) -> tuple[TracingContext, SimpleNamespace]:
    metadata = SimpleNamespace(bw_donated_idxs=donated)
    context = TracingContext(fake_mode=None)
    context.fw_metadata = metadata
    return context, metadata


def test_a_segment_sees_its_own_positions_and_the_graph_s_are_put_back():
    context, metadata = traced_with([0, 2])
    with tracing(context):
        with _donating([1]):
            assert get_donated_idxs() == [1]
        assert get_donated_idxs() == [0, 2]
        with _donating(None):  # not a backward graph: left alone
            assert get_donated_idxs() == [0, 2]
    assert metadata.bw_donated_idxs == [0, 2]


def test_donated_inputs_go_to_their_last_reader_at_its_positions():
    a, b, c, d = "a", "b", "c", "d"  # the graph's placeholders, in order
    first = SimpleNamespace(id=0, inputs=[c, a])
    second = SimpleNamespace(id=1, inputs=[d, a, b])  # reads a last
    context, _ = traced_with([0, 2, 3])  # a, c, d donated
    with tracing(context):
        donated = donated_inputs([first, second], [a, b, c, d])
    assert donated == {0: [0], 1: [1, 0]}  # c (read last by the first) at 0; a at 1 and d at 0 in the second


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
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_close(p.grad, q.grad)
    assert {r.kind for r in backend.reports} == {"forward", "backward"}
