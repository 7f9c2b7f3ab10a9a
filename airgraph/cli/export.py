"""``airgraph export`` and ``airgraph run``: the command-line side of airgraph.export.

``airgraph run`` never reaches this module when invoked as a command: ``airgraph.cli.main`` hands it to
``airgraph.export.runner`` before anything imports torch; the ``run`` parser here exists for ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from airgraph.cli.common import EXAMPLE_SIGNATURE, CliError, add_target_options, load_file, load_target, make_console
from airgraph.config import CompilerConfig

if TYPE_CHECKING:
    import torch

__all__ = ["EXPORT_DTYPES", "add_parsers", "cmd_export", "parse_input_spec"]

# The packages of the `export` extra (pyproject.toml) that exporting imports.
EXPORT_EXTRA_MODULES = frozenset({"onnx", "onnxscript", "onnxruntime", "onnx_ir"})
EXPORT_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


def add_parsers(sub: Any, docs: dict[str, str]) -> None:
    exp = sub.add_parser(
        "export",
        help="export a model as an ONNX model that runs without PyTorch (dynamo_export)",
        description="Capture MODEL through Dynamo as one graph and write an ONNX export (the .onnx, dynamo.pbtxt, "
        "export.json, reference inputs/outputs, external weight files past the threshold) into --export-path. "
        "MODEL is 'tiny-llama' (the built-in model, prefill step), or with --input a module: path/to/file.py:attr or "
        "package.module:attr naming an nn.Module or a zero-argument factory of one (exported in eval mode); "
        f"without --input, a .py file or module[:attr] as in `airgraph inspect` ({EXAMPLE_SIGNATURE}). "
        "Exits 1 if the model cannot be exported (graph break, data-dependent control flow, unsupported op).",
    )
    exp.add_argument(
        "--input",
        action="append",
        default=None,
        metavar="SHAPE[:DTYPE]",
        help="an example input, e.g. 2x16:float32 or 2x16:int64 (repeat per input; default dtype float32; "
        f"dtypes: {', '.join(EXPORT_DTYPES)}): floats are standard normal, integers uniform in [0, --int-high)",
    )
    exp.add_argument("--int-high", type=int, default=16, help="integer inputs lie in [0, N) (default: %(default)s)")
    exp.add_argument("--dynamic", action="store_true", help="batch and sequence dims (dims 0 and 1 of each input) vary")
    exp.add_argument("--export-path", default="export_file", help="output folder (default: %(default)s)")
    exp.add_argument("--export-name", default="export", help="model file name, without .onnx (default: %(default)s)")
    exp.add_argument(
        "--external-weights-threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help=docs["export.external_weights_threshold"],
    )
    exp.add_argument(
        "--record-module-stack", action="store_true", help=docs["export.experimental.enable_record_nn_module_stack"]
    )
    exp.add_argument("--seed", type=int, default=0, help="weights and example inputs seed (default: 0)")
    llama = add_target_options(
        exp,
        metavar="MODEL",
        target_help="tiny-llama, path/to/file.py[:attr] or package.module[:attr]",
        decode=False,
    )
    llama.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="KV cache rows, the largest batch (default: --batch; with --dynamic, at least 8)",
    )
    exp.set_defaults(handler=cmd_export)

    run = sub.add_parser(
        "run",
        help="run an export with onnxruntime, without PyTorch",
        description="airgraph run EXPORT_DIR [--inputs FILE.npz] [--check] [--expected FILE.npz] [--output FILE.npz]: "
        "see `airgraph run --help` (it runs airgraph.export.runner in a process that never imports torch).",
        add_help=False,
    )
    run.add_argument("rest", nargs=argparse.REMAINDER)
    run.set_defaults(handler=lambda args, console: _run_main(args.rest))


def _run_main(argv: list[str]) -> int:
    from airgraph.export.runner import main as run_main

    return run_main(argv, prog="airgraph run")


def parse_input_spec(text: str) -> tuple[tuple[int, ...], str]:
    """``"2x16:int64"`` -> ``((2, 16), "int64")``; the dtype defaults to float32."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    if dtype not in EXPORT_DTYPES:
        raise CliError(f"--input {text!r}: unknown dtype {dtype!r}; allowed: {', '.join(EXPORT_DTYPES)}")
    try:
        shape = tuple(int(d) for d in shape_text.lower().split("x")) if shape_text else ()
    except ValueError:
        raise CliError(f"--input {text!r}: the shape must be sizes joined by 'x', e.g. 2x16") from None
    if any(d < 0 for d in shape):
        raise CliError(f"--input {text!r}: sizes must be >= 0")
    return shape, dtype


def _example_tensor(shape: tuple[int, ...], dtype: str, generator: torch.Generator, int_high: int) -> torch.Tensor:
    import torch

    torch_dtype = getattr(torch, dtype)
    if torch_dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if torch_dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(torch_dtype)
    return torch.randint(0, int_high, shape, generator=generator).to(torch_dtype)


