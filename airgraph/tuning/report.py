"""Tuning reports in the seed's format (AOE's result files), written while tuning runs.

One file per tuning session and mode in the work path (``config.tuning.work_path``, default the working
directory): ``aoe_result_opat_<timestamp>_<pid>.json`` (operator tuning) or ``aoe_result_sgat_<timestamp>_<pid>.json``
(subgraph tuning), timestamp ``YYYYMMDDHHMMSSmmm``. It holds one task per tuned graph, under
``report_<timestamp>_<thread id>``, each a list ``[{"basic": {...}}, {"OPAT": {...}}]`` (or ``"SGAT"``) with exactly
the seed's fields (:data:`OPAT_FIELDS`, :data:`SGAT_FIELDS`). The file is rewritten atomically after every unit,
so a crash leaves a readable file whose unfinished task says ``"tuning incomplete"`` and has no ``tuning_time(s)``.

The seed's sections are left out where it leaves them out: OPAT when a graph has no tunable operator, SGAT when
subgraph tuning failed. What the seed's format has no field for is on :class:`TuneReport` itself, in its
``__str__``, and in a second file beside the seed's, ``airgraph_candidates_<opat|sgat>_<timestamp>_<pid>.json``
(rewritten with it): per task and unit, every candidate that was measured (median, run-to-run spread, rounds) or
dropped (why: failed to compile, failed its check, time budget spent), the unit's status and note (an
inconclusive measurement says so), stale bank entries, the whole graph's time before and after, and how long the
tuner waited for the device's turns to measure (:class:`Waits`, tuning/turns.py).

A graph's time (the executor that tuning changes) is not what a call of the model costs: Dynamo's guards,
AOTAutograd's wrapper and any eager code between graphs come on top, the same before and after, so a gain of the
graph alone overstates the gain of a call (docs/tuning.md gives an example). ``airgraph.tune`` therefore also times
**the whole call** (:class:`CallTiming`: the model compiled without the bank and with it, called as the next run
calls it, interleaved); it heads ``str(report)`` and the candidates file's ``"model_call"``.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airgraph.store import write_text_atomic

__all__ = [
    "BASIC_FIELDS",
    "OPAT_FIELDS",
    "SGAT_FIELDS",
    "SUMMARY_FIELDS",
    "CallTiming",
    "TuneReport",
    "TuneTask",
    "Waits",
    "timestamp",
]

BASIC_FIELDS = ("tuning_name", "tuning_time(s)")
SUMMARY_FIELDS = (
    "repo_add_num",
    "repo_hit_num",
    "repo_reserved_num",
    "repo_unsatisfied_num",
    "repo_update_num",
    "total_num",
)
OPAT_FIELDS = ("opat_tuning_result", "repo_modified_operators", "repo_summary")  # + "tuning_failed_operators"
OPERATOR_FIELDS = ("op_name", "op_type", "tune_performance")
PERFORMANCE_US = ("performance_after_tune(us)", "performance_before_tune(us)", "performance_improvement", "update_mode")
SGAT_FIELDS = (
    "model_baseline_performance(ms)",
    "model_performance_improvement",
    "model_result_performance(ms)",
    "repo_modified_subgraphs",
    "repo_summary",
)
SUBGRAPH_FIELDS = ("performance_after_tune(ms)", "performance_before_tune(ms)", "performance_improvement", "repo_key")
INCOMPLETE, SUCCESSFUL, FAILED = "tuning incomplete", "tuning successful", "tuning failed"


def timestamp(when: datetime.datetime | None = None) -> str:
    """``YYYYMMDDHHMMSSmmm``."""
    when = when or datetime.datetime.now()
    return when.strftime("%Y%m%d%H%M%S") + f"{when.microsecond // 1000:03d}"


def improvement(before: float, after: float) -> str:
    """The seed's performance_improvement: before / after - 1, as a percentage ("118.71%")."""
    return f"{(before / after - 1) * 100:.2f}%" if after > 0 else "0.00%"


def _times(before: float, after: float, unit: str, digits: int) -> dict[str, Any]:
    """The seed's before/after fields, rounded, and the improvement of the rounded values (the file agrees with
    itself)."""
    before, after = round(before, digits), round(after, digits)
    return {
        f"performance_after_tune({unit})": after,
        f"performance_before_tune({unit})": before,
        "performance_improvement": improvement(before, after),
    }


