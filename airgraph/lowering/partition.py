"""Partition an ATen graph into segments: maximal runs of nodes that share (placement, stream).

Each segment becomes a standalone ``GraphModule`` whose placeholders are the values it reads from outside
(graph inputs or other segments' results) and whose output is the tuple of values it produces for later
segments or the graph output. Kernel backends lower these graph modules; the executor wires them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.ops import EVENT_RECORD, EVENT_WAIT, RECORD_STREAM

SYNC_OPS = frozenset({EVENT_RECORD, EVENT_WAIT, RECORD_STREAM})
DEVICE = "device"
HOST = "host"


def segment_key(node: torch.fx.Node) -> tuple[str, str | None]:
    return node.meta.get("placement", DEVICE), node.meta.get("stream")


@dataclass
class Segment:
    id: int
    placement: str
    stream: str | None
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node] = field(default_factory=list)
    outputs: list[torch.fx.Node] = field(default_factory=list)
    # "compute" segments are lowered by a kernel backend; a "sync" segment is one event record, event wait or
    # record_tagged_stream that the executor performs itself.
    kind: str = "compute"
    gm: torch.fx.GraphModule | None = None
    backend: str = ""
    # Boxed callable: takes a list of input values (cleared), returns a sequence of outputs.
    compiled: Any = None

    def example_inputs(self) -> list[Any]:
        return [node.meta.get("val") for node in self.inputs]


def partition(gm: torch.fx.GraphModule, *, streams: bool = True) -> list[Segment]:
    """Split ``gm`` into segments in graph order and build each segment's graph module.

    ``streams=False`` is for graphs that run without device streams (on the CPU): stream scopes then do not
    split segments and the sync points (event record/wait, record_tagged_stream), which would do nothing,
    are left out, so a multi-stream model keeps one segment there (node.meta["stream"] still says what the
    scopes asked for).
    """
    segments: list[Segment] = []
    for node in gm.graph.nodes:
        node.meta.pop("segment", None)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        source = node.args[0] if node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and "segment" in source.meta:
            # A multi-output op's getitems live with it: a segment cannot hand a tuple to another.
            segments[source.meta["segment"]].nodes.append(node)
            node.meta["segment"] = source.meta["segment"]
            continue
        key = segment_key(node) if streams else (segment_key(node)[0], None)
        if node.target in SYNC_OPS and not streams:
            continue
        if node.target in SYNC_OPS:
            segments.append(Segment(id=len(segments), placement=key[0], stream=key[1], nodes=[node], kind="sync"))
            node.meta["segment"] = segments[-1].id
            continue
        last = segments[-1] if segments else None
        if last is None or last.kind == "sync" or (last.placement, last.stream) != key:
            segments.append(Segment(id=len(segments), placement=key[0], stream=key[1], nodes=[]))
        segments[-1].nodes.append(node)
        node.meta["segment"] = segments[-1].id

    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph_outputs = [a for a in torch.utils._pytree.tree_leaves(output_node.args[0]) if isinstance(a, torch.fx.Node)]
    for seg in segments:
        members = set(seg.nodes)
        inputs: dict[torch.fx.Node, None] = {}
        for node in seg.nodes:
            for arg in node.all_input_nodes:
                if arg not in members:
                    inputs[arg] = None
        seg.inputs = list(inputs)
        escaping = [n for n in seg.nodes if any(user not in members for user in n.users)]
        # Graph outputs first, in output order, so a lone segment's outputs are the graph's outputs.
        first = [n for n in dict.fromkeys(graph_outputs) if n in members]
        seg.outputs = first + [n for n in escaping if n not in set(first)]
        if seg.kind == "compute":
            seg.gm = _build_module(gm, seg)
    return segments


def _build_module(owner: torch.fx.GraphModule, seg: Segment) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in seg.inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        env[node] = placeholder
    for node in seg.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in seg.outputs))
    return torch.fx.GraphModule(owner, graph, class_name=f"Segment{seg.id}")
