"""The ``airgraph`` command (also ``python -m airgraph``): demo, bench, inspect, export, run, kernels, tune, bank,
cache, compare.

One module per subcommand group (bench.py: demo and bench; inspect.py; export.py: export and run; tune.py;
bank.py; cache.py; compare.py), each with an ``add_parsers(sub, docs)`` that imports no torch, so ``airgraph
--help`` answers at once; a command imports torch when it runs. ``airgraph run`` is dispatched to
``airgraph.export.runner`` before any parser is built: it runs exports in a process that never imports torch.

Exit codes: 0 success; 1 a mode's outputs differ from eager (demo, bench), a model that cannot be
exported (export), outputs that differ from the reference (run --check), a divergence (compare); 2 a usage error
(bad option, unknown subcommand, a target that cannot be loaded, a refused export path).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import airgraph
from airgraph.cli import bank, bench, cache, compare, export, inspect, kernels, tune
from airgraph.cli.common import CliError, make_console
from airgraph.config import CompilerConfig

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    docs = CompilerConfig().describe()
    parser = argparse.ArgumentParser(
        prog="airgraph", description="airgraph: a graph-mode torch.compile backend for CUDA GPUs and CPUs."
    )
    parser.add_argument("--version", action="version", version=f"airgraph {airgraph.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (bench, inspect, export, kernels, tune, bank, cache, compare):
        group.add_parsers(sub, docs)
    parser.set_defaults(subcommands=sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``airgraph`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # before anything imports torch
        from airgraph.export.runner import main as run_main

        return run_main(argv[1:], prog="airgraph run")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's usage error (code 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return args.handler(args, make_console())
    except CliError as exc:
        if exc.code == 2:  # a usage error: the subcommand's usage first, as argparse prints its own errors
            args.subcommands[args.command].print_usage(sys.stderr)
        print(f"airgraph {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
