"""``airgraph bank list|show|prune``: see and clean the tuning bank."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from airgraph.cli.common import CliError
from airgraph.config import CompilerConfig

__all__ = ["add_parsers"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    bank = sub.add_parser(
        "bank",
        help="list, show or prune the tuning bank",
        description="The tuning bank (airgraph tune, config.tuning.mode) keeps one file per device and software "
        "environment. `list` shows its entries (stale ones: another device, torch or airgraph version, or "
        "candidate set, never used), `show KEY` one entry's record, `prune` removes what is never used "
        "(--all: everything).",
    )
    bank.add_argument("action", choices=["list", "show", "prune"])
    bank.add_argument("key", nargs="?", default=None, help="show: an entry's key (a unique prefix is enough)")
    bank.add_argument("--bank", default=None, metavar="DIR", help=docs["tuning.bank_dir"])
    bank.add_argument("--all", action="store_true", help="list: unsatisfied memos too; prune: remove every entry")
    bank.set_defaults(handler=cmd_bank)


def cmd_bank(args: argparse.Namespace, console: Console) -> int:
    import torch

    from airgraph.tuning.bank import TUNED, Bank, is_stale
    from airgraph.tuning.candidates import VERSIONS
    from airgraph.tuning.source import bank_file

    config = CompilerConfig()
    folder = args.bank or config.tuning.resolved_bank_dir()
    bank = Bank(folder)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    current = [bank_file(bank, device)[0] for device in devices]
    current_paths = {f.path for f in current}
    if args.action == "prune":
        counts = bank.prune(current, VERSIONS, everything=args.all)
        console.print(
            f"{folder}: kept {counts['kept']} record(s), dropped {counts['dropped']}, "
            f"removed {counts['files_removed']} file(s)",
            highlight=False,
        )
        return 0
    rows = [
        (entry, file, is_stale(file, entry, current_paths, VERSIONS))
        for file in bank.files()
        for entry in file.entries().values()
    ]
    if args.action == "show":
        if not args.key:
            raise CliError("show: give the KEY of an entry (airgraph bank list shows them)")
        found = [(e, f, s) for e, f, s in rows if e.key.startswith(args.key)]
        if len(found) != 1:
            what = "no entry" if not found else f"{len(found)} entries"
            raise CliError(f"{what} with a key starting {args.key!r} in {folder}", code=1 if not found else 2)
        entry, file, stale = found[0]
        record = json.loads(entry.to_json())
        console.print_json(json.dumps({"file": str(file.path), "env": file.env, "stale": stale, "record": record}))
        return 0
    table = Table(title=f"tuning bank {folder}", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for header in ("key", "kind", "unit", "type", "choice", "before us", "after us", "gain", "state", "when"):
        table.add_column(header, justify="right" if header in ("before us", "after us", "gain") else "left")
    shown = 0
    for entry, _, stale in rows:
        if entry.status != TUNED and not args.all:
            continue
        shown += 1
        choice = f"{entry.choice['tune_mode']} {entry.choice['name']}" if entry.choice else "(default kept)"
        state = "stale" if stale else ("memo" if entry.status != TUNED else "in use")
        table.add_row(
            entry.key,
            entry.kind,
            entry.name,
            entry.op_type,
            choice,
            f"{entry.before_us:.1f}",
            f"{entry.after_us:.1f}",
            f"{entry.improvement * 100:.1f}%",
            state,
            entry.time,
        )
    console.print(table)
    stale_count = sum(s for _, _, s in rows)
    console.print(f"{shown} entr{'y' if shown == 1 else 'ies'} shown, {stale_count} stale", highlight=False)
    return 0
