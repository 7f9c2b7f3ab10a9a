"""What every subcommand shares: the usage error, the console, and loading a user's example (a .py file or a
module defining ``airgraph_example()``). Imports no torch."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["EXAMPLE_SIGNATURE", "CliError", "load_example", "load_file", "make_console"]

EXAMPLE_SIGNATURE = "def airgraph_example() -> (fn_or_module, args) or (fn_or_module, args, kwargs)"
# Width of tables when output is not a terminal (a file, a pipe): rich would cut them at 80 columns.
REDIRECTED_WIDTH = 160


class CliError(Exception):
    """A usage error: printed as ``airgraph <command>: error: ...`` and exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def make_console(*, stderr: bool = False) -> Console:
    """A rich console; when redirected, wide enough that tables are not cut."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else REDIRECTED_WIDTH)


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
