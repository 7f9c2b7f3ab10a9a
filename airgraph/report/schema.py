"""What a compilation did, as data: graphs, passes, segments, per-node stream and placement.

The backend fills one :class:`GraphReport` per ATen graph it compiles (inference, forward or backward);
the runtime updates ``captured`` when a CUDA graph is recorded. ``airgraph.explain`` returns them in an
:class:`ExplainReport`, and ``airgraph inspect`` prints them. Nothing about a compilation should be
knowable only from logs.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ExplainReport", "GraphReport", "NodeReport", "PassReport", "SegmentReport"]

_graph_ids = itertools.count()


def next_graph_id() -> int:
    return next(_graph_ids)


@dataclass
class NodeReport:
    name: str
    target: str
    stream: str | None = None
    # "host" when host placement moved the node to the CPU; "device" otherwise (the graph's placement).
    placement: str = "device"
    segment: int | None = None
    # Where the node's tensor value lives ("cuda:0", "cpu"), None for non-tensor values (SymInts, tuples):
    # a CPU constant in a CUDA graph says "cpu" here even where host placement is off.
    device: str | None = None


@dataclass
class SegmentReport:
    id: int
    stream: str | None
    placement: str
    backend: str  # the kernel backend running it ("sync": an event or stream op the executor performs)
    num_nodes: int
    # Which step of the seam (lowering/select.py) chose the backend: "debug", "host", "compare", "static_kernels",
    # "tuning" or "config"; None for sync segments. ``source``: what the deciding store knows it by (bank key, kernels).
    chosen_by: str | None = None
    source: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassReport:
    name: str
    enabled: bool
    changed: int = 0
    details: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class GraphReport:
    id: int
    mode: str
    kind: str  # "inference", "forward" or "backward"
    device: str
    # Which Dynamo graph (0, 1, ... in the order Dynamo handed them to this backend) this ATen graph is from.
    dynamo_graph: int = 0
    nodes: list[NodeReport] = field(default_factory=list)
    segments: list[SegmentReport] = field(default_factory=list)
    passes: list[PassReport] = field(default_factory=list)
    captured: bool = False
    # Why the graph runs uncaptured in reduce-overhead (None when it is captured or the mode is max-autotune).
    uncaptured_reason: str | None = None
    # Shape keys recorded as CUDA graphs so far, and re-captures after a static input moved.
    capture_keys: int = 0
    recaptures: int = 0
    # Capture sizes (config.reduce_overhead.capture_sizes): the sizes this graph pads to, the calls that were
    # padded and their padded rows; why it runs unpadded when the sizes are set but padding would change a row.
    capture_sizes: list[int] = field(default_factory=list)
    padded_calls: int = 0
    padded_rows: int = 0
    padding_refused: str | None = None
    compile_seconds: float = 0.0
    # Event edges from the streams pass: {"tag", "record", "record_stream", "wait", "wait_stream"}.
    events: list[dict] = field(default_factory=list)
    stream_priorities: dict[str, int] = field(default_factory=dict)
    # Host placement: {"max_elements", "moved", "anchors", "copies", "syncs_removed"} (empty when the pass is off).
    host_placement: dict[str, Any] = field(default_factory=dict)
    # reduce-overhead with host work: host nodes computed once per shape key ("static"), before every replay
    # ("per_call"), and the host-to-device transfers that feed the CUDA graph ("transfers").
    host_prologue: dict[str, list[str]] = field(default_factory=dict)
    # config.frozen_parameters: the parameters this graph holds as constants (Dynamo's names for them), and why
    # it holds none when it refused ("training graph", "static kernels", ...; None otherwise).
    frozen_parameters: list[str] = field(default_factory=list)
    frozen_refused: str | None = None
    # Planned without running (airgraph.explain on fake inputs): nothing was lowered, run or captured.
    planned: bool = False
    # The compile cache (airgraph/cache): "hit" (compiled from an entry: AOTAutograd skipped), "stored" (an entry
    # written), or why none was written; None when the cache is off or the graph has no entry (a training graph).
    compile_cache: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: id, kind, device, mode, segments with their backends, capture state."""
        backends = ", ".join(f"{s.backend}/{s.chosen_by}" if s.chosen_by else s.backend for s in self.segments)
        capture = ""
        if self.mode == "reduce-overhead":
            capture = " · captured" if self.captured else f" · uncaptured ({self.uncaptured_reason or 'warm-up'})"
        return (
            f"graph {self.id} ({self.kind}, {self.device}, {self.mode}): {len(self.nodes)} nodes, "
            f"{len(self.segments)} segment(s) [{backends}]{capture}"
        )

    def __repr__(self) -> str:
        return f"GraphReport<{self.summary()}>"


@dataclass
class ExplainReport:
    """The story of one ``airgraph.explain`` call: every graph compiled while running the function once."""

    graphs: list[GraphReport]
    config: dict[str, Any] = field(default_factory=dict)
    # Dynamo graphs compiled (more than one means graph breaks) and the break reasons Dynamo gave.
    dynamo_graphs: int = 0
    graph_breaks: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"airgraph report: {len(self.graphs)} ATen graph(s) from {self.dynamo_graphs} Dynamo graph(s), "
            f"{len(self.graph_breaks)} graph break(s)"
        ]
        lines += [f"  {g.summary()}" for g in self.graphs]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ExplainReport: {len(self.graphs)} graph(s), {self.dynamo_graphs} Dynamo graph(s); print() it>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "graphs": [g.to_dict() for g in self.graphs],
            "config": self.config,
            "dynamo_graphs": self.dynamo_graphs,
            "graph_breaks": list(self.graph_breaks),
        }
