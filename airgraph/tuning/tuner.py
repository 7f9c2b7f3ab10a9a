"""The tuner: a compiled graph's first run measures its units, records the winners in the bank, and the graph runs
tuned from then on.

With ``config.tuning.mode`` set, the backend hands each inference or forward graph it compiles to
:meth:`Tuner.wrap` (the graph's real inputs only exist once it runs: while it compiles, its tensors are fake).
The first call then:

1. runs the graph's segments one by one in order (no side streams: the same results), keeping each segment's
   real inputs (inputs it writes in place copied first), and returns that call's outputs;
2. tunes each compute segment the seam let the config or the bank decide (not host, debug or static-kernel
   segments): its *units* (the segment itself in subgraph mode; its tunable operators in operator mode,
   tuning/operators.py, with their real values from running the segment's graph) are looked up in the bank (hit:
   nothing measured, unless ``repeat``), else their candidates (tuning/candidates.py) are compiled, checked against
   the default's outputs and timed side by side (tuning/measure.py), within ``config.tuning.budget_s`` each;
3. lowers the segments whose units found a faster choice with those choices (what a later compile gets from the
   bank: ``chosen_by "tuning"``) and times the whole graph before and after, side by side: unless the tuned graph
   beats the untuned one as a candidate beats a default (tuning/measure.py), the choices are dropped
   ("unsatisfied": a choice that won alone but not in its graph, e.g. one that costs a fusion) and the graph keeps
   running as it was;
4. commits each unit to the bank under its lock (tuning/bank.py: add, update, reserved, unsatisfied) and writes the
   seed-format report (tuning/report.py) after every unit.

Backward graphs are not tuned (their donated inputs would be overwritten by repeated runs).
"""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from airgraph.boxed import boxed
from airgraph.config import CompilerConfig
from airgraph.graph.analysis import mutated_nodes
from airgraph.graph.meta import HOST
from airgraph.graph.program import Segment
from airgraph.lowering.layouts import Layouts
from airgraph.lowering.select import GraphRequest, Impl
from airgraph.report.schema import GraphReport
from airgraph.runtime.executor import build_executor
from airgraph.tuning.bank import TUNED, UNSATISFIED, Bank, BankFile, Entry
from airgraph.tuning.candidates import VERSIONS
from airgraph.tuning.measure import beats, check, decide, fresh_inputs, reference_outputs, time_side_by_side
from airgraph.tuning.params import freezable_positions
from airgraph.tuning.report import FAILED, SUCCESSFUL, TuneReport, TuneTask
from airgraph.tuning.source import bank_file
from airgraph.tuning.units import Tentative, TunedGraph, UnitMeasuring

__all__ = ["TunedGraph", "Tuner"]

Progress = Callable[..., None]  # progress(event, **info): "unit" (name, candidates), "candidate" (name)


class Tuner(UnitMeasuring):
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
        tentative: list[Tentative] = []
        measured: dict[str, Tentative] = {}  # operator key -> its measurement (equal operators are measured once)
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

    def _apply(
        self,
        graph: TunedGraph,
        values: list,
        recorded: dict[int, list[Any]],
        tentative: list[Tentative],
        task: TuneTask,
        run: Callable,
    ) -> Callable:
        """Lower the segments with their units' choices and keep them if the whole graph got measurably faster
        (measure.decide: by at least MIN_GAIN and beyond the run-to-run spread, as a gain within noise may be a
        loss in the next process)."""
        saved = {seg.id: (seg.impl, seg.compiled) for seg in graph.segments}
        changed = self._lower_choices(graph, recorded, tentative)
        if not changed:
            timings = time_side_by_side({"default": run}, values, graph.runtime, written=graph.mutated)
            task.model_before_ms = task.model_after_ms = timings["default"].median * 1e3
            return run
        new_run = graph.rebuild()
        decision = decide({"default": run, "tuned": new_run}, values, graph.runtime, written=graph.mutated)
        task.model_before_ms = decision.timings["default"].median * 1e3
        task.model_after_ms = decision.timings["tuned"].median * 1e3
        if decision.winner is None:
            slower = beats(decision.timings["default"], decision.timings["tuned"])
            note = "no gain in the whole graph" if slower else "no measurable gain in the whole graph"
            if not decision.conclusive:
                note += f" (inconclusive: spread {decision.spread:.0%} after {decision.rounds} rounds)"
            for seg in graph.segments:
                seg.impl, seg.compiled = saved[seg.id]
            for item in tentative:
                if item.choice is not None:
                    item.choice, item.outcome.note = None, note
                    item.outcome.after_us = item.outcome.before_us
                    item.conclusive = decision.conclusive
            task.model_after_ms = task.model_before_ms
            return run
        for seg in changed:
            _report_segment(graph.report, seg)
        return new_run

    def _lower_choices(
        self, graph: TunedGraph, recorded: dict[int, list[Any]], tentative: list[Tentative]
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
        by_segment: dict[int, list[Tentative]] = {}
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

    def _commit(self, item: Tentative, file: BankFile, task: TuneTask) -> None:
        outcome, choice = item.outcome, item.choice
        if item.same_as is not None:  # the same operator, measured and committed a moment ago: counted as it was
            outcome.status = item.same_as.outcome.status
            if choice is not None:
                outcome.choice, outcome.tune_mode = choice["name"], choice["tune_mode"]
            task.outcomes.append(outcome)
            self.report.write()
            return
        if choice is None and not item.conclusive:  # too noisy to say the default won: nothing recorded
            outcome.status = "unsatisfied"
            task.outcomes.append(outcome)
            self.report.write()
            return
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
        boxed(self)
        self._tuner, self._run, self._graph = tuner, run, graph
        self._tuned = False

    def __call__(self, args: list) -> Any:
        if self._tuned:
            return self._run(args)
        self._tuned = True
        values = list(args)
        args.clear()
        outputs, recorded = _run_sequentially(self._graph, values)
        # Measured as a later call runs: AOTAutograd runs a graph's first call under a Python dispatch mode of its
        # own (custom-op alias analysis, torch 2.11+), which costs every ATen op a Python round trip. Timed under
        # it, a graph of many ATen calls looked up to a third slower than it runs, and a fused candidate won by
        # that much in the report but not in the next process.
        with _disable_current_modes():
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


def _tunable(seg: Segment) -> bool:
    chosen_by = seg.impl.chosen_by if seg.impl is not None else None
    return not seg.sync and seg.placement != HOST and seg.gm is not None and chosen_by in ("config", "tuning")


def _report_segment(report: GraphReport, seg: Segment) -> None:
    for row in report.segments:
        if row.id == seg.id:
            row.backend, row.chosen_by, row.source = seg.backend, seg.impl.chosen_by, dict(seg.impl.source)
