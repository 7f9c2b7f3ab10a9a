"""``airgraph kernels``: install, list and remove static-kernel packages by hand (airgraph/kernels).

On a serving machine that never compiles: copy the package a build machine wrote
(``static_kernel_outputs/<timestamp>_<pid>_outputs/static_kernel_<datetime>.zip``), ``airgraph kernels install``
it, and processes with ``config.static_kernels.enabled`` run its kernels. The library is ``--library``, else the
one the configuration names (``AIRGRAPH_KERNEL_LIBRARY``, else ``<build dir>/static_kernel_library``).

Exit codes: 0 success; 1 a package refused (torn, another format, a file failing its digest) or ``list --check``
finding kernels this machine cannot run; 2 a usage error (no such file, nothing matching a name).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from airgraph.cli.common import CliError
from airgraph.config import CompilerConfig

if TYPE_CHECKING:
    from airgraph.kernels.library import KernelLibrary

__all__ = ["add_parsers"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    kernels = sub.add_parser(
        "kernels",
        help="install, list and remove static-kernel packages (config.static_kernels)",
        description="Manage the static-kernel library: packages of shape-specialized kernels built by processes "
        "running with config.static_kernels.enabled. Default library: config.static_kernels.library_dir "
        "(AIRGRAPH_KERNEL_LIBRARY), else <build_dir>/static_kernel_library (build_dir: "
        "AIRGRAPH_STATIC_KERNELS_BUILD_DIR, else the working directory).",
    )
    verbs = kernels.add_subparsers(dest="verb", required=True, metavar="VERB")
    install = verbs.add_parser("install", help="install a package into the library (atomic; twice is a no-op)")
    install.add_argument("package", metavar="PKG", help="a static_kernel_<datetime>.zip package file")
    install.add_argument("--library", default=None, metavar="DIR", help="the library (default: see above)")
    install.set_defaults(handler=cmd_install)

    listing = verbs.add_parser("list", help="the installed kernels per graph: shapes, device, size, date")
    listing.add_argument("library", nargs="?", default=None, metavar="LIBRARY", help="the library (default: above)")
    listing.add_argument("--json", action="store_true", help="print the library's index as JSON")
    listing.add_argument(
        "--check", action="store_true", help="also say whether this machine can run each kernel (imports torch)"
    )
    listing.set_defaults(handler=cmd_list)

    remove = verbs.add_parser("remove", help="remove a package's kernels, a graph's kernels, or all")
    what = remove.add_mutually_exclusive_group(required=True)
    what.add_argument("package", nargs="?", default=None, metavar="PACKAGE", help="an installed package (or prefix)")
    what.add_argument("--graph", default=None, metavar="KEY", help="every kernel of this graph key (or prefix)")
    what.add_argument("--all", action="store_true", help="every kernel")
    remove.add_argument("--library", default=None, metavar="DIR", help="the library (default: see above)")
    remove.set_defaults(handler=cmd_remove)


def _library(path: str | None) -> Any:
    from airgraph.kernels.library import KernelLibrary, library_path

    try:
        root = Path(path) if path is not None else library_path(CompilerConfig())
    except ValueError as exc:  # a malformed environment variable
        raise CliError(str(exc)) from None
    if root.exists() and not root.is_dir():
        raise CliError(f"{root} is not a folder; give the kernel library's folder")
    return KernelLibrary(root)


def cmd_install(args: argparse.Namespace, console: Console) -> int:
    from airgraph.kernels.package import PackageError

    if not Path(args.package).is_file():
        raise CliError(f"{args.package}: no such package file")
    library = _library(args.library)
    try:
        result = library.install(args.package)
    except PackageError as exc:
        raise CliError(f"package refused: {exc}", code=1) from None
    if result.already:
        console.print(f"{result.package} is already installed in {library.root}: nothing to do", highlight=False)
    else:
        console.print(
            f"installed {result.package} into {library.root}: {len(result.added)} kernel(s) added, "
            f"{len(result.kept)} already there (same or newer build)",
            highlight=False,
        )
    return 0


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    library = _library(args.library)
    index = library.read_index()
    if args.json:
        console.print_json(json.dumps(index))
        return 0
    kernels = sorted(index["kernels"].values(), key=lambda e: (e["graph_key"], e.get("label", ""), e["shape_id"]))
    if not kernels:
        console.print(f"no kernels installed in {library.root}", highlight=False)
        return 0
    reasons = _check(library, kernels) if args.check else {}
    table = Table(title=f"static kernels in {library.root}", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("graph", "shapes", "ops", "device", "torch", "size", "built", "package"):
        table.add_column(header, justify="right" if header in ("ops", "size") else "left")
    if args.check:
        table.add_column("runs here")
    previous = None
    for entry in kernels:
        graph = entry["graph_key"][:12] if entry["graph_key"] != previous else ""
        previous = entry["graph_key"]
        row = [
            graph,
            entry.get("label", entry["shape_id"]),
            str(entry.get("ops", "?")),
            _device(entry["build"].get("device", {})),
            str(entry["build"].get("torch")),
            _size(entry["size"]),
            _date(entry["built"]),
            entry["package"],
        ]
        if args.check:
            reason = reasons[f"{entry['graph_key']}/{entry['shape_id']}"]
            row.append("yes" if reason is None else "no (below)")
        table.add_row(*(Text(cell) for cell in row))  # shapes such as [2, 16] are text, not markup
    console.print(table)
    for kid, reason in reasons.items():
        if reason is not None:
            console.print(f"{kid} does not run here: {reason}", highlight=False, markup=False)
    graphs = len({e["graph_key"] for e in kernels})
    console.print(f"{len(kernels)} kernel(s) for {graphs} graph(s), {len(index['packages'])} package(s) installed")
    return 1 if any(r is not None for r in reasons.values()) else 0


def cmd_remove(args: argparse.Namespace, console: Console) -> int:
    library = _library(args.library)
    try:
        removed = library.remove(package=args.package, graph_key=args.graph, everything=args.all)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    console.print(f"removed {len(removed)} kernel(s) from {library.root}", highlight=False)
    return 0


def _check(library: KernelLibrary, kernels: list[dict[str, Any]]) -> dict[str, str | None]:
    import torch

    from airgraph.kernels.machine import describe, mismatch

    here = {
        kind: describe(torch.device(kind)) for kind in ("cpu", "cuda") if kind == "cpu" or torch.cuda.is_available()
    }
    reasons = {}
    for e in kernels:
        kind = e["build"].get("device", {}).get("type")
        reason = mismatch(e["build"], here[kind]) if kind in here else f"no {kind} device here"
        reasons[f"{e['graph_key']}/{e['shape_id']}"] = reason or library.damage(e)
    return reasons


def _device(device: dict[str, Any]) -> str:
    if device.get("type") == "cuda":
        return f"{device.get('name')} (sm {device.get('capability')})"
    return f"{device.get('model')} ({device.get('isa')})"


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 1024:.0f} KiB"


def _date(stamp: str) -> str:
    try:
        when = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    return when.astimezone().strftime("%Y-%m-%d %H:%M")
