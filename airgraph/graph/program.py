"""What lowering hands the runtime: segments with their compiled callables, and the pieces of a graph whose host
work runs around a CUDA graph. Plain data: lowering (airgraph/lowering) fills it, the runtime runs it, and neither
imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.graph.meta import SEGMENT

__all__ = ["HostProgram", "Segment", "Transfer"]


@dataclass
class Segment:
    """A maximal run of graph nodes sharing (placement, stream), as its own graph module.

    A compute segment is lowered by a kernel backend (``impl`` says which and who chose it) into ``compiled``, a
    boxed callable: it takes a list of input values (cleared) and returns a sequence of outputs. A ``sync``
    segment is one event record, event wait or record_tagged_stream that the executor performs itself.
    """

    id: int
    placement: str
    stream: str | None
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node] = field(default_factory=list)
    outputs: list[torch.fx.Node] = field(default_factory=list)
    sync: bool = False
    gm: torch.fx.GraphModule | None = None
    written: frozenset[int] = frozenset()  # positions of inputs that one of the segment's ops writes in place
    impl: Any = None  # lowering.select.Impl
    compiled: Any = None

    @property
    def backend(self) -> str:
        """The kernel backend running it ("sync" for a sync segment, "" before it is chosen)."""
        return "sync" if self.sync else (self.impl.backend if self.impl is not None else "")

    def example_inputs(self) -> list[Any]:
        """The traced values of its inputs (lowering.layouts knows the strides they really have)."""
        return [node.meta.get("val") for node in self.inputs]


@dataclass
class Transfer:
    """One host value copied to the device ahead of the device part of a split graph: an input of that part.

    ``op(source value, *args, **kwargs)`` is the graph's own copy node (``_to_copy``, ``prims.device_put``)."""

    name: str
    op: Callable[..., torch.Tensor]
    args: tuple
    kwargs: dict
    source: int  # slot of the host value
    static: bool  # computed once per shape key (its device copy is a constant of the key's CUDA graph)
    pin: bool  # host placement's own copy: from pinned memory, asynchronous
    non_blocking: bool
    graph_input: bool  # the source is a graph input (the caller's tensor): pinned into a new buffer


@dataclass
class HostProgram:
    """A graph cut into static host work, per-call host work and the device part, each lowered on its own.

    Values live in slots: the graph inputs first, then the static results, then the per-call results. The device
    part (``device_gm``, partitioned and lowered by the caller into ``device_segments``: :meth:`adopt`) reads the
    graph inputs followed by one value per transfer (the device copy) and per feed (a static host value).
    ``recipe`` builds graph output i: ("device", index in the device part's outputs), ("host", slot) or ("const",
    value). ``copies``: each device node of the graph and its copy in ``device_gm``.
    """

    static_fn: Callable[[list], Any] | None
    static_in: list[int] | None
    per_call_fn: Callable[[list], Any] | None
    per_call_in: list[int] | None
    transfers: list[Transfer]
    feeds: list[int]
    device_gm: torch.fx.GraphModule
    copies: dict[torch.fx.Node, torch.fx.Node]
    device: torch.device
    recipe: list[tuple[str, Any]]
    static_slots: tuple[int, int]
    segments: list[Segment] = field(default_factory=list)  # the host pieces, for reports
    device_segments: list[Segment] = field(default_factory=list)

    def adopt(self, device_segments: list[Segment]) -> list[Segment]:
        """Take the device program's segments (partitioned from ``device_gm``): numbered after the host pieces,
        and the graph's own nodes told which segment their copies went to. Returns every segment, host first."""
        offset = len(self.segments)
        for seg in device_segments:
            seg.id += offset
            for node in seg.nodes:
                node.meta[SEGMENT] = seg.id
        for node, copy in self.copies.items():
            if SEGMENT in copy.meta:
                node.meta[SEGMENT] = copy.meta[SEGMENT]
        self.device_segments = device_segments
        return [*self.segments, *device_segments]