@dataclass
class CallTiming:
    """The whole model call untuned and tuned, each the median of interleaved rounds (microseconds); ``spread``:
    the larger run-to-run spread of the two (relative interquartile range)."""

    untuned_us: float
    tuned_us: float
    spread: float
    rounds: int

    @property
    def ratio(self) -> float:
        """tuned / untuned: what the next run gets."""
        return self.tuned_us / self.untuned_us if self.untuned_us > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "untuned_us": round(self.untuned_us, 3),
            "tuned_us": round(self.tuned_us, 3),
            "tuned_over_untuned": round(self.ratio, 4),
            "spread": round(self.spread, 4),
            "rounds": self.rounds,
        }


@dataclass
class Waits:
    """How long this process waited for its devices' turns to measure (tuning/turns.py): one turn per measurement
    (a unit's rounds, a whole graph's, the whole call's)."""

    turns: int = 0
    building_turns: int = 0  # of them, turns that compiled too (turns.builds_beside)
    seconds: float = 0.0  # waited in all
    longest_s: float = 0.0
    timed_out: int = 0  # turns measured beside a holder that kept the lock past config.tuning.lock_timeout_s
    locks: list[str] = field(default_factory=list)  # the lock files

    def to_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "building_turns": self.building_turns,
            "waited_s": round(self.seconds, 3),
            "longest_wait_s": round(self.longest_s, 3),
            "timed_out": self.timed_out,
            "locks": list(self.locks),
        }


@dataclass
class Outcome:
    """One unit's result: what was chosen (or kept) and how it was counted."""

    name: str  # op name or segment name
    op_type: str
    key: str
    status: str  # "add", "update", "reserved", "hit", "unsatisfied", "failed", "skipped"
    choice: str = "default"
    tune_mode: str = ""
    before_us: float = 0.0
    after_us: float = 0.0
    note: str = ""
    measured: dict[str, float] = field(default_factory=dict)  # candidate -> median us ("default" included)
    spreads: dict[str, float] = field(default_factory=dict)  # candidate -> run-to-run spread (relative IQR)
    rounds: int = 0  # interleaved rounds each candidate was timed
    seconds: float = 0.0  # spent compiling, checking and timing its candidates (not waiting for the device)
    waited_s: float = 0.0  # waiting for the device's turn to measure them (tuning/turns.py)


