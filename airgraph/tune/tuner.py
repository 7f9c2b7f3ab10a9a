"""The tuner: a compiled graph's first run measures its units, records the winners in the bank, and the graph runs
tuned from then on.

With ``config.tuning.mode`` set, the backend hands each inference or forward graph it compiles to
:meth:`Tuner.wrap` (the graph's real inputs only exist once it runs: while it compiles, its tensors are fake).
The first call then:

1. runs the graph's segments one by one in order (no side streams: the same results), keeping each segment's
   real inputs (inputs it writes in place copied first), and returns that call's outputs;
2. tunes each compute segment the seam let the config or the bank decide (not host, debug or static-kernel
   segments): its *units* (the segment itself in subgraph mode; its tunable operators in operator mode,
   tune/operators.py, with their real values from running the segment's graph) are looked up in the bank (hit:
   nothing measured, unless ``repeat``), else their candidates (tune/candidates.py) are compiled, checked against
   the default's outputs and timed side by side (tune/measure.py), within ``config.tuning.budget_s`` each;
3. lowers the segments whose units found a faster choice with those choices (what a later compile gets from the
   bank: ``chosen_by "tuning"``) and times the whole graph before and after, side by side: unless the tuned graph's
   median is lower (and its rounds not measurably slower), the choices are dropped ("unsatisfied": a choice that
   won alone but not in its graph, e.g. one that costs a fusion) and the graph keeps running as it was;
4. commits each unit to the bank under its lock (tune/bank.py: add, update, reserved, unsatisfied) and writes the
   seed-format report (tune/report.py) after every unit.

Backward graphs are not tuned (their donated inputs would be overwritten by repeated runs).
"""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.config import CompilerConfig
from airgraph.graph.analysis import mutated_nodes
from airgraph.graph.meta import HOST
from airgraph.graph.program import Segment
from airgraph.lowering import backends
from airgraph.lowering.aten import compile_aten
from airgraph.lowering.keys import shape_key
from airgraph.lowering.layouts import Layouts
from airgraph.lowering.request import LowerRequest
from airgraph.lowering.select import GraphRequest, Impl
from airgraph.report.schema import GraphReport
from airgraph.runtime.executor import build_executor
from airgraph.tune.bank import TUNED, UNSATISFIED, Bank, BankFile, Entry
from airgraph.tune.candidates import VERSIONS, op_candidates, subgraph_candidates
from airgraph.tune.lowering import compiling
from airgraph.tune.measure import Budget, Timing, beats, check, fresh_inputs, reference_outputs, time_side_by_side
from airgraph.tune.operators import OpUnit, apply_op_choices, find_units, op_graph
from airgraph.tune.params import freezable_positions, segment_frozen
from airgraph.tune.report import FAILED, SUCCESSFUL, Outcome, TuneReport, TuneTask
from airgraph.tune.source import bank_file, impl_for, op_key, segment_key

__all__ = ["TunedGraph", "Tuner"]

Progress = Callable[..., None]  # progress(event, **info): "unit" (name, candidates), "candidate" (name)


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
class _Tentative:
    """A unit measured: its best choice (None: the default stays) before it is committed."""

    segment: Segment
    outcome: Outcome
    base: str
    choice: dict[str, Any] | None
    spread: float
    impl: Impl | None = None  # subgraph mode: the winner's Impl and compiled callable
    compiled: Any = None
    node: str = ""  # operator mode: the node's name in the segment's graph


