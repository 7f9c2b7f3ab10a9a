"""Find, within each segment, the first ATen node whose compiled value leaves the tolerance while its inputs were
within it.

The reference is the recorded ATen graph interpreted op by op on the inputs of the graph's last compiled call
(precision/reference.py; it covers a device program split off the CUDA graph's host work too). A segment is
checked by compiling it again with the implementation that ran it (the same kernel backend, options and
``chosen_by``, through ``lower_segment``; run by the graph's device runtime) on the reference values of its
inputs. When its outputs leave the tolerance, prefixes of it are compiled the same way, each returning every
value that leaves the prefix, and bisection finds the shortest prefix with a value out of tolerance: the prefix
one unit shorter was within it everywhere, so the node the longer one adds read inputs within tolerance.
A fused kernel's divergence is found too, since a prefix is fused as the segment is.

Invariants: the recorded inputs and reference values are never written (each run gets copies); a prefix of a
segment that static kernels ran is compiled by the segment's fallback, and a tuned prefix without its frozen
weights (both are keyed by the whole segment); a bisection assumes that a divergence, once there, stays visible
in some value leaving each longer prefix.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any

import torch

from airgraph.graph.analysis import target_name, written_inputs
from airgraph.graph.program import Segment
from airgraph.lowering.lower import lower_segment
from airgraph.lowering.partition import subgraph
from airgraph.lowering.select import GraphRequest, Impl
from airgraph.precision.record import RecordedGraph, copy_value
from airgraph.precision.reference import reference_values
from airgraph.precision.source import module_path, node_source
from airgraph.precision.tolerance import TensorDiff, diff, tolerance_for
from airgraph.runtime.device import DeviceRuntime, runtime_for

__all__ = ["Checked", "Divergence", "locate_graph"]


@dataclass(frozen=True)
class Checked:
    """One value compared while locating: the node, its difference, and both tensors (for dumps)."""

    node: torch.fx.Node
    diff: TensorDiff
    eager: torch.Tensor
    compiled: torch.Tensor


@dataclass(frozen=True)
class Divergence:
    """The first node of a segment whose compiled value left the tolerance while its inputs were within it."""

    graph: str
    segment: int
    backend: str
    chosen_by: str
    bank_source: dict[str, Any]
    node: str
    op: str
    module: str | None
    source: str | None
    code: str
    diff: TensorDiff
    checked: tuple[Checked, ...]  # every value leaving the located prefix

    @property
    def max_abs(self) -> float:
        return self.diff.max_abs

    @property
    def max_rel(self) -> float:
        return self.diff.max_rel

    @property
    def tolerance(self) -> Any:
        return self.diff.tolerance


def locate_graph(
    graph: RecordedGraph, config: Any, rtol: float | None, atol: float | None, runtime: DeviceRuntime | None = None
) -> tuple[list, list]:
    """``(divergences, notes)``: one divergence per segment that leaves the tolerance, in execution order, and why
    a segment could not be checked. ``runtime``: the backend's override (the simulator), as it ran the graph."""
    compute = [seg for seg in graph.segments if not seg.sync and seg.gm is not None and seg.impl is not None]
    if graph.inputs is None or not compute:
        return [], []
    # The graph's own nodes come first (a host split's host pieces); a device program split off it owns the rest.
    owner = graph.segments[0].nodes[0].graph.owning_module
    if len(owner.graph.find_nodes(op="placeholder")) != len(graph.inputs):
        return [], [f"{graph.name}: its inputs are not its first segment's graph's; segments not checked"]
    programs = [m for m in dict.fromkeys(seg.nodes[0].graph.owning_module for seg in compute) if m is not owner]
    device = torch.device(graph.report.device)
    runtime = runtime_for(device, runtime)
    with torch.no_grad():
        reference = reference_values(owner, programs, graph.inputs, runtime)
        request = GraphRequest(graph.report.kind, device, config)
        locator = _Locator(graph, reference, request, runtime, rtol, atol)
        found, notes = [], []
        for seg in compute:
            if any(node not in reference for node in [*seg.inputs, *seg.nodes]):
                notes.append(f"{graph.name} segment {seg.id}: not in the interpreted graph; not checked")
                continue
            divergence = locator.segment(seg)
            if divergence is not None:
                found.append(divergence)
    return found, notes


