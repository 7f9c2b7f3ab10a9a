"""Lowering: every compute segment chosen (select.py) and compiled by its kernel backend (backends.py).

``lower_segment(segment, impl, request)`` is the one function every path uses to lower a segment: the executor's
segments, and the pieces of a graph whose host work is split off around a CUDA graph (host_split.py). It compiles
the segment for the strides its inputs really have and records the strides its outputs really have
(layouts.py), and tells a backward segment which inputs it may overwrite (donation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.graph.analysis import aliased_base
from airgraph.graph.program import Segment
from airgraph.lowering import aot, backends
from airgraph.lowering.keys import shape_key
from airgraph.lowering.layouts import Layouts, real_outputs
from airgraph.lowering.request import LowerRequest
from airgraph.lowering.select import GraphRequest, Impl, choose

__all__ = ["Lowering", "donated_inputs", "lower_segment", "lower_segments"]


@dataclass
class Lowering:
    """The graph-wide state lowering its segments needs: the strides values really have, and donation."""

    layouts: Layouts | None = None
    donated: dict[int, list[int]] = field(default_factory=dict)  # segment id -> inputs it may overwrite


def lower_segment(
    segment: Segment, impl: Impl, request: GraphRequest, lowering: Lowering | None = None
) -> Callable[[list], Any]:
    """Compile ``segment`` with ``impl``; sets ``segment.impl`` and ``segment.compiled`` and returns the callable."""
    lowering = lowering or Lowering()
    layouts = lowering.layouts
    inputs = layouts.inputs(segment.inputs) if layouts is not None else segment.example_inputs()
    lower = backends.get(impl.backend)

    def compile_on(example_inputs: list[Any]) -> Callable[[list], Any]:
        return lower(
            LowerRequest(
                gm=segment.gm,
                example_inputs=example_inputs,
                kind=request.kind,
                device=request.device,
                config=request.config,
                donated=lowering.donated.get(segment.id, []),
                shape_key=shape_key(example_inputs),
                options=impl.options,
            )
        )

    compiled, real = real_outputs(compile_on, segment.gm, inputs, reports=impl.backend == "inductor")
    if layouts is not None:
        layouts.record(segment.outputs, real)
    segment.impl, segment.compiled = impl, compiled
    return compiled


def lower_segments(
    segments: list[Segment],
    request: GraphRequest,
    *,
    layouts: Layouts | None = None,
    placeholders: list[torch.fx.Node] | None = None,
) -> None:
    """Choose and lower every compute segment, in order. ``placeholders`` (the graph's) let a backward segment
    overwrite the donated inputs it reads last (see :func:`donated_inputs`); without them, none."""
    compute = [seg for seg in segments if not seg.sync]
    donated = donated_inputs(compute, placeholders) if request.kind == "backward" and placeholders else {}
    lowering = Lowering(layouts, donated)
    for seg in compute:
        lower_segment(seg, choose(seg, request), request, lowering)


def donated_inputs(segments: list[Segment], placeholders: list[torch.fx.Node]) -> dict[int, list[int]]:
    """Segment id -> positions of its inputs it may overwrite: AOTAutograd's donated backward buffers
    (``bw_donated_idxs``, positions among the graph's inputs: saved tensors nothing else holds), each given
    to the one segment that uses its memory, at its position among that segment's inputs.

    A donated input whose memory another segment also reads (the input itself or a view of it), or that a
    segment returns a view of, is not donated: Inductor sees only its own segment, and would overwrite memory
    that another segment, maybe on another stream, still reads."""
    graph_donated = aot.donated_inputs()
    users: dict[torch.fx.Node, set[int]] = {}  # memory (its base node) -> segments reading it
    returned = {aliased_base(node) for seg in segments for node in seg.outputs}  # memory a segment hands on
    for seg in segments:
        for node in seg.inputs:
            users.setdefault(aliased_base(node), set()).add(seg.id)
    by_id = {seg.id: seg for seg in segments}
    donated: dict[int, list[int]] = {}
    for index in graph_donated:
        node = placeholders[index] if index < len(placeholders) else None
        if node is None or node in returned or len(users.get(node, ())) != 1:
            continue
        (seg_id,) = users[node]
        if node in by_id[seg_id].inputs:
            donated.setdefault(seg_id, []).append(by_id[seg_id].inputs.index(node))
    return donated