@dataclass
class TuneTask:
    """One tuned graph: a ``report_<timestamp>_<tid>`` entry of the file."""

    name: str
    mode: str  # "op" or "subgraph"
    key: str = field(default_factory=lambda: f"report_{timestamp()}_{threading.get_native_id()}")
    status: str = INCOMPLETE
    seconds: float | None = None  # None while running or after a crash: the seed then omits tuning_time(s)
    outcomes: list[Outcome] = field(default_factory=list)
    dropped: list[tuple[str, str, str]] = field(default_factory=list)  # (unit, candidate, reason)
    stale: int = 0
    dynamic: int = 0  # units not tuned: their shapes are symbolic (a dynamic-shape graph)
    model_before_ms: float | None = None
    model_after_ms: float | None = None
    waited_s: float = 0.0  # waiting for the device's turns to measure this graph's units and the graph
    failed_section: bool = False  # SGAT: subgraph tuning failed (the seed then omits the section)

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def summary(self) -> dict[str, int]:
        hits = self.count("hit")
        reserved = self.count("reserved") + hits
        return {
            "repo_add_num": self.count("add"),
            "repo_hit_num": hits + self.count("update") + self.count("reserved"),
            "repo_reserved_num": reserved,
            "repo_unsatisfied_num": self.count("unsatisfied"),
            "repo_update_num": self.count("update"),
            "total_num": sum(o.status in ("add", "update", "reserved", "hit", "unsatisfied") for o in self.outcomes),
        }

    def candidates(self) -> dict[str, Any]:
        """Per unit: its status, note and every candidate measured or dropped (TuneReport.candidates)."""
        units = {}
        for o in self.outcomes:
            dropped = {name: reason for unit, name, reason in self.dropped if unit == o.name}
            measured = {
                name: {"median_us": round(us, 3), "spread": round(o.spreads.get(name, 0.0), 4)}
                for name, us in o.measured.items()
            }
            units[o.name] = {
                "op_type": o.op_type,
                "repo_key": o.key,
                "status": o.status,
                "choice": o.choice,
                "note": o.note,
                "rounds": o.rounds,
                "seconds": round(o.seconds, 3),
                "waited_s": round(o.waited_s, 3),
                "measured": measured,
                "dropped": dropped,
            }
        return {
            "tuning_name": self.name,
            "status": self.status,
            "graph_before_after_ms": [self.model_before_ms, self.model_after_ms],
            "waited_s": round(self.waited_s, 3),
            "stale": self.stale,
            "units": units,
        }

    def to_seed(self) -> list[dict[str, Any]]:
        basic: dict[str, Any] = {"tuning_name": self.name}
        if self.seconds is not None:
            basic["tuning_time(s)"] = round(self.seconds, 3)
        section = self._opat() if self.mode == "op" else self._sgat()
        return [{"basic": basic}] + ([section] if section is not None else [])

    def _opat(self) -> dict[str, Any] | None:
        if not self.outcomes:
            return None  # no tunable operator: the seed has no OPAT section
        failed = [o.name for o in self.outcomes if o.status == "failed"]
        modified = [
            {
                "op_name": o.name,
                "op_type": o.op_type,
                "tune_performance": {
                    o.tune_mode: {**_times(o.before_us, o.after_us, "us", 3), "update_mode": o.status}
                },
            }
            for o in self.outcomes
            if o.status in ("add", "update")
        ]
        result = INCOMPLETE if self.status == INCOMPLETE else (FAILED if failed else SUCCESSFUL)
        body: dict[str, Any] = {
            "opat_tuning_result": result,
            "repo_modified_operators": modified,
            "repo_summary": self.summary(),
        }
        if result == FAILED:
            body["tuning_failed_operators"] = failed
        return {"OPAT": body}

    def _sgat(self) -> dict[str, Any] | None:
        if self.failed_section:
            return None

        def subgraphs(status: str) -> list[dict[str, Any]]:
            return [
                {**_times(o.before_us / 1e3, o.after_us / 1e3, "ms", 6), "repo_key": o.key}
                for o in self.outcomes
                if o.status == status
            ]

        before = round(self.model_before_ms or 0.0, 6)
        after = round(self.model_after_ms, 6) if self.model_after_ms is not None else before
        return {
            "SGAT": {
                "model_baseline_performance(ms)": before,
                "model_performance_improvement": improvement(before, after),
                "model_result_performance(ms)": after,
                "repo_modified_subgraphs": {
                    "add_repo_subgraphs": subgraphs("add"),
                    "update_repo_subgraphs": subgraphs("update"),
                },
                "repo_summary": self.summary(),
            }
        }


