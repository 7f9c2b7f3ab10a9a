"""``airgraph tune``: tune a model's operators or segments into the bank and print what changed."""

from __future__ import annotations

import argparse
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from airgraph.cli.common import EXAMPLE_SIGNATURE, CliError, add_target_options, config_from, load_target, make_console

__all__ = ["add_parsers", "cmd_tune"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    p = sub.add_parser(
        "tune",
        help="tune a model's operators (op) or segments (subgraph) into the tuning bank",
        description="Compile TARGET with airgraph, run it once and tune it: every tunable operator (--mode op, AOE's "
        "OPAT) or every segment (--mode subgraph, SGAT) is measured against its candidates, the winners go into "
        "the bank, later compiles use them. Writes AOE's result files (aoe_result_opat_*.json or "
        "aoe_result_sgat_*.json) into --work-path. TARGET is 'tiny-llama', a .py file or package.module[:attr] "
        f"defining `{EXAMPLE_SIGNATURE}`; it runs under torch.no_grad.",
    )
    p.add_argument("--mode", required=True, help="op or subgraph (AOE's 2 or 1): " + docs["tuning.mode"])
    p.add_argument("--bank", default=None, metavar="DIR", help=docs["tuning.bank_dir"])
    p.add_argument("--work-path", default=None, metavar="DIR", help=docs["tuning.work_path"])
    p.add_argument("--ops", default=None, metavar="TYPES", help="comma-separated: " + docs["tuning.ops"])
    p.add_argument("--repeat", action="store_true", help=docs["tuning.repeat"])
    p.add_argument("--kernel-backend", default=None, help=docs["kernel_backend"])
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS", help=docs["tuning.budget_s"])
    p.add_argument(
        "--subgraph-budget", type=float, default=None, metavar="SECONDS", help=docs["tuning.subgraph_budget_s"]
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_target_options(p)
    p.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import airgraph

    config = config_from(
        {
            "tuning.mode": args.mode,
            "kernel_backend": args.kernel_backend,
            "tuning.budget_s": args.budget,
            "tuning.subgraph_budget_s": args.subgraph_budget,
            "tuning.ops": args.ops,
        }
    )
    if config.tuning.mode is None:
        raise CliError("--mode: give op or subgraph (AOE's 2 or 1)")
    fn, fargs, fkwargs = load_target(args)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[candidate]}"),
        TimeElapsedColumn(),
        console=make_console(stderr=True),
        disable=args.no_progress,
        transient=True,
    )
    tasks: list[Any] = []

    def on_event(event: str, **info: Any) -> None:
        if event == "unit":
            tasks.append(progress.add_task(info["name"], total=max(info["candidates"], 1), candidate=""))
        elif event == "candidate" and tasks:
            progress.update(tasks[-1], advance=1, candidate=info["name"])

    with progress:
        report = airgraph.tune(
            fn,
            *fargs,
            mode=config.tuning.mode,
            bank_dir=args.bank,
            work_path=args.work_path,
            repeat=args.repeat,
            config=config,
            progress=on_event,
            **fkwargs,
        )
    console.print(outcome_table(report))
    console.print(str(report).splitlines()[0], highlight=False)
    for task in report.tasks:
        for unit, candidate, reason in task.dropped:
            console.print(f"  dropped {candidate} for {unit}: {reason}", highlight=False, style="dim")
    console.print(f"bank: {report.bank_dir}\nreport: {report.path}", highlight=False)
    return 0


def outcome_table(report: Any) -> Table:
    """Every unit: its outcome, its choice, its time before and after (the whole graph's first)."""
    from airgraph.tuning.report import improvement

    table = Table(title="tuning", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for header, justify in [
        ("unit", "left"),
        ("type", "left"),
        ("outcome", "left"),
        ("choice", "left"),
        ("before us", "right"),
        ("after us", "right"),
        ("gain", "right"),
    ]:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for task in report.tasks:
        if task.model_before_ms is not None:
            before, after = task.model_before_ms * 1e3, (task.model_after_ms or task.model_before_ms) * 1e3
            gain = improvement(before, after)
            table.add_row(task.name, "graph", task.status, "", f"{before:.1f}", f"{after:.1f}", gain, style="bold")
        for o in task.outcomes:
            choice = f"{o.tune_mode} {o.choice}".strip() if o.status not in ("unsatisfied", "failed") else o.note
            gain = improvement(o.before_us, o.after_us) if o.after_us else ""
            table.add_row(o.name, o.op_type, o.status, choice, f"{o.before_us:.1f}", f"{o.after_us:.1f}", gain)
    return table
