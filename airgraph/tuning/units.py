"""Measuring a graph's units for the tuner (tuner.py): a segment (subgraph mode) or its tunable operators (op mode).

Three steps per unit, so that only timing holds the device (tuning/turns.py):

- **look up** (:meth:`UnitMeasuring._look_up`): its key in the bank; a hit measures nothing, a miss is a
  :class:`Job` (an operator equal to one already a job of this graph is measured once, for both);
- **build** (:meth:`UnitMeasuring._build`): its candidates compiled and checked against the default's outputs
  within its time budget, on the real inputs the first run recorded: a :class:`Built`;
- **measure** (:meth:`UnitMeasuring._measure`): the default and the candidates timed side by side (measure.py)
  under the device's turn, and the result set on its :class:`Tentative`, which the tuner applies, checks in the
  whole graph and commits.
"""

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
from airgraph.tuning.measure import NOISY, Budget, Decision, check, decide, reference_outputs
from airgraph.tuning.operators import OpUnit, apply_op_choices, find_units, op_graph
from airgraph.tuning.params import segment_frozen
from airgraph.tuning.report import Outcome, TuneTask
from airgraph.tuning.source import impl_for, op_key, segment_key

if TYPE_CHECKING:
    from airgraph.config import CompilerConfig
    from airgraph.tuning.report import TuneReport
    from airgraph.tuning.turns import DeviceTurns

__all__ = ["Built", "Job", "Tentative", "TunedGraph", "UnitMeasuring"]


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
    clock: Any = None  # what its units and the whole graph are timed with (measure.DeviceClock); None: runtime

    @property
    def timer(self) -> Any:
        return self.clock if self.clock is not None else self.runtime


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


@dataclass
class Job:
    """A unit the bank did not answer: its candidates to build, then to measure."""

    item: Tentative
    unit: OpUnit | None = None  # operator mode: the operator, and its graph alone
    op_gm: torch.fx.GraphModule | None = None
    first: Job | None = None  # operator mode: an equal operator of this graph, measured in its stead


@dataclass
class Built:
    """A unit's candidates compiled and checked against the default: what its measurement times."""

    job: Job
    fns: dict[str, Callable[[list], Any]]  # "default", then each candidate that passed its check
    choices: dict[str, dict[str, Any]]  # candidate name -> its choice
    inputs: list[Any]
    written: frozenset[int] | set[int]
    seconds: float  # spent building
    impls: dict[str, Impl] = field(default_factory=dict)  # subgraph mode: each candidate's Impl


