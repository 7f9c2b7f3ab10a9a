"""Inductor's donated backward inputs (``bw_donated_idxs``) index the whole backward graph's inputs: a segment
that is only part of the graph must not see them (it could overwrite a value a later segment reads)."""

from __future__ import annotations

from types import SimpleNamespace

from torch._guards import TracingContext, tracing
from torch._inductor.utils import get_donated_idxs

from airgraph.lowering.inductor import _no_donation_unless


def test_a_backward_segment_sees_no_donated_inputs_and_the_whole_graph_keeps_them():
    metadata = SimpleNamespace(bw_donated_idxs=[0, 2])
    context = TracingContext(fake_mode=None)
    context.fw_metadata = metadata
    with tracing(context):
        with _no_donation_unless(False):  # a segment of a backward graph
            assert get_donated_idxs() == []
        assert get_donated_idxs() == [0, 2]  # put back
        with _no_donation_unless(True):  # the whole graph, inputs in order
            assert get_donated_idxs() == [0, 2]
    assert metadata.bw_donated_idxs == [0, 2]