@dataclass
class _Locator:
    graph: RecordedGraph
    reference: dict[torch.fx.Node, Any]
    request: GraphRequest
    runtime: DeviceRuntime
    rtol: float | None
    atol: float | None

    def segment(self, seg: Segment) -> Divergence | None:
        units = _units(seg.nodes)
        checked = self._check(seg, units, len(units), seg.impl)
        if all(c.diff.ok for c in checked):
            return None
        lo, hi = 0, len(units)  # the prefix of lo units is within the tolerance, that of hi units is not
        partial = _partial(seg.impl)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            result = self._check(seg, units, mid, partial)
            if all(c.diff.ok for c in result):
                lo = mid
            else:
                hi, checked = mid, result
        added = set(units[hi - 1])
        bad = [c for c in checked if not c.diff.ok]
        first = next((c for c in bad if c.node in added), bad[0])
        node = first.node
        source, code = node_source(node)
        impl = seg.impl
        return Divergence(
            graph=self.graph.name,
            segment=seg.id,
            backend=impl.backend,
            chosen_by=impl.chosen_by,
            bank_source=dict(impl.source),
            node=node.name,
            op=target_name(node),
            module=module_path(node),
            source=source,
            code=code,
            diff=first.diff,
            checked=tuple(checked),
        )

    def _check(self, seg: Segment, units: list[list[torch.fx.Node]], count: int, impl: Impl) -> list[Checked]:
        """Compile the first ``count`` units of ``seg`` with ``impl``, run them on reference inputs, compare."""
        nodes = [node for unit in units[:count] for node in unit]
        whole = count == len(units)
        members = set(nodes)
        if whole:
            inputs, outputs = list(seg.inputs), list(seg.outputs)
        else:
            inputs = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in members))
            outputs = [n for n in nodes if any(user not in members for user in n.users)]
        owner = nodes[0].graph.owning_module
        gm = subgraph(owner, inputs, nodes, outputs, f"Compare{seg.id}")
        piece = Segment(seg.id, seg.placement, seg.stream, nodes, inputs, outputs, gm=gm)
        piece.written = written_inputs(nodes, inputs)
        compiled = self.runtime.wrap_segment(piece, lower_segment(piece, impl, self.request))
        results = compiled([copy_value(self.reference[n]) for n in inputs])
        checked = []
        for node, value in zip(outputs, results, strict=True):
            expected = self.reference[node]
            if not isinstance(expected, torch.Tensor) or not isinstance(value, torch.Tensor):
                continue
            tolerance = tolerance_for(expected.dtype, self.rtol, self.atol)
            checked.append(Checked(node, diff(node.name, "node", expected, value, tolerance), expected, value))
        return checked


def _units(nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """The segment's nodes, each op with the getitems that unpack its outputs (a prefix never splits them)."""
    units: list[list[torch.fx.Node]] = []
    index: dict[torch.fx.Node, int] = {}
    for node in nodes:
        source = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(source, torch.fx.Node) and source in index:
            units[index[source]].append(node)
            continue
        index[node] = len(units)
        units.append([node])
    return units


def _partial(impl: Impl) -> Impl:
    """What compiles part of a segment the way ``impl`` compiles all of it (see the module docstring)."""
    if impl.backend == "static_kernels" and isinstance(impl.options.get("fallback"), Impl):
        fallback = impl.options["fallback"]
        return dataclasses.replace(fallback, chosen_by=impl.chosen_by, source=impl.source)
    if "frozen" in impl.options:
        return dataclasses.replace(impl, options={k: v for k, v in impl.options.items() if k != "frozen"})
    return impl
