"""Partition an ATen graph into segments: maximal runs of nodes that share (placement, stream, fallback).

A node config.fallback names (``node.meta["fallback"]``, passes/fallback.py) never shares a segment with one it
does not name, so the seam can run it through the aten kernel backend alone.

Each segment becomes a standalone ``GraphModule`` whose placeholders are the values it reads from outside
(graph inputs or other segments' results) and whose output is the tuple of values it produces for later
segments or the graph output. Kernel backends lower these graph modules; the executor wires them.
"""

from __future__ import annotations

import operator

import torch

from airgraph.graph.analysis import written_inputs
from airgraph.graph.meta import FALLBACK, SEGMENT, STREAM, placement
from airgraph.graph.program import Segment
from airgraph.ops import EVENT_RECORD, EVENT_WAIT, RECORD_STREAM

__all__ = ["SYNC_OPS", "partition", "subgraph"]

SYNC_OPS = frozenset({EVENT_RECORD, EVENT_WAIT, RECORD_STREAM})


def segment_key(node: torch.fx.Node) -> tuple[str, str | None]:
    return placement(node), node.meta.get(STREAM)


def _fallback(segment: Segment) -> str | None:
    return segment.nodes[-1].meta.get(FALLBACK) if segment.nodes else None


def partition(gm: torch.fx.GraphModule, *, streams: bool = True) -> list[Segment]:
    """Split ``gm`` into segments in graph order and build each segment's graph module.

    ``streams=False`` is for graphs that run without device streams (on the CPU): stream scopes then do not
    split segments and the sync points (event record/wait, record_tagged_stream), which would do nothing,
    are left out, so a multi-stream model keeps one segment there (node.meta["stream"] still says what the
    scopes asked for).
    """
    segments: list[Segment] = []
    for node in gm.graph.nodes:
        node.meta.pop(SEGMENT, None)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        source = node.args[0] if node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and SEGMENT in source.meta:
            # A multi-output op's getitems live with it: a segment cannot hand a tuple to another.
            segments[source.meta[SEGMENT]].nodes.append(node)
            node.meta[SEGMENT] = source.meta[SEGMENT]
            continue
        key = segment_key(node) if streams else (segment_key(node)[0], None)
        if node.target in SYNC_OPS and not streams:
            continue
        if node.target in SYNC_OPS:
            segments.append(Segment(id=len(segments), placement=key[0], stream=key[1], nodes=[node], sync=True))
            node.meta[SEGMENT] = segments[-1].id
            continue
        last = segments[-1] if segments else None
        fallback = node.meta.get(FALLBACK)
        if last is None or last.sync or (last.placement, last.stream) != key or _fallback(last) != fallback:
            segments.append(Segment(id=len(segments), placement=key[0], stream=key[1], nodes=[]))
        segments[-1].nodes.append(node)
        node.meta[SEGMENT] = segments[-1].id

    placeholders = gm.graph.find_nodes(op="placeholder")
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph_outputs = [a for a in torch.utils._pytree.tree_leaves(output_node.args[0]) if isinstance(a, torch.fx.Node)]
    # A lone segment also returns the graph inputs the graph returns (a forward graph's parameters, saved for
    # the backward), as torch.compile's Inductor graph does: Inductor may hand back a copy in the layout it
    # converted the input to (a convolution's weight, channels-last), which the backward is then compiled for
    # (lowering/layouts.py), instead of converting it again; and the segment stays the executor itself.
    lone = len(segments) == 1 and not segments[0].sync
    passthrough = {n: None for n in graph_outputs if n.op == "placeholder"} if lone else {}
    for seg in segments:
        members = set(seg.nodes)
        inputs: dict[torch.fx.Node, None] = {}
        for node in seg.nodes:
            for arg in node.all_input_nodes:
                if arg not in members:
                    inputs[arg] = None
        # Graph inputs first, in the graph's order, so a lone segment reading every input takes the graph's
        # argument list as it is (the executor is then the segment itself: no extra frame per call).
        seg.inputs = [n for n in placeholders if n in inputs or n in passthrough]
        seg.inputs += [n for n in inputs if n.op != "placeholder"]
        escaping = [n for n in seg.nodes if any(user not in members for user in n.users)]
        # Graph outputs first, in output order, so a lone segment's outputs are the graph's outputs.
        first = [n for n in dict.fromkeys(graph_outputs) if n in members or n in passthrough]
        seg.outputs = first + [n for n in escaping if n not in set(first)]
        seg.written = written_inputs(seg.nodes, seg.inputs)
        if not seg.sync:
            seg.gm = subgraph(gm, seg.inputs, seg.nodes, seg.outputs, f"Segment{seg.id}")
    return segments


def subgraph(
    owner: torch.fx.GraphModule,
    inputs: list[torch.fx.Node],
    nodes: list[torch.fx.Node],
    outputs: list[torch.fx.Node],
    name: str,
) -> torch.fx.GraphModule:
    """A graph module computing ``outputs`` (a tuple) from ``inputs`` (its placeholders) with copies of ``nodes``."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        env[node] = placeholder
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(owner, graph, class_name=name)
