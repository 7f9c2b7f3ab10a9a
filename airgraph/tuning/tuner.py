"""The tuner: a compiled graph's first run measures its units, records the winners in the bank, and the graph runs
tuned from then on.

With ``config.tuning.mode`` set, the backend hands each inference or forward graph it compiles to
:meth:`Tuner.wrap` (the graph's real inputs only exist once it runs: while it compiles, its tensors are fake).
The first call then:

1. looks up the *units* of each compute segment the seam let the config or the bank decide (not host, debug or
   static-kernel segments): the segment itself in subgraph mode, its tunable operators in operator mode
   (tuning/operators.py). A unit found in the bank is a hit: nothing is measured for it (unless ``repeat``). When
   every unit is a hit, the call runs as any later call runs: nothing is recorded, compiled or measured;
2. otherwise runs the graph's segments one by one in order (no side streams: the same results), keeping each
   segment's real inputs (inputs it writes in place copied first), and returns that call's outputs;
3. builds each missing unit's candidates (tuning/candidates.py: compiled and checked against the default's
   outputs, within ``config.tuning.budget_s`` each) and measures them side by side (tuning/measure.py) holding
   the device's turn (tuning/turns.py): while another process holds it, the next units are built meanwhile
   (on a CPU with no two cores to spare, building takes the turn too);
4. lowers the segments whose units found a faster choice with those choices and times the whole graph before and
   after, side by side: unless the tuned graph beats the untuned one as a candidate beats a default, the choices
   are dropped ("unsatisfied") and the graph keeps running as it was;
5. commits each unit to the bank under its lock (tuning/bank.py) and writes the seed-format report
   (tuning/report.py).

:meth:`Tuner.lowering_request`: ``airgraph.tune``'s compiled model only tunes, so a graph whose units are all in
the bank is lowered as a plain compile does. Backward graphs are not tuned (donated inputs: repeated runs).
"""

from __future__ import annotations

