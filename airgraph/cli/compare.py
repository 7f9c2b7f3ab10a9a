"""``airgraph compare``: run a model eagerly and with airgraph, and name the first node where they part.

Exit codes: 0 every output (and gradient) within tolerance, 1 a divergence, 2 bad input.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from airgraph.cli.common import (
    EXAMPLE_SIGNATURE,
    CliError,
    add_target_options,
    config_from,
    load_target,
    make_console,
)

__all__ = ["add_parsers", "cmd_compare"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    p = sub.add_parser(
        "compare",
        help="compare a model compiled by airgraph with eager and name the first node that diverges",
        description="Run TARGET eagerly and compiled by airgraph on the same inputs and weights, compare every "
        "output (with --grad, every gradient too) and, when one leaves its tolerance, name the first ATen node "
        "that diverged, with its source line, or the decomposition or airgraph pass that made it before the kernels; "
        "--write-config writes the config that runs it as eager would. TARGET is 'tiny-llama', a .py file or "
        "package.module[:attr] defining "
        f"`{EXAMPLE_SIGNATURE}`. Exit 0: within tolerance; 1: a divergence; 2: bad input.",
    )
    p.add_argument("--mode", default=None, help=docs["mode"])
    p.add_argument("--kernel-backend", default=None, help=docs["kernel_backend"])
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (with --atol; default: per dtype)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (with --rtol; default: per dtype)")
    p.add_argument("--dump-dir", default=None, metavar="DIR", help="write every compared tensor and index.json")
    p.add_argument("--json", default=None, metavar="PATH", help="also write report.to_dict() as JSON")
    p.add_argument("--grad", action="store_true", help="keep autograd on and compare gradients (default: no_grad)")
    p.add_argument(
        "--write-config",
        default=None,
        metavar="PATH",
        help="write report.fallback() as a JSON config (AIRGRAPH_CONFIG=PATH uses it): what diverged runs as eager "
        "would; then compare with it and time a call with and without it",
    )
    add_target_options(p)
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    import torch

    import airgraph
    from airgraph.bench.results import write_json

    if (args.rtol is None) != (args.atol is None):
        raise CliError("give both --rtol and --atol, or neither (then they follow each value's dtype)")
    config = config_from({"mode": args.mode, "kernel_backend": args.kernel_backend})
    fn, fargs, fkwargs = load_target(args)
    grad = torch.enable_grad() if args.grad else torch.no_grad()
    status = make_console(stderr=True).status(f"comparing {args.target} ({config.mode}, {config.kernel_backend})")
    with status, grad:
        report = airgraph.compare(
            fn, *fargs, config=config, rtol=args.rtol, atol=args.atol, dump_dir=args.dump_dir, **fkwargs
        )
    console.print(str(report), highlight=False, markup=False, soft_wrap=True)
    if args.json:
        path = write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}", highlight=False)
    if args.write_config:
        with torch.enable_grad() if args.grad else torch.no_grad():
            _write_config(args.write_config, report, fn, fargs, fkwargs, args, console)
    return 0 if report.ok else 1


def _write_config(path: str, report: Any, fn: Any, fargs: Any, fkwargs: dict, args: Any, console: Console) -> None:
    """The fallback config written, checked with compare, and its speed cost measured."""
    import airgraph
    from airgraph.precision.fallback import call_times

    fix = report.fallback()
    fix.to_file(path)
    console.print(f"wrote the fallback config {path} (AIRGRAPH_CONFIG={path} compiles with it)", highlight=False)
    if report.ok:
        console.print("every value was within tolerance: the config is the one compared", highlight=False)
        return
    changed = {"aten_nodes": list(fix.fallback.aten_nodes), "keep_ops": list(fix.fallback.keep_ops)}
    off = [name for name, on in fix.passes if not on and getattr(report.config.passes, name)]
    console.print(f"fallback: {changed}" + (f", passes off: {off}" if off else ""), highlight=False, markup=False)
    checked = airgraph.compare(fn, *fargs, config=fix, rtol=args.rtol, atol=args.atol, **fkwargs)
    console.print("compare with it: " + ("ok" if checked.ok else "DIVERGES"), highlight=False)
    times = call_times(fn, *fargs, config=report.config, fallback=fix, **fkwargs)
    console.print(
        f"call time: {times['without_s'] * 1e3:.3f} ms without the fallback, {times['with_s'] * 1e3:.3f} ms with it",
        highlight=False,
    )