class UnitMeasuring:
    """The tuner's unit steps (a mixin of :class:`airgraph.tuning.tuner.Tuner`)."""

    config: CompilerConfig
    mode: str
    report: TuneReport
    turns: DeviceTurns

    def _emit(self, event: str, **info: Any) -> None:
        raise NotImplementedError

    # -- look up -------------------------------------------------------------------------------------------
    def _look_up(
        self,
        graph_id: int,
        device_type: str,
        seg: Segment,
        task: TuneTask,
        file: BankFile,
        digest: str,
        stale: set[str],
        seen: dict[str, Job],
    ) -> list[Job]:
        """The units of ``seg`` (of graph ``graph_id``, on ``device_type``) the bank does not answer (hits are
        counted on ``task``); ``seen``: operator key -> the job measuring it in this graph."""
        if self.mode == "subgraph":
            keys = segment_key(seg, digest, device_type)
            if keys is None:
                task.dynamic += 1
                return []
            outcome = Outcome(f"graph {graph_id} segment {seg.id}", "segment", keys[1], "")
            if self._found(file.lookup(keys[1]), outcome, task, keys[0] in stale):
                return []
            return [Job(Tentative(seg, outcome, keys[0], None, 0.0))]
        jobs = []
        for unit in find_units(seg.gm):
            if not unit.matches(self.config.tuning.ops):
                continue
            op_gm = op_graph(unit)
            keys = op_key(op_gm, [n.meta.get("val") for n in unit.inputs], digest, device_type)
            if keys is None:
                task.dynamic += 1
                continue
            outcome = Outcome(unit.name, unit.op_type, keys[1], "")
            if self._found(file.lookup(keys[1]), outcome, task, keys[0] in stale):
                continue
            job = Job(Tentative(seg, outcome, keys[0], None, 0.0, node=unit.node.name), unit, op_gm, seen.get(keys[1]))
            seen.setdefault(keys[1], job)
            jobs.append(job)
        return jobs

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
        return True

    # -- build ---------------------------------------------------------------------------------------------
    def _build(self, graph: TunedGraph, job: Job, inputs: list[Any], task: TuneTask) -> Built:
        """Compile and check ``job``'s candidates on ``inputs`` (its segment's real inputs; an operator's values)."""
        if job.unit is None:
            return self._build_segment(graph, job, inputs, task)
        return self._build_operator(graph, job, inputs, task)

    def _build_segment(self, graph: TunedGraph, job: Job, inputs: list[Any], task: TuneTask) -> Built:
        seg, outcome, start = job.item.segment, job.item.outcome, time.perf_counter()
        config = self.config
        default_impl = Impl(config.kernel_backend, "config")
        default_fn = seg.compiled if seg.impl == default_impl else self._compile(graph, seg, default_impl)
        reference = reference_outputs(default_fn, inputs, seg.written)
        frozen = segment_frozen(seg, graph.freezable)
        inference = graph.request.kind == "inference"
        candidates = subgraph_candidates(
            graph.request.device, config.kernel_backend, inference=inference, freezable=bool(frozen)
        )
        built = Built(job, {"default": default_fn}, {}, inputs, seg.written, 0.0)
        budget = Budget(config.tuning.subgraph_budget_s)
        self._emit("unit", name=outcome.name, candidates=len(candidates))
        for cand in candidates:
            impl = impl_for(cand, outcome.key, frozen)
            if impl is not None:
                fn = self._try(task, outcome.name, cand, budget, lambda i=impl: self._compile(graph, seg, i))
                if fn is not None and self._checked(task, outcome.name, cand, fn, inputs, seg.written, reference):
                    built.fns[cand["name"]], built.choices[cand["name"]] = fn, cand
                    built.impls[cand["name"]] = impl  # impl_for made it: chosen by tuning, with its bank key
            self._emit("candidate", name=cand["name"])
        built.seconds = time.perf_counter() - start
        return built

    def _build_operator(self, graph: TunedGraph, job: Job, op_inputs: list[Any], task: TuneTask) -> Built:
        """The node as the graph runs it (lowered alone by its segment's kernel backend: Inductor may not call
        ATen for it) against its candidates, on its real inputs. The candidates run as direct ATen calls: each is
        one call (a prepared-weight GEMM, a kernel), or a few ATen ops that a fusing backend could only make faster
        (the whole graph's check keeps what does not pay off in it)."""
        unit, op_gm, start = job.unit, job.op_gm, time.perf_counter()
        assert unit is not None and op_gm is not None
        default_fn = self._lower_alone(job.item.segment, op_gm)
        reference = reference_outputs(default_fn, op_inputs, ())
        candidates = op_candidates(unit, graph.request.device, graph.request.kind == "inference")
        built = Built(job, {"default": default_fn}, {}, op_inputs, frozenset(), 0.0)
        budget = Budget(self.config.tuning.budget_s)
        self._emit("unit", name=unit.name, candidates=len(candidates))
        for cand in candidates:
            compile_one = lambda c=cand: compile_aten(apply_op_choices(op_gm, {unit.node.name: c}))  # noqa: E731
            fn = self._try(task, unit.name, cand, budget, compile_one)
            if fn is not None and self._checked(task, unit.name, cand, fn, op_inputs, (), reference, strides=False):
                built.fns[cand["name"]], built.choices[cand["name"]] = fn, cand
            self._emit("candidate", name=cand["name"])
        built.seconds = time.perf_counter() - start
        return built

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

    # -- measure -------------------------------------------------------------------------------------------
    def _measure(self, graph: TunedGraph, built: Built) -> None:
        """Time ``built``'s default and candidates side by side, holding the device's turn; set its choice."""
        with self.turns.turn(graph.request.device) as waited:
            start = time.perf_counter()
            decision = decide(built.fns, built.inputs, graph.timer, written=built.written)
        item = built.job.item
        item.outcome.waited_s += waited
        _settle(item, decision, built.choices, built.seconds + time.perf_counter() - start)
        if decision.winner is not None and built.impls:
            item.compiled, item.impl = built.fns[decision.winner], built.impls[decision.winner]


def _device_of(values: list[Any]) -> torch.device:
    return next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))


def node_values(gm: torch.fx.GraphModule, inputs: list[Any], wanted: set[torch.fx.Node]) -> dict:
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


def _settle(item: Tentative, decision: Decision, candidates: dict[str, dict], seconds: float) -> None:
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
    outcome.seconds = seconds
