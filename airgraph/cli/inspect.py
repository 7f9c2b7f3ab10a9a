"""``airgraph inspect``: compile a model with airgraph, run it once, and print what was compiled."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from airgraph.cli.common import (
    DEVICE_HELP,
    EXAMPLE_SIGNATURE,
    CliError,
    add_target_options,
    config_from,
    load_target,
    make_console,
)

__all__ = ["add_parsers"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    ins = sub.add_parser(
        "inspect",
        help="compile a model with airgraph and show its graphs, passes, segments and nodes",
        description="Compile TARGET with airgraph, run it once (airgraph.explain) and print the report. "
        "TARGET is 'tiny-llama' (the built-in model), a path to a .py file, or package.module[:attr]; a file "
        f"or module must define `{EXAMPLE_SIGNATURE}` (with :attr, that attribute instead).",
    )
    ins.add_argument("--mode", default=None, help=docs["mode"])
    ins.add_argument("--kernel-backend", default=None, help=docs["kernel_backend"])
    ins.add_argument("--json", default=None, metavar="PATH", help="also write report.to_dict() as JSON")
    ins.add_argument(
        "--grad", action="store_true", help="keep autograd on (default: run under torch.no_grad, an inference graph)"
    )
    add_target_options(
        ins,
        device_help=f"{DEVICE_HELP}; cuda without a GPU plans on fake CUDA tensors (placements, segments and streams "
        "as the GPU run would have them; nothing runs)",
    )
    ins.set_defaults(handler=cmd_inspect)


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    import torch

    import airgraph
    from airgraph.bench.results import write_json
    from airgraph.report.render import render_report

    config = config_from({"mode": args.mode, "kernel_backend": args.kernel_backend})
    # --device cuda without a GPU: build on the CPU, then plan on fake CUDA tensors (compiles, runs nothing).
    planning = args.device.startswith("cuda") and not torch.cuda.is_available()
    target_device = args.device
    fn, fargs, fkwargs = load_target(args, device="cpu" if planning else None)
    grad = torch.enable_grad() if args.grad else torch.no_grad()
    what = (
        f"planning {args.target} for {target_device} (no GPU here: fake tensors, nothing runs)"
        if planning
        else (f"compiling {args.target}")
    )
    status = make_console(stderr=True).status(f"{what} with airgraph ({config.mode}, {config.kernel_backend})")
    with status, grad:
        if planning:
            from airgraph.report.explain import PlanError, plan

            try:
                report = plan(fn, *fargs, device=target_device, config=config, **fkwargs)
            except PlanError as exc:  # the model needs a value fake tensors do not have
                raise CliError(f"{exc} (here: --device cpu runs it on this machine)", code=1) from None
        else:
            report = airgraph.explain(fn, *fargs, config=config, **fkwargs)
    render_report(report, console)
    if args.json:
        path = write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}", highlight=False)
    return 0
