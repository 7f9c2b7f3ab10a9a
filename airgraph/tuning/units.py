"""Measuring a graph's units for the tuner (tuner.py): a segment (subgraph mode) or its tunable operators (op mode),
each first looked up in the bank, then its candidates compiled, checked against the default's outputs and timed
side by side (measure.py) within its budget. The result of each is a :class:`Tentative` choice, which the tuner
applies, checks in the whole graph and commits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from airgraph.graph.program import Segment
from airgraph.lowering import backends
from airgraph.lowering.aten import compile_aten
from airgraph.lowering.keys import shape_key
from airgraph.lowering.layouts import Layouts
from airgraph.lowering.request import LowerRequest
from airgraph.lowering.select import GraphRequest, Impl
from airgraph.report.schema import GraphReport
from airgraph.tuning.bank import TUNED, BankFile, Entry
from airgraph.tuning.candidates import op_candidates, subgraph_candidates
from airgraph.tuning.lowering import compiling
from airgraph.tuning.measure import NOISY, Budget, Decision, check, decide, fresh_inputs, reference_outputs
from airgraph.tuning.operators import OpUnit, apply_op_choices, find_units, op_graph
from airgraph.tuning.params import segment_frozen
from airgraph.tuning.report import Outcome, TuneTask
from airgraph.tuning.source import impl_for, op_key, segment_key

if TYPE_CHECKING:
    from airgraph.config import CompilerConfig
    from airgraph.tuning.report import TuneReport

__all__ = ["Tentative", "TunedGraph", "UnitMeasuring"]


@dataclass
class TunedGraph:
    """What the tuner needs of a compiled graph (given by the backend while it compiles)."""

    gm: torch.fx.GraphModule
    segments: list[Segment]
    request: GraphRequest
    layouts: Layouts
    report: GraphReport
    runtime: Any  # the DeviceRuntime measuring it
    rebuild: Callable[[], Callable[[list], Any]]  # a new executor over the segments as they are now
    freezable: set[int] = field(default_factory=set)  # graph input positions that are frozen-able weights
    mutated: set[int] = field(default_factory=set)  # graph input positions the graph writes


@dataclass
class Tentative:
    """A unit measured: its best choice (None: the default stays) before it is committed."""

    segment: Segment
    outcome: Outcome
    base: str
    choice: dict[str, Any] | None
    spread: float
    impl: Impl | None = None  # subgraph mode: the winner's Impl and compiled callable
    compiled: Any = None
    node: str = ""  # operator mode: the node's name in the segment's graph
    conclusive: bool = True  # False: no winner, and too noisy to record that the default won (measure.decide)
    same_as: Tentative | None = None  # operator mode: an equal operator measured in this run, counted as it is


class UnitMeasuring:
    """The tuner's unit measuring steps (a mixin of :class:`airgraph.tuning.tuner.Tuner`)."""

    config: CompilerConfig
    mode: str
    report: TuneReport

    def _emit(self, event: str, **info: Any) -> None:
        raise NotImplementedError

    def _segment(
        self, graph: TunedGraph, seg: Segment, inputs: list[Any], task: TuneTask, file: BankFile, digest: str, stale
    ) -> Tentative | None:
        keys = segment_key(seg, digest)
        if keys is None:
            task.dynamic += 1
            return None
        base, key = keys
        outcome = Outcome(f"graph {graph.report.id} segment {seg.id}", "segment", key, "")
        if self._found(file.lookup(key), outcome, task, base in stale):
            return None
        request, config, start = graph.request, self.config, time.perf_counter()
        default_impl = Impl(config.kernel_backend, "config")
        default_fn = seg.compiled if seg.impl == default_impl else self._compile(graph, seg, default_impl)
        reference = reference_outputs(default_fn, inputs, seg.written)
        frozen = segment_frozen(seg, graph.freezable)
        inference = request.kind == "inference"
        candidates = subgraph_candidates(
            request.device, config.kernel_backend, inference=inference, freezable=bool(frozen)
        )
        fns: dict[str, tuple[Any, dict, Impl]] = {}
        budget = Budget(config.tuning.subgraph_budget_s)
        self._emit("unit", name=outcome.name, candidates=len(candidates))
        for cand in candidates:
            impl = impl_for(cand, key, frozen)
            if impl is not None:
                fn = self._try(task, outcome.name, cand, budget, lambda i=impl: self._compile(graph, seg, i))
                if fn is not None and self._checked(task, outcome.name, cand, fn, inputs, seg.written, reference):
                    fns[cand["name"]] = (fn, cand, impl)
            self._emit("candidate", name=cand["name"])
        timed = {"default": default_fn, **{n: f for n, (f, _, _) in fns.items()}}
        decision = decide(timed, inputs, graph.runtime, written=seg.written)
        item = Tentative(seg, outcome, base, None, 0.0)
        _settle(item, decision, {n: c for n, (_, c, _) in fns.items()}, start)
        if decision.winner is not None:
            item.compiled, _, item.impl = fns[decision.winner]  # impl_for made it: chosen by tuning, with its bank key
        return item

    def _operators(
        self,
        graph: TunedGraph,
        seg: Segment,
        inputs: list[Any],
        task: TuneTask,
        file: BankFile,
        digest: str,
        stale: set[str],
        measured: dict[str, Tentative],
    ) -> list[Tentative]:
        units = [u for u in find_units(seg.gm) if u.matches(self.config.tuning.ops)]
        if not units:
            return []
        values = _node_values(seg.gm, fresh_inputs(inputs, seg.written), {n for u in units for n in u.inputs})
        found = []
        for unit in units:
            op_gm = op_graph(unit)
            keys = op_key(op_gm, [n.meta.get("val") for n in unit.inputs], digest)
            if keys is None:
                task.dynamic += 1
                continue
            outcome = Outcome(unit.name, unit.op_type, keys[1], "")
            if self._found(file.lookup(keys[1]), outcome, task, keys[0] in stale):
                continue
            item = Tentative(seg, outcome, keys[0], None, 0.0, node=unit.node.name)
            if keys[1] in measured:  # the same operator at the same shapes, measured a moment ago
                first = measured[keys[1]]
                item.choice, item.spread, item.conclusive = first.choice, first.spread, first.conclusive
                item.same_as = first
                outcome.before_us, outcome.after_us = first.outcome.before_us, first.outcome.after_us
                outcome.note = f"as {first.outcome.name}"
                found.append(item)
                continue
            try:
                self._measure_operator(graph, unit, op_gm, [values[n] for n in unit.inputs], item, task)
                measured[keys[1]] = item
                found.append(item)
            except Exception as exc:
                outcome.status, outcome.note = "failed", f"{type(exc).__name__}: {exc}"
                task.outcomes.append(outcome)
                self.report.write()
        return found

    def _measure_operator(
        self, graph: TunedGraph, unit: OpUnit, op_gm: torch.fx.GraphModule, op_inputs: list, item: Tentative, task
    ) -> None:
        """Measure one operator's candidates against the node as the graph runs it (lowered alone by its segment's
        kernel backend: Inductor may not call ATen for it), on its real inputs; sets ``item``. The candidates run
        as direct ATen calls: each is one call (a prepared-weight GEMM, a kernel), or a few ATen ops that a fusing
        backend could only make faster (the whole graph's check keeps what does not pay off in it)."""
        start = time.perf_counter()
        default_fn = self._lower_alone(item.segment, op_gm)
        reference = reference_outputs(default_fn, op_inputs, ())
        candidates = op_candidates(unit, graph.request.device, graph.request.kind == "inference")
        fns: dict[str, tuple[Any, dict]] = {}
        budget = Budget(self.config.tuning.budget_s)
        self._emit("unit", name=unit.name, candidates=len(candidates))
        for cand in candidates:
            compile_one = lambda c=cand: compile_aten(apply_op_choices(op_gm, {unit.node.name: c}))  # noqa: E731
            fn = self._try(task, unit.name, cand, budget, compile_one)
            if fn is not None and self._checked(task, unit.name, cand, fn, op_inputs, (), reference, strides=False):
                fns[cand["name"]] = (fn, cand)
            self._emit("candidate", name=cand["name"])
        decision = decide({"default": default_fn, **{n: f for n, (f, _) in fns.items()}}, op_inputs, graph.runtime)
        _settle(item, decision, {n: c for n, (_, c) in fns.items()}, start)

    # -- shared steps ------------------------------------------------------------------------------------
    def _found(self, entry: Entry | None, outcome: Outcome, task: TuneTask, stale: bool) -> bool:
        """Count a unit the bank already answers (no measuring unless ``repeat``); True when it is done."""
        if entry is None:
            task.stale += stale
            return False
        if self.config.tuning.repeat:
            return False
        outcome.status = "hit"  # in the bank, and left as it is (the seed's hit, and reserved)
        outcome.note = "in the bank" if entry.status == TUNED else "measured before: nothing beat the default"
        if entry.choice is not None:
            outcome.choice, outcome.tune_mode = entry.choice["name"], entry.choice["tune_mode"]
        outcome.before_us, outcome.after_us = entry.before_us, entry.after_us
        task.outcomes.append(outcome)
        self.report.write()
        return True

    def _try(self, task: TuneTask, unit: str, cand: dict, budget: Budget, compile_fn: Callable[[], Any]) -> Any:
        if not budget.allows(expensive=cand["options"].get("impl") == "template"):
            task.dropped.append((unit, cand["name"], "time budget spent"))
            return None
        try:
            return compile_fn()
        except Exception as exc:
            task.dropped.append((unit, cand["name"], f"failed to compile: {type(exc).__name__}: {str(exc)[:160]}"))
            return None

    def _checked(
        self, task: TuneTask, unit: str, cand: dict, fn: Any, inputs: list, written, reference, strides: bool = True
    ) -> bool:
        reason = check(fn, inputs, written, reference, strides=strides)
        if reason is not None:
            task.dropped.append((unit, cand["name"], reason))
        return reason is None

    def _lower_alone(self, seg: Segment, op_gm: torch.fx.GraphModule) -> Callable[[list], Any]:
        """``op_gm`` lowered as the segment holding it lowers its nodes (its kernel backend and Inductor options)."""
        impl = seg.impl
        if impl.backend != "inductor":
            return compile_aten(op_gm)
        options = {k: v for k, v in impl.options.items() if k in ("inductor_config", "cpp_wrapper")}
        inputs = [n.meta.get("val") for n in op_gm.graph.find_nodes(op="placeholder")]
        request = LowerRequest(
            gm=op_gm,
            example_inputs=inputs,
            kind="inference",
            device=_device_of(inputs),
            config=self.config,
            shape_key=shape_key(inputs),
            options=options,
        )
        with compiling(inputs):
            return backends.get("inductor")(request)

    def _compile(self, graph: TunedGraph, seg: Segment, impl: Impl) -> Callable[[list], Any]:
        inputs = graph.layouts.inputs(seg.inputs)
        request = LowerRequest(
            gm=seg.gm,
            example_inputs=inputs,
            kind=graph.request.kind,
            device=graph.request.device,
            config=graph.request.config,
            shape_key=shape_key(inputs),
            options=impl.options,
        )
        with compiling(inputs):
            return backends.get(impl.backend)(request)