import dataclasses
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
from airgraph.lowering.select import GraphRequest, Impl, choose
from airgraph.report.schema import GraphReport
from airgraph.runtime.executor import build_executor
from airgraph.tuning.bank import TUNED, UNSATISFIED, Bank, BankFile, Entry
from airgraph.tuning.candidates import VERSIONS, version
from airgraph.tuning.measure import (
    DeviceClock,
    beats,
    check,
    decide,
    fresh_inputs,
    reference_outputs,
    time_side_by_side,
)
from airgraph.tuning.params import freezable_positions
from airgraph.tuning.report import FAILED, SUCCESSFUL, TuneReport, TuneTask
from airgraph.tuning.source import bank_file
from airgraph.tuning.turns import DeviceTurns, builds_beside
from airgraph.tuning.units import Built, Job, Tentative, TunedGraph, UnitMeasuring, node_values

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
        self.turns = DeviceTurns(config.tuning.resolved_lock_dir(), config.tuning.lock_timeout_s, self.report.waits)
        # airgraph.tune: the compiled model only tunes (it is not run afterwards); see lowering_request.
        self.only_tunes = False
        self.plain_graphs = 0  # graphs lowered without the bank by lowering_request

    def lowering_request(self, segments: list[Segment], request: GraphRequest) -> GraphRequest:
        """The request to lower a graph's ``segments`` with: ``request``, or, for a tuner whose compiled model
        only tunes, one without the bank when the bank answers every unit of the graph: its first run measures
        nothing, so the bank's choices (a GEMM template, frozen weights: compiles of their own) are not compiled
        for it; a later compile takes them from the bank."""
        if not self.only_tunes or self.config.tuning.repeat or request.kind == "backward" or request.tuning is None:
            return request
        task = TuneTask("lookup", self.mode)  # counts only, never reported
        file, digest = bank_file(self.bank, request.device)
        seen: dict[str, Job] = {}
        for seg in segments:
            if seg.sync or seg.placement == HOST or seg.gm is None:
                continue
            tunable = choose(seg, request).chosen_by in ("config", "tuning")
            if tunable and self._look_up(0, request.device.type, seg, task, file, digest, set(), seen):
                return request
        self.plain_graphs += 1
        return dataclasses.replace(request, tuning=None)

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
        values = [p.meta.get("val") for p in placeholders]
        tensors = [v for v in values if isinstance(v, torch.Tensor) and isinstance(v.numel(), int)]
        input_bytes = sum(v.numel() * v.element_size() for v in tensors)
        graph.clock = DeviceClock.of(runtime, request.device, self.config.mode, input_bytes)
        return _FirstRun(self, run, graph)

    def _emit(self, event: str, **info: Any) -> None:
        if self.progress is not None:
            self.progress(event, **info)

    # -- one graph ---------------------------------------------------------------------------------------
    def first_run(self, graph: TunedGraph, args: list, run: Callable[[list], Any]) -> tuple[Any, Callable]:
        """The first call of ``graph`` (boxed ``args``): tuned (see the module docstring); returns its outputs and
        the executor to run from now on."""
        task = self.report.new_task(f"{self.name} graph {graph.report.id} ({graph.request.kind})")
        start = time.perf_counter()
        try:
            file, digest = bank_file(self.bank, graph.request.device)
            stale = self.bank.stale_bases(file, VERSIONS) if self.bank.folder.is_dir() else set()
            seen: dict[str, Job] = {}
            jobs = [
                job
                for seg in graph.segments
                if _tunable(seg)
                for job in self._look_up(
                    graph.report.id, graph.request.device.type, seg, task, file, digest, stale, seen
                )
            ]
        except Exception as exc:
            self._fail(task, exc)
            jobs = []
        if not jobs:  # every unit in the bank (or none to tune): a call as any later call, nothing measured
            task.status = FAILED if task.failed_section else SUCCESSFUL
            task.seconds = time.perf_counter() - start
            self.report.write()
            return run(args), run
        self.report.write()
        values = list(args)
        args.clear()
        outputs, recorded = _run_sequentially(graph, values)
        # Measured as a later call runs: AOTAutograd runs a graph's first call under a Python dispatch mode of its
        # own (custom-op alias analysis, torch 2.11+), which costs every ATen op a Python round trip. Timed under
        # it, a graph of many ATen calls looked up to a third slower than it runs, and a fused candidate won by
        # that much in the report but not in the next process.
        with _disable_current_modes():
            try:
                tentative = self._measure_jobs(graph, jobs, recorded, task)
                run = self._apply(graph, values, recorded, tentative, task, run)
                for item in tentative:
                    self._commit(item, file, task)
                task.status = FAILED if any(o.status == "failed" for o in task.outcomes) else SUCCESSFUL
            except Exception as exc:
                self._fail(task, exc)
        task.seconds = time.perf_counter() - start
        self.report.write()
        return outputs, run

    def _fail(self, task: TuneTask, exc: Exception) -> None:
        task.status, task.failed_section = FAILED, True
        warnings.warn(
            f"airgraph: tuning {task.name} failed ({type(exc).__name__}: {exc}); it runs untuned", stacklevel=4
        )

    def _measure_jobs(
        self, graph: TunedGraph, jobs: list[Job], recorded: dict[int, list[Any]], task: TuneTask
    ) -> list[Tentative]:
        """Build each job's candidates and measure them, in order; while another process holds the device's turn,
        build the next jobs meanwhile (where building beside a measurement leaves it alone: turns.builds_beside;
        elsewhere a job is built and measured in one turn). Returns the units measured (an operator's failure is
        reported as failed; a segment's fails the graph's tuning)."""
        device = graph.request.device
        queue = [job for job in jobs if job.first is None]
        ready: list[Built] = []
        values: dict[int, dict] = {}  # operator mode: segment id -> the real values its jobs' operators take
        failed: dict[int, str] = {}  # id(job) -> why
        beside = builds_beside(device)
        while queue or ready:
            if ready and (not queue or self.turns.free_now(device)):
                built = ready.pop(0)
                self._guarded(built.job, task, failed, lambda b=built: self._measure(graph, b))
                continue
            job = queue.pop(0)
            build = lambda j=job: self._build(graph, j, _job_inputs(j, jobs, recorded, values), task)  # noqa: E731
            if beside:
                built = self._guarded(job, task, failed, build)
                ready += [built] if built is not None else []
                continue
            with self.turns.building(device) as waited:
                built = self._guarded(job, task, failed, build)
                if built is not None:
                    self._guarded(job, task, failed, lambda b=built: self._measure(graph, b))
            job.item.outcome.waited_s += waited
        for job in jobs:  # equal operators: counted as the one measured
            if job.first is None:
                continue
            item, first = job.item, job.first.item
            if id(job.first) in failed:
                failed[id(job)] = failed[id(job.first)]
                item.outcome.status, item.outcome.note = "failed", f"as {first.outcome.name}: {failed[id(job)]}"
                task.outcomes.append(item.outcome)
                continue
            item.choice, item.spread, item.conclusive = first.choice, first.spread, first.conclusive
            item.same_as = first
            item.outcome.before_us, item.outcome.after_us = first.outcome.before_us, first.outcome.after_us
            item.outcome.note = f"as {first.outcome.name}"
        return [job.item for job in jobs if id(job) not in failed]

    def _guarded(self, job: Job, task: TuneTask, failed: dict[int, str], step: Callable[[], Any]) -> Any:
        """``step()`` for ``job``; an operator that fails is reported failed (a segment's failure is raised)."""
        if job.unit is None:
            return step()
        try:
            return step()
        except Exception as exc:
            failed[id(job)] = f"{type(exc).__name__}: {exc}"
            job.item.outcome.status, job.item.outcome.note = "failed", failed[id(job)]
            task.outcomes.append(job.item.outcome)
            self.report.write()
            return None

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
        device = graph.request.device
        with self.turns.building(device) as waited:
            run = self._apply_built(graph, values, recorded, tentative, task, run)
        task.waited_s += waited
        return run

    def _apply_built(
        self,
        graph: TunedGraph,
        values: list,
        recorded: dict[int, list[Any]],
        tentative: list[Tentative],
        task: TuneTask,
        run: Callable,
    ) -> Callable:
        saved = {seg.id: (seg.impl, seg.compiled) for seg in graph.segments}
        changed = self._lower_choices(graph, recorded, tentative)
        device = graph.request.device
        if not changed:
            with self.turns.turn(device) as waited:
                timings = time_side_by_side({"default": run}, values, graph.timer, written=graph.mutated)
            task.waited_s += waited
            task.model_before_ms = task.model_after_ms = timings["default"].median * 1e3
            return run
        new_run = graph.rebuild()
        with self.turns.turn(device) as waited:
            decision = decide({"default": run, "tuned": new_run}, values, graph.timer, written=graph.mutated)
        task.waited_s += waited
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
        task.waited_s += outcome.waited_s
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
            candidates=version(self.mode, (file.env or {}).get("device_type", "cpu")),
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
        outputs, self._run = self._tuner.first_run(self._graph, args, self._run)
        return outputs


def _job_inputs(job: Job, jobs: list[Job], recorded: dict[int, list[Any]], values: dict[int, dict]) -> list[Any]:
    """What ``job`` is measured on: its segment's recorded inputs, or its operator's real input values (the
    segment's graph run eagerly once for all its jobs' operators)."""
    seg = job.item.segment
    if job.unit is None:
        return recorded[seg.id]
    if seg.id not in values:
        wanted = {n for j in jobs if j.unit is not None and j.item.segment is seg for n in j.unit.inputs}
        values[seg.id] = node_values(seg.gm, fresh_inputs(recorded[seg.id], seg.written), wanted)
    return [values[seg.id][n] for n in job.unit.inputs]


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
