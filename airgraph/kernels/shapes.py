"""Concrete shapes of a dynamic-shape graph for one call: what the records say and what a static kernel is built for.

A graph compiled with dynamic shapes holds symbolic sizes (``s0``, ``2*s0 + 1``) in its values' metadata. The
arguments of one call bind each symbol to a number (:func:`bind`); with those bindings every value of the graph
has concrete sizes and strides (:func:`concrete`, :func:`spec`), computed without running anything. A symbol no
input binds (an unbacked size, from data: ``nonzero``, ``.item()``) has no value before the graph runs:
:func:`data_dependent` finds such segments, which static kernels do not cover.

A spec is plain JSON (``{"dtype", "shape", "stride"}`` for a tensor, ``{"value"}`` otherwise); a list of specs is
what a kernel is built for, and :func:`shape_key_of` turns it into the shape key of lowering/keys.py.

:class:`VaryingKey` is what a call of a segment's static kernels is told apart by (kernels/dispatch.py's
segments and kernels/warm.py's warm graphs both use it): a cheap dict key per call, the library's shape id of a
new key and a readable label.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airgraph.graph.codegen import compile_function
from airgraph.lowering.keys import shape_key

__all__ = [
    "Bindings",
    "VaryingKey",
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


class VaryingKey:
    """What tells one call of a segment's static kernels from another: the inputs that vary (:func:`symbolic_positions`
    of the traced inputs: their sizes and strides, and SymInts' values), read from a call's arguments.

    - ``key(args)``: a dict key, computed every call: a generated function (straight-line Python, no loop) that
      returns the varying tensors' sizes, then their strides, then the varying values;
    - :meth:`shape_id_of`: the library's name of the call's full shape key (once per new key);
    - :meth:`label`: the key readably (the sizes and values, "static" when nothing varies), what reports list;
      :meth:`spec_label` the same for a key given as specs.
    """

    def __init__(self, traced: Sequence[Any], positions: Sequence[int] | None = None) -> None:
        """``traced``: the inputs as traced; ``positions``: those the kernels read, in order (all when None), which
        are also where a call's arguments hold them."""
        self.positions = positions
        covered = range(len(traced)) if positions is None else positions
        varying = [covered[i] for i in symbolic_positions([traced[p] for p in covered])]
        self.tensors = [i for i in varying if isinstance(traced[i], torch.Tensor)]
        self.values = [i for i in varying if not isinstance(traced[i], torch.Tensor)]
        self.key: Callable[[Sequence[Any]], tuple] = _key_function(self.tensors, self.values)

    def shape_id_of(self, args: Sequence[Any]) -> str:
        """The shape id (the library's name) of the shape key of the inputs the kernels read."""
        inputs = list(args) if self.positions is None else [args[p] for p in self.positions]
        return shape_id(shape_key(inputs))

    def label(self, args: Sequence[Any]) -> str:
        """The sizes of the varying tensors and the varying values of a call, e.g. ``"[2, 8] 5"``."""
        return _label([args[i].shape for i in self.tensors], [args[i] for i in self.values])

    def spec_label(self, specs: Sequence[dict[str, Any]]) -> str:
        """The label of a key given as specs, one per input (:func:`spec`)."""
        return _label([specs[i]["shape"] for i in self.tensors], [specs[i]["value"] for i in self.values])


def _label(shapes: list[Any], values: list[Any]) -> str:
    return " ".join([*(str(list(s)) for s in shapes), *(str(v) for v in values)]) or "static"


def _key_function(tensors: list[int], values: list[int]) -> Callable[[Sequence[Any]], tuple]:
    """``lambda args: (*[args[i].shape for i in tensors], *[args[i].stride() for i in tensors], *[args[i] for i in
    values])``, generated without the loops (under half the time per call on Python 3.11)."""
    items = [f"args[{i}].shape" for i in tensors] + [f"args[{i}].stride()" for i in tensors]
    items += [f"args[{i}]" for i in values]
    source = f"def key(args):\n    return ({''.join(f'{item}, ' for item in items)})\n"
    return compile_function(source, {}, "key", "varying-key")
