"""``airgraph cache list|clear``: see and empty the compile cache (airgraph/cache).

The cache is ``--dir``, else the one the configuration names (``config.compile_cache``: ``$AIRGRAPH_CACHE_DIR``,
else the user cache's ``airgraph/compile-cache``). ``list`` shows each entry (one Dynamo graph): its model, mode,
device, size and date, ``--check`` also reads each whole and says whether it would be used; ``clear`` removes the
entries (``--model``: those of a model only) and the instruction-set record. Inductor's own caches (the kernels an
entry's graphs load) are torch's, in ``TORCHINDUCTOR_CACHE_DIR``, and are left alone.

Exit codes: 0 success; 1 ``list --check`` found entries that would be refused; 2 a usage error (a ``--dir`` that
is not a folder, a cache that is switched off).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from airgraph.cli.common import CliError
from airgraph.config import CompilerConfig

__all__ = ["add_parsers"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    cache = sub.add_parser(
        "cache",
        help="list or clear the compile cache (config.compile_cache)",
        description="The compile cache keeps what each process compiled, per Dynamo graph (and per input signature "
        "of an airgraph.cache_compile model), for the next process with the same model code, config, torch, "
        "airgraph and machine. `list` shows its entries, `clear` removes "
        "them. Default folder: config.compile_cache ($AIRGRAPH_CACHE_DIR, else the user cache's "
        "airgraph/compile-cache).",
    )
    verbs = cache.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="the entries: model, mode, device, size, date")
    listing.add_argument("--dir", default=None, metavar="DIR", help="the cache folder (default: see above)")
    listing.add_argument("--check", action="store_true", help="also read each entry whole (size and digest)")
    listing.add_argument("--json", action="store_true", help="print the entries as JSON")
    listing.set_defaults(handler=cmd_list)
    clear = verbs.add_parser("clear", help="remove the entries (all, or a model's)")
    clear.add_argument("--dir", default=None, metavar="DIR", help="the cache folder (default: see above)")
    clear.add_argument("--model", default=None, metavar="NAME", help="only the entries of this model (as listed)")
    clear.set_defaults(handler=cmd_clear)


def _folder(path: str | None) -> Any:
    from airgraph.cache.folder import CacheFolder

    if path is None:
        root = CompilerConfig().resolved_cache_dir()
        if root is None:  # pragma: no cover - CompilerConfig() starts with the cache on
            raise CliError("the compile cache is off; give --dir")
    else:
        root = path
    if Path(root).exists() and not Path(root).is_dir():
        raise CliError(f"{root} is not a folder; give the compile cache's folder")
    return CacheFolder(root)


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    from airgraph.cache.folder import ISA_FILE

    folder = _folder(args.dir)
    infos = folder.scan()
    rows = []
    for info in infos:
        header = info.header or {}
        problem = info.problem if info.problem is not None else (folder.check(info.key) if args.check else None)
        rows.append(
            {
                "key": info.key,
                "model": header.get("model", "?"),
                "mode": header.get("mode", "?"),
                "device": header.get("device", "?"),
                "nodes": header.get("nodes"),
                "bytes": info.size,
                "created": header.get("created", "?"),
                "torch": header.get("torch", "?"),
                "state": "ok" if problem is None else f"refused: {problem}",
            }
        )
    refused = sum(r["state"] != "ok" for r in rows)
    if args.json:
        console.print_json(json.dumps({"folder": str(folder.root), "entries": rows}))
        return 1 if args.check and refused else 0
    if not rows:
        console.print(f"no entries in {folder.root}", highlight=False)
        return 0
    table = Table(title=f"compile cache {folder.root}", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for header in ("key", "model", "mode", "device", "nodes", "size", "created", "torch", "state"):
        table.add_column(header, justify="right" if header in ("nodes", "size") else "left")
    for row in rows:
        table.add_row(
            row["key"][:16],
            row["model"],
            row["mode"],
            row["device"],
            str(row["nodes"] if row["nodes"] is not None else "?"),
            _size(row["bytes"]),
            row["created"],
            row["torch"],
            row["state"],
        )
    console.print(table)
    total = sum(r["bytes"] for r in rows)
    models = len({r["model"] for r in rows})
    isa = "recorded" if (folder.root / ISA_FILE).exists() else "not recorded"
    console.print(
        f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'} of {models} model(s), {_size(total)}; Inductor's CPU "
        f"instruction-set checks {isa}" + (f"; {refused} would be refused" if refused else ""),
        highlight=False,
    )
    return 1 if args.check and refused else 0


def cmd_clear(args: argparse.Namespace, console: Console) -> int:
    from airgraph.cache.folder import ISA_FILE

    folder = _folder(args.dir)
    if args.model is not None:
        chosen = [i for i in folder.scan() if (i.header or {}).get("model") == args.model]
        if not chosen:
            raise CliError(f"no entry of model {args.model!r} in {folder.root} (airgraph cache list shows them)")
        freed = sum(folder.remove(i.key) for i in chosen)
        count = len(chosen)
    else:
        count, freed = folder.clear()
        for name in (ISA_FILE, f"{ISA_FILE}.lock"):
            path = folder.root / name
            if path.exists():
                freed += path.stat().st_size
                path.unlink()
    console.print(f"removed {count} entr{'y' if count == 1 else 'ies'} ({_size(freed)}) from {folder.root}")
    return 0


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"
