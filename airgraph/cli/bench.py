"""``airgraph demo`` and ``airgraph bench``: the tiny LLaMA decode step and the two-branch multi-stream model.

Exit code 1 when a mode's outputs differ from eager."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from airgraph.bench import DEFAULT_STEPS, DEFAULT_WARMUP, DTYPE_NAMES, MODE_ALIASES, MODES
from airgraph.cli.common import CliError, make_console

__all__ = ["DEMO_SETTINGS", "add_parsers"]

# What `airgraph demo` measures; its time goes mostly to the two C++ compiles (torch.compile and airgraph
# max-autotune), not to the decode steps.
# None: run_bench's default (DEFAULT_STEPS, DEFAULT_WARMUP, decode.default_modes(device)).
DEMO_SETTINGS: dict[str, Any] = {
    "preset": "tiny",
    "batch": 1,
    "steps": None,
    "warmup": None,
    "kernel_backend": "inductor",
    "modes": None,
}


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    demo = sub.add_parser(
        "demo",
        help="compare eager, torch.compile and airgraph on the tiny LLaMA decode step",
        description="Run the decode-step benchmark of the built-in tiny LLaMA on the default device "
        "(CUDA when available), print a table and write a JSON report. Exits 1 if any mode's outputs "
        "differ from eager.",
    )
    demo.add_argument("--output", default="airgraph-demo.json", help="JSON report path (default: %(default)s)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(handler=cmd_demo)

    b = sub.add_parser(
        "bench",
        help="measure the tiny LLaMA decode step under chosen modes",
        description="Decode-step benchmark of the built-in tiny LLaMA: per-step latency (median, p10, p90), "
        "speedup over eager, compile time, CUDA graphs captured, and a comparison of every step's logits "
        "with eager. Exits 1 if any mode's outputs differ from eager.",
    )
    b.add_argument(
        "--model",
        default="tiny-llama",
        choices=["tiny-llama", "two-branch"],
        help="tiny-llama: the decode step under --modes; two-branch: the multi-stream model, side streams vs one "
        "stream, in airgraph --mode (default: %(default)s)",
    )
    b.add_argument(
        "--mode",
        default="reduce-overhead",
        choices=["max-autotune", "reduce-overhead"],
        help="two-branch only: the airgraph mode (default: %(default)s)",
    )
    b.add_argument("--preset", default="tiny", help="model preset: tiny, small, micro, 1b, 8b (default: %(default)s)")
    b.add_argument("--batch", type=int, default=1, help="sequences per decode step (default: %(default)s)")
    b.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps (default: %(default)s)")
    b.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps (default: %(default)s)")
    b.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated modes, from: {', '.join(MODES)} (aliases: {', '.join(MODE_ALIASES)}); "
        "default: all that run on the device",
    )
    b.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    b.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES))
    b.add_argument("--kernel-backend", default="inductor", help=f"airgraph modes only. {docs['kernel_backend']}")
    b.add_argument("--prompt-len", type=int, default=8, help="tokens prefilled before decoding (default: 8)")
    b.add_argument("--seed", type=int, default=0, help="weights and tokens seed (default: 0)")
    b.add_argument("--output", default=None, help="write the JSON result here")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.set_defaults(handler=cmd_bench)


def _run_bench(show_progress: bool, **kwargs: Any) -> dict[str, Any]:
    from airgraph.bench import decode as bench

    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: run_bench's default
    try:
        return bench.run_bench(progress=show_progress, console=make_console(stderr=True), **kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _finish(result: dict[str, Any], output: str | None, console: Console, *, show: bool = True) -> int:
    from airgraph.bench.decode import print_results
    from airgraph.bench.results import write_json

    if show:
        print_results(result, console)
    if output:
        path = write_json(result, output)
        console.print(f"wrote {path}", highlight=False)
    bad = [r["mode"] for r in result["results"] if not r["ok"]]
    if bad:
        settings = result["settings"]
        console.print(
            f"[red]outputs differ from eager[/] (atol {settings['atol']}, rtol {settings['rtol']}): {', '.join(bad)}"
        )
        return 1
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from airgraph.bench import decode as bench

    device = bench.resolve_device("auto")
    console.print(
        f"[bold]airgraph demo[/]: tiny LLaMA decode step on {device}: eager vs torch.compile vs airgraph "
        "(the first call of each compiled mode includes its compile)"
    )
    if device.type != "cuda":
        console.print(
            "[dim]note: no CUDA device, so 'airgraph reduce-overhead' runs the same executor as max-autotune, "
            "uncaptured (CUDA graphs need CUDA), and torch.compile's reduce-overhead is left out.[/]"
        )
    result = _run_bench(not args.no_progress, device=str(device), **DEMO_SETTINGS)
    bench.print_results(result, console)
    console.print("[bold]in-graph multi-stream[/]: two independent branches on side streams vs on one stream")
    streams = _run_multistream(console, device=str(device), mode="reduce-overhead", steps=50, cases=["small"])
    result["multistream"] = streams
    code = _finish(result, args.output, console, show=False)
    if not all(r["ok"] for r in streams["results"].values()):
        console.print("[red]the two-branch model's outputs differ between side streams and one stream[/]")
        return 1
    return code


def _run_multistream(console: Console, **kwargs: Any) -> dict[str, Any]:
    from airgraph.bench.streams import multistream_table, run_multistream

    try:
        result = run_multistream(**kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    console.print(multistream_table(result))
    return result


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.model == "two-branch":
        from airgraph.bench.results import write_json

        result = _run_multistream(
            console, device=args.device, mode=args.mode, kernel_backend=args.kernel_backend, steps=args.steps
        )
        if args.output:
            console.print(f"wrote {write_json(result, args.output)}", highlight=False)
        return 0 if all(r["ok"] for r in result["results"].values()) else 1
    result = _run_bench(
        not args.no_progress,
        preset=args.preset,
        batch=args.batch,
        steps=args.steps,
        warmup=args.warmup,
        modes=args.modes,
        device=args.device,
        dtype=args.dtype,
        kernel_backend=args.kernel_backend,
        prompt_len=args.prompt_len,
        seed=args.seed,
    )
    return _finish(result, args.output, console)