class Tuner:
    """Tunes graphs on their first run into the bank of ``config.tuning`` (see the module docstring)."""

    def __init__(self, config: CompilerConfig, *, name: str = "airgraph", progress: Progress | None = None) -> None:
        if config.tuning.mode is None:
            raise ValueError("config.tuning.mode is None: set 'op' or 'subgraph' to tune")
        self.config, self.mode, self.name, self.progress = config, config.tuning.mode, name, progress
        self.bank = Bank(config.tuning.resolved_bank_dir())
        self.report = TuneReport(self.mode, config.tuning.work_path)
        self.report.bank_dir = str(self.bank.folder)

    def wrap(
        self,
        run: Callable[[list], Any],
        gm: torch.fx.GraphModule,
        segments: list[Segment],
        request: GraphRequest,
        layouts: Layouts | None,
        report: GraphReport,
        runtime: Any,
    ) -> Callable[[list], Any]:
        """``run``, the executor of ``gm`` lowered as ``segments``, tuning on its first call. Call it while the
        graph compiles (its weights are known then). ``layouts``: the values' real layouts (None: the traced ones)."""
        if request.kind == "backward":
            return run
        placeholders = gm.graph.find_nodes(op="placeholder")
        if layouts is None:
            layouts = Layouts(placeholders, [p.meta.get("val") for p in placeholders])
        mutated = mutated_nodes(gm.graph)
        graph = TunedGraph(
            gm,
            segments,
            request,
            layouts,
            report,
            runtime,
            rebuild=lambda: build_executor(
                gm, segments, request.device, runtime=runtime, priorities=report.stream_priorities
            ),
            freezable=freezable_positions(request.kind),
            mutated={i for i, p in enumerate(placeholders) if p in mutated},
        )
        return _FirstRun(self, run, graph)

    def _emit(self, event: str, **info: Any) -> None:
        if self.progress is not None:
            self.progress(event, **info)

    # -- one graph ---------------------------------------------------------------------------------------
    def tune(self, graph: TunedGraph, values: list[Any], recorded: dict[int, list[Any]], run: Callable) -> Callable:
        """Tune ``graph`` (its real inputs ``values``, each segment's real inputs ``recorded``); returns the
        executor to run from now on."""
        task = self.report.new_task(f"{self.name} graph {graph.report.id} ({graph.request.kind})")
        start = time.perf_counter()
        file, digest = bank_file(self.bank, graph.request.device)
        stale = self.bank.stale_bases(file, VERSIONS) if self.bank.folder.is_dir() else set()
        tentative: list[_Tentative] = []
        measured: dict[str, _Tentative] = {}  # operator key -> its measurement (equal operators are measured once)
        try:
            for seg in graph.segments:
                if not _tunable(seg):
                    continue
                if self.mode == "subgraph":
                    found = self._segment(graph, seg, recorded[seg.id], task, file, digest, stale)
                    tentative += [found] if found is not None else []
                else:
                    tentative += self._operators(graph, seg, recorded[seg.id], task, file, digest, stale, measured)
            run = self._apply(graph, values, recorded, tentative, task, run)
            for item in tentative:
                self._commit(item, file, task)
            task.status = FAILED if any(o.status == "failed" for o in task.outcomes) else SUCCESSFUL
        except Exception as exc:
            task.status, task.failed_section = FAILED, True
            warnings.warn(
                f"airgraph: tuning {task.name} failed ({type(exc).__name__}: {exc}); it runs untuned", stacklevel=3
            )
        task.seconds = time.perf_counter() - start
        self.report.write()
        return run

    def _segment(
        self, graph: TunedGraph, seg: Segment, inputs: list[Any], task: TuneTask, file: BankFile, digest: str, stale
    ) -> _Tentative | None:
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
        timings = time_side_by_side(
            {"default": default_fn, **{n: f for n, (f, _, _) in fns.items()}},
            inputs,
            graph.runtime,
            written=seg.written,
        )
        best = _best(timings, {n: c for n, (_, c, _) in fns.items()})
        item = _Tentative(seg, outcome, base, best[1] if best else None, _spread(timings, best))
        outcome.before_us = timings["default"].median * 1e6
        outcome.after_us = timings[best[0]].median * 1e6 if best else outcome.before_us
        outcome.measured = {name: t.median * 1e6 for name, t in timings.items()}
        outcome.seconds = time.perf_counter() - start
        if best is not None:
            item.compiled, _, item.impl = fns[best[0]]
            item.impl = Impl(item.impl.backend, "tuning", item.impl.options, {"bank key": key})
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
        measured: dict[str, _Tentative],
    ) -> list[_Tentative]:
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
            item = _Tentative(seg, outcome, keys[0], None, 0.0, node=unit.node.name)
            if keys[1] in measured:  # the same operator at the same shapes, measured a moment ago
                first = measured[keys[1]]
                item.choice, item.spread = first.choice, first.spread
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
        self, graph: TunedGraph, unit: OpUnit, op_gm: torch.fx.GraphModule, op_inputs: list, item: _Tentative, task
    ) -> None:
        """Measure one operator's candidates against the node as the graph runs it (lowered alone by its segment's
        kernel backend: Inductor may not call ATen for it), on its real inputs; sets ``item``. The candidates run
        as direct ATen calls: each is one call (a prepared-weight GEMM, a kernel), or a few ATen ops that a fusing
        backend could only make faster (the whole graph's check keeps what does not pay off in it)."""
        outcome, start = item.outcome, time.perf_counter()
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
        timings = time_side_by_side(
            {"default": default_fn, **{n: f for n, (f, _) in fns.items()}}, op_inputs, graph.runtime
        )
        best = _best(timings, {n: c for n, (_, c) in fns.items()})
        item.choice, item.spread = (best[1] if best else None), _spread(timings, best)
        outcome.before_us = timings["default"].median * 1e6
        outcome.after_us = timings[best[0]].median * 1e6 if best else outcome.before_us
        outcome.measured = {name: t.median * 1e6 for name, t in timings.items()}
        outcome.seconds = time.perf_counter() - start

    # -- shared steps ------------------------------------------------------------------------------------
    def _found(self, entry: Entry | None, outcome: Outcome, task: TuneTask, stale: bool) -> bool:
        """Count a unit the bank already answers (no measuring unless ``repeat``); True when it is done."""
        if entry is None:
            task.stale += stale
            return False
        if self.config.tuning.repeat:
            return False
        outcome.status = "hit" if entry.status == TUNED else "unsatisfied"
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

    def _apply(
        self,
        graph: TunedGraph,
        values: list,
        recorded: dict[int, list[Any]],
        tentative: list[_Tentative],
        task: TuneTask,
        run: Callable,
    ) -> Callable:
        """Lower the segments with their units' choices and keep them if the whole graph got faster."""
        saved = {seg.id: (seg.impl, seg.compiled) for seg in graph.segments}
        changed = self._lower_choices(graph, recorded, tentative)
        new_run = graph.rebuild() if changed else run
        runs = {"before": run, "after": new_run} if changed else {"before": run}
        timings = time_side_by_side(runs, values, graph.runtime, written=graph.mutated)
        task.model_before_ms = timings["before"].median * 1e3
        task.model_after_ms = timings["after" if changed else "before"].median * 1e3
        before, after = timings["before"], timings["after" if changed else "before"]
        if changed and not (after.median < before.median and not beats(before, after)):
            slower = beats(before, after)
            for seg in graph.segments:
                seg.impl, seg.compiled = saved[seg.id]
            for item in tentative:
                if item.choice is not None:
                    item.choice, item.outcome.note = None, "no gain in the whole graph" if slower else "within noise"
                    item.outcome.after_us = item.outcome.before_us
            task.model_after_ms = task.model_before_ms
            return run
        for seg in changed:
            _report_segment(graph.report, seg)
        return new_run

    def _lower_choices(
        self, graph: TunedGraph, recorded: dict[int, list[Any]], tentative: list[_Tentative]
    ) -> list[Segment]:
        """Set the winners on their segments (subgraph mode: already compiled; operator mode: the segment is
        lowered again with its nodes' choices and checked against its default outputs). Returns the segments
        changed."""
        changed = []
        if self.mode == "subgraph":
            for item in tentative:
                if item.choice is not None:
                    item.segment.impl, item.segment.compiled = item.impl, item.compiled
                    changed.append(item.segment)
            return changed
        by_segment: dict[int, list[_Tentative]] = {}
        for item in tentative:
            if item.choice is not None:
                by_segment.setdefault(item.segment.id, []).append(item)
        for items in by_segment.values():
            seg = items[0].segment
            current = seg.impl
            choices = {**current.options.get("op_choices", {})}
            choices.update({item.node: item.choice for item in items})
            keys = ", ".join(item.outcome.key for item in items)
            impl = Impl(current.backend, "tuning", {**current.options, "op_choices": choices}, {"bank key": keys})
            try:
                compiled = self._compile(graph, seg, impl)
                inputs = recorded[seg.id]
                reason = check(compiled, inputs, seg.written, reference_outputs(seg.compiled, inputs, seg.written))
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                for item in items:
                    item.choice, item.outcome.note = None, f"the segment lowered with it failed its check: {reason}"
                continue
            seg.impl, seg.compiled = impl, compiled
            changed.append(seg)
        return changed

    def _commit(self, item: _Tentative, file: BankFile, task: TuneTask) -> None:
        outcome, choice = item.outcome, item.choice
        entry = Entry(
            key=outcome.key,
            kind=self.mode,
            status=TUNED if choice is not None else UNSATISFIED,
            base=item.base,
            name=outcome.name,
            op_type=outcome.op_type,
            candidates=VERSIONS[self.mode],
            choice=choice,
            before_us=outcome.before_us,
            after_us=outcome.after_us,
            spread=item.spread,
            time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        outcome.status = file.commit(entry)
        if choice is not None:
            outcome.choice, outcome.tune_mode = choice["name"], choice["tune_mode"]
        task.outcomes.append(outcome)
        self.report.write()


class _FirstRun:
    """A boxed callable: the graph's executor, tuning on its first call (see the module docstring)."""

    def __init__(self, tuner: Tuner, run: Callable[[list], Any], graph: TunedGraph) -> None:
        self._boxed_call = True
        self._tuner, self._run, self._graph = tuner, run, graph
        self._tuned = False

    def __call__(self, args: list) -> Any:
        if self._tuned:
            return self._run(args)
        self._tuned = True
        values = list(args)
        args.clear()
        outputs, recorded = _run_sequentially(self._graph, values)
        self._run = self._tuner.tune(self._graph, values, recorded, self._run)
        return outputs


def _run_sequentially(graph: TunedGraph, values: list[Any]) -> tuple[list[Any], dict[int, list[Any]]]:
    """Run the compute segments in order, keeping each one's real inputs (copies of those it writes)."""
    env: dict[torch.fx.Node, Any] = dict(zip(graph.gm.graph.find_nodes(op="placeholder"), values, strict=True))
    recorded: dict[int, list[Any]] = {}
    for seg in graph.segments:
        if seg.sync:
            continue
        inputs = [env[n] for n in seg.inputs]
        recorded[seg.id] = fresh_inputs(inputs, seg.written)
        env.update(zip(seg.outputs, seg.compiled(list(inputs)), strict=True))
    outputs = graph.gm.graph.find_nodes(op="output")[0].args[0]
    return [env[o] if isinstance(o, torch.fx.Node) else o for o in outputs], recorded


def _device_of(values: list[Any]) -> torch.device:
    return next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))


def _tunable(seg: Segment) -> bool:
    chosen_by = seg.impl.chosen_by if seg.impl is not None else None
    return not seg.sync and seg.placement != HOST and seg.gm is not None and chosen_by in ("config", "tuning")


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


def _best(timings: dict[str, Timing], candidates: dict[str, dict]) -> tuple[str, dict] | None:
    """The fastest candidate that beats the default (measure.beats), or None."""
    winners = [name for name in candidates if beats(timings[name], timings["default"])]
    if not winners:
        return None
    name = min(winners, key=lambda n: timings[n].median)
    return name, candidates[name]


def _spread(timings: dict[str, Timing], best: tuple[str, dict] | None) -> float:
    spreads = [timings["default"].spread] + ([timings[best[0]].spread] if best else [])
    return max(spreads)


def _report_segment(report: GraphReport, seg: Segment) -> None:
    for row in report.segments:
        if row.id == seg.id:
            row.backend, row.chosen_by, row.source = seg.backend, seg.impl.chosen_by, dict(seg.impl.source)
