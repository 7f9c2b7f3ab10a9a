"""Concrete shapes of a dynamic-shape graph for one call: what the records say and what a static kernel is built for.

A graph compiled with dynamic shapes holds symbolic sizes (``s0``, ``2*s0 + 1``) in its values' metadata. The
arguments of one call bind each symbol to a number (:func:`bind`); with those bindings every value of the graph
has concrete sizes and strides (:func:`concrete`, :func:`spec`), computed without running anything. A symbol no
input binds (an unbacked size, from data: ``nonzero``, ``.item()``) has no value before the graph runs:
:func:`data_dependent` finds such segments, which static kernels do not cover.

A spec is plain JSON (``{"dtype", "shape", "stride"}`` for a tensor, ``{"value"}`` otherwise); a list of specs is
what a kernel is built for, and :func:`shape_key_of` turns it into the shape key of lowering/keys.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

__all__ = [
    "Bindings",
    "bind",
    "concrete",
    "data_dependent",
    "dtype_name",
    "layout_name",
    "shape_id",
    "shape_key_of",
    "spec",
    "symbolic_positions",
]

Bindings = dict[sympy.Symbol, int]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bind(symbolic: Iterable[Any], values: Iterable[Any], bindings: Bindings | None = None) -> Bindings:
    """Each symbol that is a whole size, stride or SymInt of ``symbolic`` (traced values) bound to the number at the
    same place in ``values`` (one call's arguments)."""
    bindings = {} if bindings is None else bindings
    for sym, value in zip(symbolic, values):  # noqa: B905 (a split graph's device part reads more than the inputs)
        if isinstance(sym, torch.Tensor) and isinstance(value, torch.Tensor):
            pairs = [*zip(sym.shape, value.shape), *zip(sym.stride(), value.stride())]  # noqa: B905
        else:
            pairs = [(sym, value)]
        for s, v in pairs:
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol) and isinstance(v, int):
                bindings[s.node.expr] = int(v)
    return bindings


def concrete(value: Any, bindings: Bindings) -> Any:
    """An int for a SymInt whose symbols are bound (None when one is not: data-dependent); others unchanged."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = sympy.sympify(sympy.sympify(value.node.expr).xreplace(bindings))
        if not expr.is_number:
            return None
        return int(expr) if isinstance(value, torch.SymInt) else (bool(expr) if expr.is_Boolean else float(expr))
    return value


def layout_name(shape: list[int], stride: list[int]) -> str:
    """ "contiguous", "channels_last" (4-d), "expanded" (a stride 0 over more than one element) or "strided"."""
    expected, contiguous = 1, True
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            contiguous = False
        expected *= size
    if contiguous:
        return "contiguous"
    if any(st == 0 and size > 1 for size, st in zip(shape, stride, strict=True)):
        return "expanded"
    if len(shape) == 4:
        _, c, h, w = shape
        if list(stride) == [h * w * c, 1, w * c, c]:
            return "channels_last"
    return "strided"


def spec(value: Any, bindings: Bindings) -> dict[str, Any] | None:
    """The JSON description of ``value`` (a traced or real value) for one call; None if a size is data-dependent."""
    if isinstance(value, torch.Tensor):
        shape = [concrete(d, bindings) for d in value.shape]
        stride = [concrete(d, bindings) for d in value.stride()]
        if None in shape or None in stride:
            return None
        return {
            "dtype": dtype_name(value.dtype),
            "shape": shape,
            "stride": stride,
            "layout": layout_name(shape, stride),
            "device": value.device.type,
        }
    value = concrete(value, bindings)
    if value is None:
        return None
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        value = str(value)
    return {"value": value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)}


def shape_key_of(specs: list[dict[str, Any]]) -> tuple:
    """The shape key (lowering/keys.py's ``shape_key``) of inputs with these specs."""
    return tuple((s["dtype"], tuple(s["shape"]), tuple(s["stride"])) if "dtype" in s else s["value"] for s in specs)


def shape_id(shape_key: tuple) -> str:
    """A short, stable name of a shape key (a folder name in the library)."""
    text = json.dumps(shape_key, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def symbolic_positions(values: list[Any]) -> list[int]:
    """Positions of the values whose sizes or strides are symbolic, or that are SymInts: what varies per call."""
    positions = []
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            dims = (*value.shape, *value.stride())
        else:
            dims = (value,)
        if any(isinstance(d, (torch.SymInt, torch.SymFloat, torch.SymBool)) for d in dims):
            positions.append(i)
    return positions


def data_dependent(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` (traced) has a size only known once data is computed (an unbacked symbol)."""
    return any(free_unbacked_symbols(v) for v in values if isinstance(v, (torch.Tensor, torch.SymInt)))