class TuneReport:
    """A tuning session's report: its tasks (one per tuned graph) and the seed-format file they are written to.

    ``str(report)`` is a short summary; ``report.to_dict()`` the seed-format dict; ``report.path`` the JSON file.
    """

    def __init__(self, mode: str, work_path: str | os.PathLike[str] | None = None) -> None:
        if mode not in ("op", "subgraph"):
            raise ValueError(f"tuning mode {mode!r}: give 'op' or 'subgraph'")
        self.mode = mode
        folder = Path(work_path) if work_path is not None else Path.cwd()
        kind, stamp = ("opat" if mode == "op" else "sgat"), f"{timestamp()}_{os.getpid()}"
        self.path = folder / f"aoe_result_{kind}_{stamp}.json"
        self.candidates_path = folder / f"airgraph_candidates_{kind}_{stamp}.json"
        self.tasks: list[TuneTask] = []
        self.bank_dir: str | None = None
        self.call: CallTiming | None = None  # the whole model call (airgraph.tune), see the module docstring
        self.call_note = ""  # why the call was not timed, when it was not
        self.waits = Waits()  # for the devices' turns to measure (tuning/turns.py)

    def new_task(self, name: str) -> TuneTask:
        task = TuneTask(name=name, mode=self.mode)
        while any(t.key == task.key for t in self.tasks):  # two tasks in one millisecond
            task.key += "_"
        self.tasks.append(task)
        self.write()
        return task

    def to_dict(self) -> dict[str, Any]:
        return {task.key: task.to_seed() for task in self.tasks}

    def write(self) -> None:
        write_text_atomic(self.path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        write_text_atomic(self.candidates_path, json.dumps(self.candidates(), indent=2, sort_keys=True) + "\n")

    def candidates(self) -> dict[str, Any]:
        """What each unit's candidates did, and the whole call's times (the module docstring's second file)."""
        call = self.call.to_dict() if self.call is not None else {"note": self.call_note or "not timed"}
        tasks = {task.key: task.candidates() for task in self.tasks}
        return {"model_call": call, "device_turns": self.waits.to_dict(), **tasks}

    @property
    def measured(self) -> bool:
        """Whether this session measured anything (False: every unit came from the bank, or none was tunable)."""
        return any(o.measured for o in self.outcomes)

    @property
    def outcomes(self) -> list[Outcome]:
        return [o for task in self.tasks for o in task.outcomes]

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = dict.fromkeys(SUMMARY_FIELDS, 0)
        for task in self.tasks:
            for name, value in task.summary().items():
                total[name] += value
        return total

    def __str__(self) -> str:
        counts = self.counts()
        stale = sum(t.stale for t in self.tasks)
        dynamic = sum(t.dynamic for t in self.tasks)
        kind = "operator (OPAT)" if self.mode == "op" else "subgraph (SGAT)"
        lines = [
            f"airgraph {kind} tuning: {len(self.tasks)} graph(s), {counts['total_num']} unit(s): "
            f"{counts['repo_add_num']} added, {counts['repo_update_num']} updated, {counts['repo_hit_num']} found "
            f"in the bank, {counts['repo_unsatisfied_num']} unsatisfied, {stale} stale"
            + (f"; {dynamic} with symbolic shapes not tuned (compile with dynamic=False)" if dynamic else "")
        ]
        if self.call is not None:
            call = self.call
            lines.append(
                f"  the whole call, as the next run calls it: {call.untuned_us:.1f} us untuned -> "
                f"{call.tuned_us:.1f} us tuned (tuned / untuned {call.ratio:.3f}, spread {call.spread:.0%}, "
                f"{call.rounds} rounds)"
            )
        elif self.call_note:
            lines.append(f"  the whole call: not timed ({self.call_note})")
        waits = self.waits
        if waits.turns:
            lines.append(
                f"  waited {waits.seconds:.1f} s for the device's turn to measure ({waits.turns} turns"
                + (f", {waits.building_turns} compiling too" if waits.building_turns else "")
                + f", the longest "
                f"{waits.longest_s:.1f} s"
                + (f", {waits.timed_out} measured beside a stuck holder" if waits.timed_out else "")
                + f"): {', '.join(waits.locks)}"
            )
        for task in self.tasks:
            if task.model_before_ms is not None and task.model_after_ms is not None:
                lines.append(
                    f"  {task.name}, the graph alone: {task.model_before_ms:.4f} ms -> {task.model_after_ms:.4f} ms "
                    f"({improvement(task.model_before_ms, task.model_after_ms)})"
                )
            for o in task.outcomes:
                if o.status in ("add", "update"):
                    lines.append(
                        f"    {o.name} ({o.op_type}): {o.tune_mode} {o.choice}, {o.before_us:.1f} us -> "
                        f"{o.after_us:.1f} us ({improvement(o.before_us, o.after_us)}, {o.status})"
                    )
                else:
                    lines.append(f"    {o.name} ({o.op_type}): {o.status}" + (f": {o.note}" if o.note else ""))
                if o.measured:
                    timed = ", ".join(
                        f"{name} {us:.1f}" + (f"±{o.spreads[name]:.0%}" if name in o.spreads else "")
                        for name, us in o.measured.items()
                    )
                    lines.append(f"      measured (us, median±spread, {o.rounds} rounds): {timed}")
                for unit, name, reason in task.dropped:
                    if unit == o.name:
                        lines.append(f"      dropped {name}: {reason}")
        lines.append(f"  report: {self.path}")
        lines.append(f"  candidates: {self.candidates_path}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<TuneReport {self.mode}: {len(self.tasks)} task(s), {self.path}>"