def _export_target(args: argparse.Namespace) -> tuple[Any, tuple, dict, str]:
    """(module, args, kwargs, description) for `airgraph export`."""
    import torch

    if args.target == "tiny-llama":
        max_batch = args.max_batch_size or (max(args.batch, 8) if args.dynamic else args.batch)
        model, inputs, _ = load_target(args, device="cpu", seed=args.seed, max_batch_size=max_batch)
        return model, inputs, {}, f"tiny LLaMA {args.preset!r} prefill, batch {args.batch}, seq_len {args.prompt_len}"
    if not args.input:
        fn, fargs, fkwargs = load_target(args)
        if isinstance(fn, torch.nn.Module):
            return fn, fargs, fkwargs, args.target
        module, fargs, fkwargs = _function_module(fn, fargs, fkwargs)
        return module, fargs, fkwargs, args.target
    file_or_module, _, attr = args.target.rpartition(":")
    if not file_or_module or not attr:
        raise CliError(f"{args.target}: with --input, give path/to/file.py:attr or package.module:attr")
    if file_or_module.endswith(".py"):
        if not Path(file_or_module).is_file():
            raise CliError(f"{file_or_module}: no such file")
        module_obj = load_file(Path(file_or_module))
    else:
        try:
            module_obj = importlib.import_module(file_or_module)
        except ModuleNotFoundError as exc:
            raise CliError(f"{args.target}: cannot import {file_or_module!r} ({exc})") from None
    value = getattr(module_obj, attr, None)
    if value is None:
        raise CliError(f"{file_or_module} has no attribute {attr!r}")
    if not isinstance(value, torch.nn.Module) and callable(value):
        value = value()
    if not isinstance(value, torch.nn.Module):
        raise CliError(f"{args.target} is a {type(value).__name__}, not an nn.Module or a factory of one")
    generator = torch.Generator().manual_seed(args.seed)
    specs = [parse_input_spec(text) for text in args.input]
    tensors = tuple(_example_tensor(shape, dtype, generator, args.int_high) for shape, dtype in specs)
    return value.eval(), tensors, {}, args.target


def _function_module(fn: Any, args: tuple, kwargs: dict) -> tuple[torch.nn.Module, tuple, dict]:
    """A module whose forward calls ``fn``, for exporting a plain function; keyword arguments that can be
    passed by position are (torch.export's dynamic shapes do not handle a ``**kwargs`` forward)."""
    import inspect

    import torch

    class FunctionModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.fn(*args, **kwargs)

    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return FunctionModule(), args, kwargs
    return FunctionModule(), tuple(bound.args), dict(bound.kwargs)


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from airgraph.export.errors import ExportError, ExportPathError
    from airgraph.export.layout import ExportLayout

    config = CompilerConfig()
    try:  # paths and options first: refused before any import of torch or onnx, or any tracing
        if args.external_weights_threshold is not None:
            config.export.external_weights_threshold = args.external_weights_threshold
        config.export.experimental.enable_record_nn_module_stack = args.record_module_stack
        layout = ExportLayout(Path(args.export_path), args.export_name)
        layout.check_targets()
    except (ValueError, ExportPathError) as exc:
        raise CliError(str(exc)) from None
    export_model = _exporter()
    model, fargs, fkwargs, what = _export_target(args)
    status = make_console(stderr=True).status(f"exporting {what}")
    try:
        with status:
            result = export_model(model, fargs, fkwargs, layout=layout, dynamic=args.dynamic, config=config)
    except ExportPathError as exc:
        raise CliError(str(exc)) from None
    except ExportError as exc:
        raise CliError(str(exc), code=1) from None
    _print_export(result, what, console)
    return 0


def _exporter() -> Any:
    """``export_model``, or a usage error naming the extra to install when the exporter's packages are missing."""
    try:
        from airgraph.export.exporter import export_model
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in EXPORT_EXTRA_MODULES:
            raise CliError(
                f"airgraph export needs the {exc.name!r} package: install the export extra, "
                "pip install 'airgraph[export]'"
            ) from None
        raise
    return export_model


def _print_export(result: Any, what: str, console: Console) -> None:
    meta = result.metadata
    t = meta["timings_s"]

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    say(
        f"exported {what} to {result.root} in {t['total']:.1f} s "
        f"(capture {t['capture']:.1f}, convert {t['convert']:.1f}, write {t['write']:.2f})"
    )
    weights = set(meta["weights"]["files"].values())
    roles = {
        meta["model_file"]: f"the model, ONNX opset {meta['opset']}",
        "dynamo.pbtxt": "the graph as protobuf text, weights summarized",
        "export.json": "metadata: inputs, outputs, dynamic dims, versions, file hashes",
        "reference_inputs.npz": "example inputs (airgraph run's default)",
        "reference_outputs.npz": "eager PyTorch outputs for them (airgraph run --check)",
    }
    order = [*roles]
    for rel in sorted(set(result.files) - weights, key=lambda r: order.index(r) if r in order else len(order)):
        size = (result.root / rel).stat().st_size
        say(f"  {rel:<28} {_size(size):>10}  {roles.get(rel.rsplit('/', 1)[-1], '')}")
    if weights:
        total = sum((result.root / rel).stat().st_size for rel in weights)
        say(f"  {f'{len(weights)} weight files':<28} {_size(total):>10}  external data, one file per weight")

    def sig(values: list[dict]) -> str:
        return ", ".join(f"{v['name']} {v['dtype']}[{', '.join(str(d) for d in v['shape'])}]" for v in values)

    say(f"inputs:  {sig(meta['inputs'])}")
    say(f"outputs: {sig(meta['outputs'])}")
    if meta["dynamic_dims"]:
        dims = ", ".join(
            f"{n} in [{d['min']}, {d['max'] if d['max'] is not None else 'inf'}]"
            for n, d in meta["dynamic_dims"].items()
        )
        say(f"dynamic dims: {dims} (the range torch.export validated)")
    if meta["pinned_dims"]:
        pinned = ", ".join(f"{axis} = {size}" for axis, size in meta["pinned_dims"].items())
        say(f"static despite --dynamic (the model or torch.export fixed them): {pinned}")
    say(f"run it without PyTorch: airgraph run {result.root} --check")
