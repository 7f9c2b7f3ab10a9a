"""Shared helpers for generated Python: binding values as globals, rendering arguments, compiling source.

Both the "aten" kernel backend and the executor generate straight-line Python instead of interpreting a
graph; this is the one place that knows how.
"""

from __future__ import annotations

import itertools
import linecache
import math
from collections.abc import Callable
from typing import Any

import torch

_sources = itertools.count()


class Emitter:
    """Collects the globals a generated function needs and renders FX arguments as Python expressions."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {}
        self._by_id: dict[int, str] = {}

    def bind(self, value: Any, hint: str) -> str:
        """A global name for ``value`` (one per distinct object)."""
        key = id(value)
        if key not in self._by_id:
            clean = "".join(c if c.isalnum() or c == "_" else "_" for c in hint)
            name = f"{clean}_{len(self._by_id)}"
            self._by_id[key] = name
            self.globals[name] = value
        return self._by_id[key]

    def op(self, target: Any) -> str:
        fn = target
        if isinstance(target, torch._ops.OpOverload):
            fn = getattr(target, "_op", target)  # skip OpOverload.__call__'s extra Python frame
        return self.bind(fn, getattr(target, "__name__", "op"))

    def arg(self, value: Any, names: dict[torch.fx.Node, str]) -> str:
        if isinstance(value, torch.fx.Node):
            return names[value]
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            inner = ", ".join(self.arg(v, names) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        return self.bind(value, "const")


def last_uses(items: list[list[torch.fx.Node]]) -> dict[int, list[torch.fx.Node]]:
    """For steps that each read some nodes: which nodes are read for the last time at each step."""
    last: dict[torch.fx.Node, int] = {}
    for step, reads in enumerate(items):
        for node in reads:
            last[node] = step
    frees: dict[int, list[torch.fx.Node]] = {}
    for node, step in last.items():
        frees.setdefault(step, []).append(node)
    return frees


def compile_function(source: str, scope: dict[str, Any], name: str, label: str) -> Callable[..., Any]:
    """Compile generated ``source`` defining ``name``; tracebacks show its lines (registered in linecache)."""
    filename = f"<airgraph-{label}-{next(_sources)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), scope)
    fn = scope[name]
    fn.source = source
    return fn