def _device_of(values: list[Any]) -> torch.device:
    return next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))


def _node_values(gm: torch.fx.GraphModule, inputs: list[Any], wanted: set[torch.fx.Node]) -> dict:
    """The real values of ``wanted`` nodes when ``gm`` runs on ``inputs`` (ATen ops, eagerly)."""
    values: dict[torch.fx.Node, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            value = super().run_node(node)
            if node in wanted:
                values[node] = value
            return value

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


def _settle(item: Tentative, decision: Decision, candidates: dict[str, dict], start: float) -> None:
    """Set a measured unit's choice, times and note from ``decision``."""
    outcome, timings = item.outcome, decision.timings
    item.choice = candidates[decision.winner] if decision.winner else None
    item.spread, item.conclusive = decision.spread, decision.conclusive
    outcome.before_us = timings["default"].median * 1e6
    outcome.after_us = timings[decision.winner or "default"].median * 1e6
    outcome.measured = {name: t.median * 1e6 for name, t in timings.items()}
    outcome.spreads = {name: t.spread for name, t in timings.items()}
    outcome.rounds = decision.rounds
    if not decision.conclusive:
        outcome.note = (
            f"inconclusive: run-to-run spread {decision.spread:.0%} after {decision.rounds} rounds (above "
            f"{NOISY:.0%}: is the machine busy?); nothing recorded, the next tuning run measures it again"
        )
    outcome.seconds = time.perf_counter() - start
