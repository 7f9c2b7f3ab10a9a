"""The ``airgraph`` command (also ``python -m airgraph``): demo, bench, inspect, export, run.

``airgraph run`` is dispatched to ``airgraph.export.runner`` before anything imports torch: this module
imports torch (and ``airgraph.bench``) only inside the commands that need it.

Exit codes: 0 success; 1 a mode's outputs differ from eager (demo, bench), a model that cannot be
exported (export), outputs that differ from the reference (run --check); 2 a usage error (bad option,
unknown subcommand, a target that cannot be loaded, a refused export path).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import airgraph
from airgraph.config import CompilerConfig
from airgraph.report.render import render_report

__all__ = ["DEMO_SETTINGS", "CliError", "build_parser", "load_example", "main"]

# What `airgraph demo` measures: about 30 s on a 2-core CPU with cold Inductor caches, mostly the two C++
# compiles (torch.compile and airgraph max-autotune); the decode steps themselves take well under a second.
# None: run_bench's default (bench.DEFAULT_STEPS, bench.DEFAULT_WARMUP, bench.default_modes(device)).
DEMO_SETTINGS: dict[str, Any] = {
    "preset": "tiny",
    "batch": 1,
    "steps": None,
    "warmup": None,
    "kernel_backend": "inductor",
    "modes": None,
}
EXAMPLE_SIGNATURE = "def airgraph_example() -> (fn_or_module, args) or (fn_or_module, args, kwargs)"


class CliError(Exception):
    """A usage error: printed as ``airgraph: error: ...`` and exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- parser ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from airgraph import bench
    from airgraph.export.commands import add_export_parsers

    docs = CompilerConfig().describe()
    parser = argparse.ArgumentParser(
        prog="airgraph", description="airgraph: a graph-mode torch.compile backend for CUDA GPUs and CPUs."
    )
    parser.add_argument("--version", action="version", version=f"airgraph {airgraph.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    b.add_argument("--preset", default="tiny", help="model preset: tiny, small, micro (default: %(default)s)")
    b.add_argument("--batch", type=int, default=1, help="sequences per decode step (default: %(default)s)")
    b.add_argument("--steps", type=int, default=bench.DEFAULT_STEPS, help="timed steps (default: %(default)s)")
    b.add_argument("--warmup", type=int, default=bench.DEFAULT_WARMUP, help="untimed steps (default: %(default)s)")
    b.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated modes, from: {', '.join(bench.MODES)} (aliases: {', '.join(bench.MODE_ALIASES)}); "
        "default: all that run on the device",
    )
    b.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    b.add_argument("--dtype", default="float32", choices=list(bench.DTYPES))
    b.add_argument("--kernel-backend", default="inductor", help=f"airgraph modes only. {docs['kernel_backend']}")
    b.add_argument("--prompt-len", type=int, default=8, help="tokens prefilled before decoding (default: 8)")
    b.add_argument("--seed", type=int, default=0, help="weights and tokens seed (default: 0)")
    b.add_argument("--output", default=None, help="write the JSON result here")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.set_defaults(handler=cmd_bench)

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
    add_export_parsers(sub, docs)
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
    console = Console()
    try:
        return args.handler(args, console)
    except CliError as exc:
        print(f"airgraph {args.command}: error: {exc}", file=sys.stderr)
        return exc.code


# -- demo and bench -------------------------------------------------------------------------------------
def _run_bench(console: Console, show_progress: bool, **kwargs: Any) -> dict[str, Any]:
    from airgraph import bench

    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: run_bench's default
    try:
        return bench.run_bench(progress=show_progress, console=Console(stderr=True), **kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _finish(result: dict[str, Any], output: str | None, console: Console, *, show: bool = True) -> int:
    from airgraph import bench

    if show:
        bench.print_results(result, console)
    if output:
        path = bench.write_json(result, output)
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
    from airgraph import bench

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
    result = _run_bench(console, not args.no_progress, device="auto", **DEMO_SETTINGS)
    bench.print_results(result, console)
    console.print("[bold]in-graph multi-stream[/]: two independent branches on side streams vs on one stream")
    streams = _run_multistream(console, device="auto", mode="reduce-overhead", steps=50, cases=["small"])
    result["multistream"] = streams
    code = _finish(result, args.output, console, show=False)
    if not all(r["ok"] for r in streams["results"].values()):
        console.print("[red]the two-branch model's outputs differ between side streams and one stream[/]")
        return 1
    return code


def _run_multistream(console: Console, **kwargs: Any) -> dict[str, Any]:
    from airgraph.bench_streams import multistream_table, run_multistream

    try:
        result = run_multistream(**kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    console.print(multistream_table(result))
    return result


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.model == "two-branch":
        from airgraph import bench

        result = _run_multistream(
            console, device=args.device, mode=args.mode, kernel_backend=args.kernel_backend, steps=args.steps
        )
        if args.output:
            console.print(f"wrote {bench.write_json(result, args.output)}", highlight=False)
        return 0 if all(r["ok"] for r in result["results"].values()) else 1
    result = _run_bench(
        console,
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


# -- inspect --------------------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    import torch

    from airgraph import bench

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
    status = Console(stderr=True).status(f"{what} with airgraph ({config.mode}, {config.kernel_backend})")
    with status, grad:
        if planning:
            from airgraph.report.explain import plan

            report = plan(fn, *fargs, device=target_device, config=config, **fkwargs)
        else:
            report = airgraph.explain(fn, *fargs, config=config, **fkwargs)
    render_report(report, console)
    if args.json:
        path = bench.write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}", highlight=False)
    return 0


def _tiny_llama_example(args: argparse.Namespace) -> tuple[Any, tuple, dict]:
    import torch

    from airgraph import bench
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


def load_example(target: str) -> tuple[Any, tuple, dict]:
    """``(fn_or_module, args, kwargs)`` from a .py file's or a module's ``airgraph_example()``."""
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise CliError(f"{target}: no such file")
        module, attr, where = _load_file(path), "airgraph_example", str(path)
    else:
        module_name, _, attr = target.partition(":")
        attr = attr or "airgraph_example"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise CliError(
                f"{target}: cannot import {module_name!r} ({exc}); give tiny-llama, a .py file or package.module[:attr]"
            ) from None
        where = f"module {module_name}"
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        what = "does not define" if factory is None else "has a non-callable"
        raise CliError(f"{where} {what} {attr}(); expected: {EXAMPLE_SIGNATURE.replace('airgraph_example', attr)}")
    return _check_example(factory(), f"{where}: {attr}()")


def _check_example(value: Any, where: str) -> tuple[Any, tuple, dict]:
    expected = "expected (fn_or_module, args) or (fn_or_module, args, kwargs) with args a tuple/list, kwargs a dict"
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise CliError(f"{where} returned {type(value).__name__}; {expected}")
    fn, args = value[0], value[1]
    kwargs = value[2] if len(value) == 3 else {}
    if not callable(fn):
        raise CliError(f"{where}: the first item ({type(fn).__name__}) is not callable; {expected}")
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        raise CliError(f"{where}: args must be a tuple/list and kwargs a dict; {expected}")
    return fn, tuple(args), kwargs


def _load_file(path: Path) -> Any:
    """Execute a .py file as a fresh module (not as __main__); its folder is importable meanwhile."""
    name = f"_airgraph_example_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliError(f"{path}: cannot load as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(folder)
    return module
