"""Which inputs of a graph are weights a tuned segment may freeze.

Dynamo passes a module's parameters and buffers to the graph as inputs it marks static, and AOTAutograd lists
them (``fw_metadata.static_input_indices``) while the graph compiles. Of those, an input the graph updates (a KV
cache, a running statistic) or returns a view of is not frozen, as in Inductor's own freezing
(torch/_inductor/freezing.py). Only inference graphs freeze: a training step's weights change every step. The
values themselves are only real when the graph runs: a frozen segment takes them on its first call
(tuning/lowering.py).
"""

from __future__ import annotations

from airgraph.graph.program import Segment
from airgraph.lowering import aot

__all__ = ["freezable_positions", "segment_frozen"]


def freezable_positions(kind: str) -> set[int]:
    """Positions of the graph inputs that are frozen-able weights (call while the graph compiles)."""
    if kind != "inference":
        return set()
    return aot.unchanged_weights()  # none when unknown: freeze nothing rather than guess


def segment_frozen(segment: Segment, positions: set[int]) -> list[int]:
    """The positions among ``segment``'s inputs of the graph inputs at ``positions``."""
    if not positions or not segment.inputs:
        return []
    placeholders = {node: i for i, node in enumerate(segment.inputs[0].graph.find_nodes(op="placeholder"))}
    return [p for p, node in enumerate(segment.inputs) if placeholders.get(node, -1) in positions]
