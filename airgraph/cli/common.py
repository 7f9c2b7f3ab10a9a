"""What every subcommand shares: the usage error, the console, and naming the model a command runs (inspect, tune,
export): the TARGET argument with its tiny-llama options (``add_target_options``) and loading it (``load_target``:
the built-in tiny LLaMA, or a user's example, a .py file or a module defining ``airgraph_example()``). Imports no
torch; loading a target does."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from airgraph.config import CompilerConfig

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXAMPLE_SIGNATURE",
    "CliError",
    "add_target_options",
    "config_from",
    "load_example",
    "load_file",
    "load_target",
    "make_console",
]

EXAMPLE_SIGNATURE = "def airgraph_example() -> (fn_or_module, args) or (fn_or_module, args, kwargs)"
TARGET_HELP = "tiny-llama, path/to/file.py or package.module[:attr]"
DEVICE_HELP = "auto (CUDA when available), cpu, cuda, cuda:N"
# Width of tables when output is not a terminal (a file, a pipe): rich would cut them at 80 columns.
REDIRECTED_WIDTH = 160


class CliError(Exception):
    """A usage error: printed as ``airgraph <command>: error: ...`` and exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def config_from(options: dict[str, Any]) -> CompilerConfig:
    """A config with each option the command line gave (dotted names, e.g. ``"tuning.mode"``; None: the option's
    default); a value the option refuses is a usage error (exit 2) that names it."""
    nested: dict[str, Any] = {}
    for name, value in options.items():
        if value is not None:
            *groups, leaf = name.split(".")
            target = nested
            for group in groups:
                target = target.setdefault(group, {})
            target[leaf] = value
    config = CompilerConfig()
    try:
        config.update(nested)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return config


def make_console(*, stderr: bool = False) -> Console:
    """A rich console; when redirected, wide enough that tables are not cut."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else REDIRECTED_WIDTH)


def add_target_options(
    parser: argparse.ArgumentParser,
    *,
    metavar: str = "SCRIPT_OR_MODEL",
    target_help: str = TARGET_HELP,
    decode: bool = True,
    device_help: str = DEVICE_HELP,
) -> argparse._ArgumentGroup:
    """The ``target`` argument and the "tiny-llama options" group, for ``load_target``; added after the command's own
    options, which its usage lists first. ``decode``: the model runs here, a decode step (``--phase``'s default) or
    the prefill, on ``--device``, after a ``--prompt-len`` prompt; without it the prefill alone, on the CPU, its
    prompt ``--seq-len`` long (export's name for it). Returns the group, for a command's own tiny-llama options."""
    parser.add_argument("target", metavar=metavar, help=target_help)
    llama = parser.add_argument_group("tiny-llama options")
    llama.add_argument("--preset", default="tiny", help="tiny, small, micro, 1b, 8b (default: %(default)s)")
    if decode:
        llama.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    else:
        prefill_help = "prefill from empty KV caches (the caches are baked in)"
        llama.add_argument("--phase", default="prefill", choices=["prefill"], help=prefill_help)
    llama.add_argument("--batch", type=int, default=1, help="example batch size (default: %(default)s)")
    if decode:
        llama.add_argument("--prompt-len", type=int, default=8, help="prefill length; decode runs at this position")
        llama.add_argument("--device", default="auto", help=device_help)
    else:
        prompt_help = "example prompt length (default: %(default)s)"
        llama.add_argument("--seq-len", dest="prompt_len", metavar="SEQ_LEN", type=int, default=8, help=prompt_help)
    return llama


def load_target(
    args: argparse.Namespace,
    *,
    device: str | torch.device | None = None,
    seed: int = 0,
    max_batch_size: int | None = None,
) -> tuple[Any, tuple, dict]:
    """``(fn_or_module, args, kwargs)`` for ``add_target_options``' arguments: the tiny LLaMA built from its options
    (on ``device``, default ``--device``; weights and tokens from ``seed``; ``max_batch_size`` KV cache rows, default
    ``--batch``), else the example that ``args.target`` defines (``load_example``)."""
    if args.target != "tiny-llama":
        return load_example(args.target)
    import torch

    from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs

    try:
        if device is None:
            from airgraph.bench.decode import resolve_device

            device = resolve_device(args.device)
        model = build_tiny_llama(args.preset, seed=seed, max_batch_size=max_batch_size or args.batch, device=device)
        prefill = prefill_inputs(model.config, args.batch, args.prompt_len, seed=seed, device=device)
        if args.phase == "prefill":
            return model, prefill, {}
        decode = decode_inputs(model.config, args.batch, args.prompt_len, seed=seed, device=device)
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
        module, attr, where = load_file(path), "airgraph_example", str(path)
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


def load_file(path: Path) -> Any:
    """Execute a .py file as a fresh module (not as __main__); its folder is importable meanwhile. A file that
    does not compile, or raises while it runs, is a usage error naming the file and line."""
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
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise CliError(f"{path}:{exc.lineno}: {type(exc).__name__}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        frames = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(frames) if f.filename == spec.origin), "?")
        raise CliError(f"{path}:{line}: {type(exc).__name__}: {exc} (while loading the file)") from None
    finally:
        sys.path.remove(folder)
    return module
