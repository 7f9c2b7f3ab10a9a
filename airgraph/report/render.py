"""Render an :class:`~airgraph.report.ExplainReport` as rich tables, for ``airgraph inspect``.

Per graph: a header line (id, kind, device, mode, capture state, compile time), then the passes, the
segments and every node. The columns are declared in the lists below, so a feature that adds a field to
the report (a stream, a host placement reason) adds one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from airgraph.report.schema import ExplainReport, GraphReport, PassReport

__all__ = ["NODE_COLUMNS", "PASS_COLUMNS", "SEGMENT_COLUMNS", "Column", "graph_header", "render_report"]


@dataclass(frozen=True)
class Column:
    """One table column: a header, how to get the cell from a row, and how wide it may get."""

    header: str
    cell: Callable[[Any], str]
    justify: str = "left"
    max_width: int | None = None  # longer cells end in an ellipsis
    wrap: bool = False  # the one column per table that wraps, so the table fits 80 columns


def _opt(value: Any, none: str = "—") -> str:
    return none if value is None else str(value)


def _source(source: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in source.items())


def _details(p: PassReport, shown: int = 2) -> str:
    if not p.details:
        return ""
    extra = len(p.details) - shown
    return "; ".join(p.details[:shown]) + (f" (+{extra} more)" if extra > 0 else "")


PASS_COLUMNS: list[Column] = [
    Column("pass", lambda p: p.name),
    Column("enabled", lambda p: "✓" if p.enabled else "off", "center"),
    Column("changed", lambda p: str(p.changed) if p.enabled else "—", "right"),
    Column("ms", lambda p: f"{p.seconds * 1e3:.2f}" if p.enabled else "—", "right"),
    Column("details", _details, wrap=True),
]

SEGMENT_COLUMNS: list[Column] = [
    Column("segment", lambda s: str(s.id), "right"),
    Column("stream", lambda s: _opt(s.stream, "default")),
    Column("placement", lambda s: s.placement),
    Column("backend", lambda s: s.backend),
    Column("chosen by", lambda s: _opt(s.chosen_by) + (f" ({_source(s.source)})" if s.source else ""), wrap=True),
    Column("nodes", lambda s: str(s.num_nodes), "right"),
]

NODE_COLUMNS: list[Column] = [
    Column("node", lambda n: n.name, max_width=18),
    Column("target", lambda n: n.target, max_width=30),
    Column("stream", lambda n: _opt(n.stream, "default"), max_width=8),
    Column("placement", lambda n: n.placement, max_width=9),
    Column("seg", lambda n: _opt(n.segment), "right", max_width=3),
]


def _table(title: str, columns: list[Column], rows: list[Any]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for col in columns:
        table.add_column(
            col.header,
            justify=col.justify,  # type: ignore[arg-type]
            max_width=col.max_width,
            no_wrap=not col.wrap,
            overflow="fold" if col.wrap else "ellipsis",
        )
    for row in rows:
        table.add_row(*(col.cell(row) for col in columns))
    return table


def capture_state(graph: GraphReport) -> str:
    """Captured (how many shape keys), or why not."""
    if graph.captured:
        recaptures = f", {graph.recaptures} re-captures" if graph.recaptures else ""
        sizes = ""
        if graph.capture_sizes:
            sizes = f"; sizes {graph.capture_sizes}, {graph.padded_calls} padded calls ({graph.padded_rows} rows)"
        return f"captured ({graph.capture_keys} shape key{'s' if graph.capture_keys != 1 else ''}{recaptures}{sizes})"
    if graph.uncaptured_reason:
        return f"uncaptured: {graph.uncaptured_reason}"
    if graph.mode == "reduce-overhead":
        return "not captured yet (warm-up)"
    return "not captured (max-autotune runs the segments directly)"


def graph_header(graph: GraphReport) -> Text:
    """One line naming the graph: id, kind, device, mode, capture state, compile time."""
    text = Text()
    text.append(f"graph {graph.id}", style="bold")
    text.append(f" · {graph.kind} · {graph.device} · {graph.mode} · dynamo graph {graph.dynamo_graph}")
    text.append(f" · {len(graph.nodes)} nodes · compiled in {graph.compile_seconds:.2f} s\n")
    if graph.planned:
        text.append("planned on fake tensors: nothing ran; kernel backends named, not compiled\n", style="cyan")
    host = sum(node.placement == "host" for node in graph.nodes)
    if host:
        text.append(f"{host} node(s) placed on the host\n", style="cyan")
    style = "green" if graph.captured else "yellow" if graph.mode == "reduce-overhead" else "dim"
    text.append(capture_state(graph), style=style)
    return text


def passes_table(graph: GraphReport) -> Table:
    return _table("passes", PASS_COLUMNS, graph.passes)


def segments_table(graph: GraphReport) -> Table:
    return _table("segments", SEGMENT_COLUMNS, graph.segments)


def nodes_table(graph: GraphReport) -> Table:
    return _table("nodes", NODE_COLUMNS, graph.nodes)


EVENT_COLUMNS = [
    Column("event", lambda e: e["tag"]),
    Column("recorded by", lambda e: e["record"]),
    Column("on stream", lambda e: _opt(e["record_stream"], "caller")),
    Column("waited by", lambda e: e["wait"]),
    Column("on stream", lambda e: _opt(e["wait_stream"], "caller")),
]


def events_table(graph: GraphReport) -> Table:
    """Event edges (record -> wait) from the streams pass."""
    return _table("event edges", EVENT_COLUMNS, graph.events)


def render_report(report: ExplainReport, console: Console) -> None:
    """Print the whole report: a summary, then per graph its header, passes, segments and nodes."""
    config = report.config or {}
    breaks = len(report.graph_breaks)
    console.print(
        f"[bold]airgraph explain[/]: {len(report.graphs)} ATen graph(s) from {report.dynamo_graphs} Dynamo "
        f"graph(s), {breaks} graph break(s) · mode {config.get('mode', '?')} · "
        f"kernel backend {config.get('kernel_backend', '?')}"
    )
    for reason in report.graph_breaks:
        console.print(f"  [yellow]graph break[/]: {reason}")
    for graph in report.graphs:
        console.rule()
        console.print(graph_header(graph))
        console.print(passes_table(graph))
        console.print(segments_table(graph))
        if graph.events:
            console.print(events_table(graph))
        console.print(nodes_table(graph))
