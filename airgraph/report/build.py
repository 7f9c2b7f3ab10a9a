"""A compiled graph's report, built from what the compile step made (backend.py calls these, step by step).

:func:`graph_report` opens the report of one ATen graph, :func:`capture_plan_report` says what reduce-overhead
will do with it, and :func:`finish_graph_report` adds its nodes and segments once they are chosen (and lowered).
The runtime updates the capture fields later (``captured``, ``capture_keys``, ...); nothing here runs a graph.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from airgraph.graph.analysis import target_name
from airgraph.graph.meta import SEGMENT, STREAM, placement
from airgraph.report.schema import GraphReport, NodeReport, SegmentReport, next_graph_id

if TYPE_CHECKING:
    from airgraph.graph.program import Segment
    from airgraph.lowering.capture_plan import CapturePlan

__all__ = ["capture_plan_report", "finish_graph_report", "graph_report", "warm_report"]


def graph_report(mode: str, kind: str, device: torch.device, dynamo_graph: int, *, planned: bool) -> GraphReport:
    """A new graph's report, with a process-wide unique id."""
    return GraphReport(
        id=next_graph_id(), mode=mode, kind=kind, device=str(device), dynamo_graph=dynamo_graph, planned=planned
    )


def capture_plan_report(report: GraphReport, plan: CapturePlan) -> None:
    """Why the graph runs uncaptured, as far as the plan knows (a graph the runtime will try to capture leaves it to
    the runtime; a planned one, never run, says the plan's reason), and the host work split off around replays."""
    report.uncaptured_reason = plan.uncapturable if report.planned or not plan.capture else None
    if plan.split:
        report.host_prologue = plan.host.describe()


def finish_graph_report(report: GraphReport, gm: torch.fx.GraphModule, segments: list[Segment], start: float) -> None:
    """The graph's nodes (stream, placement, segment, device) and segments (backend, who chose it), and the time
    since ``start`` (``time.perf_counter()``)."""
    report.nodes = [_node_report(node) for node in gm.graph.nodes]
    report.segments = [_segment_report(segment) for segment in segments]
    report.compile_seconds = time.perf_counter() - start


def warm_report(num_nodes: int, source: dict[str, Any], mode: str, dynamo_graph: int) -> GraphReport:
    """A warm-started graph (airgraph/kernels/warm.py) was not traced to ATen: one segment, its static kernels."""
    report = GraphReport(id=next_graph_id(), mode=mode, kind="inference", device="cpu", dynamo_graph=dynamo_graph)
    report.segments = [SegmentReport(0, None, "device", "static_kernels", num_nodes, "static_kernels", source)]
    return report


def _node_report(node: torch.fx.Node) -> NodeReport:
    val = node.meta.get("val")
    return NodeReport(
        name=node.name,
        target=target_name(node),
        stream=node.meta.get(STREAM),
        placement=placement(node),
        segment=node.meta.get(SEGMENT),
        device=str(val.device) if isinstance(val, torch.Tensor) else None,
    )


def _segment_report(segment: Segment) -> SegmentReport:
    impl = segment.impl
    return SegmentReport(
        id=segment.id,
        stream=segment.stream,
        placement=segment.placement,
        backend=segment.backend,
        num_nodes=len(segment.nodes),
        chosen_by=impl.chosen_by if impl is not None else None,
        source=dict(impl.source) if impl is not None else {},
    )
