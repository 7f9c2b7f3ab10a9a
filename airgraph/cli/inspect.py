"""``airgraph inspect``: compile a model with airgraph, run it once, and print what was compiled."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from airgraph.cli.common import EXAMPLE_SIGNATURE, CliError, load_example, make_console
from airgraph.config import CompilerConfig

__all__ = ["add_parsers"]


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    ins = sub.add_parser(
        "inspect",
        help="compile a model with airgraph and show its graphs, passes, segments and nodes",
        description="Compile TARGET with airgraph, run it once (airgraph.explain) and print the report. "
        "TARGET is 'tiny-llama' (the built-in model), a path to a .py file, or package.module[:attr]; a file "
        f"or module must define `{EXAMPLE_SIGNATURE}` (with :attr, that attribute instead).",
    )
    ins.add_argument("target", metavar="SCRIPT_OR_MODEL", help="tiny-llama, path/to/file.py or package.module[:attr]")
    ins.add_argument("--mode", default=None, help=docs["mode"])
    ins.add_argument("--kernel-backend", default=None, help=docs["kernel_backend"])
    ins.add_argument("--json", default=None, metavar="PATH", help="also write report.to_dict() as JSON")
    ins.add_argument(
        "--grad", action="store_true", help="keep autograd on (default: run under torch.no_grad, an inference graph)"
    )
    llama = ins.add_argument_group("tiny-llama options")
    llama.add_argument("--preset", default="tiny", help="tiny, small, micro (default: %(default)s)")
    llama.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    llama.add_argument("--batch", type=int, default=1)
    llama.add_argument("--prompt-len", type=int, default=8, help="prefill length; decode runs at this position")
    llama.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when available), cpu, cuda, cuda:N; cuda without a GPU plans on fake CUDA tensors "
        "(placements, segments and streams as the GPU run would have them; nothing runs)",
    )
    ins.set_defaults(handler=cmd_inspect)


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    import torch

    import airgraph
    from airgraph.bench.results import write_json
    from airgraph.report.render import render_report

    config = CompilerConfig()
    try:
        if args.mode is not None:
            config.mode = args.mode
        if args.kernel_backend is not None:
            config.kernel_backend = args.kernel_backend
    except ValueError as exc:
        raise CliError(str(exc)) from None
    # --device cuda without a GPU: build on the CPU, then plan on fake CUDA tensors (compiles, runs nothing).
    planning = args.device.startswith("cuda") and not torch.cuda.is_available()
    target_device = args.device
    if planning:
        args.device = "cpu"
    if args.target == "tiny-llama":
        fn, fargs, fkwargs = _tiny_llama_example(args)
    else:
        fn, fargs, fkwargs = load_example(args.target)
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


def _tiny_llama_example(args: argparse.Namespace) -> tuple[Any, tuple, dict]:
    import torch

    from airgraph.bench import decode as bench
    from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs

    try:
        device = bench.resolve_device(args.device)
        model = build_tiny_llama(args.preset, max_batch_size=args.batch, device=device)
        prefill = prefill_inputs(model.config, args.batch, args.prompt_len, device=device)
        if args.phase == "prefill":
            return model, prefill, {}
        decode = decode_inputs(model.config, args.batch, args.prompt_len, device=device)
    except ValueError as exc:
        raise CliError(f"tiny-llama: {exc}") from None
    with torch.no_grad():
        model(*prefill)  # caches hold the prompt, as in generation
    return model, decode, {}
