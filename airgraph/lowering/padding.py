"""Capture sizes: whether a graph may run a batch padded up to a larger size, and how (``PadPlan``).

``reduce_overhead.capture_sizes`` replays one CUDA graph per size for every batch up to the largest, by padding
the batch dimension (a symbol, from ``dynamic=True`` or ``mark_dynamic``) with rows that are sliced off again.
That is right only if no op mixes rows along that dimension: a real row's values must not depend on a padded
row. This module decides it from the ATen graph, op by op, from the symbolic sizes of every node: an op whose
inputs or outputs hold the batch symbol must be one of a known set that keeps rows apart (pointwise ops, views
that keep the batch dimension whole, matmuls that do not contract over it, reductions and scans over other
dimensions, ...). Anything else, or the batch size used as a value, refuses padding with the op and the user's
line. A refused graph runs unpadded, one key per size, as without capture sizes.

Invariants: a plan pads every input dimension whose size is a multiple ``k*s`` of the batch symbol ``s`` to
``k*size`` and every SymInt input equal to ``s`` to the size; it slices every output dimension ``k*s`` back to
``k*batch``. Nothing here runs a graph.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from airgraph.graph.analysis import bound_arguments
from airgraph.graph.meta import tensors
from airgraph.graph.source import frames_of_text, user_source

__all__ = ["PadPlan", "PadRefusal", "plan_padding"]

aten = torch.ops.aten


@dataclass(frozen=True)
class PadPlan:
    """How to pad a call: input positions and dims, SymInt inputs, and how to slice the outputs back."""

    symbol: sympy.Symbol
    dim: int  # the capture dimension of ``source`` (the input the symbol was found in)
    source: int
    symints: tuple[int, ...]  # input positions whose value is the batch size
    padded: tuple[tuple[int, int, int], ...]  # (input position, dim, k): that dim is k * batch
    sliced: tuple[tuple[int, int, int], ...]  # (output index, dim, k): sliced back to k * batch
    scalars: tuple[tuple[int, Any], ...]  # (output index, expression): a SymInt output, evaluated at the batch
    # The smallest batch the graph is called with: Dynamo specializes a batch of 1 (and 0) into a graph of its
    # own, so the symbol's range starts at 2 and a capture size below that would never replay.
    smallest: int = 1

    def batch(self, args: list) -> int:
        """The real batch size of a call."""
        return args[self.source].shape[self.dim]


@dataclass(frozen=True)
class PadRefusal:
    """Why padding would change a real row's values (it names the op and the user's line)."""

    reason: str
    op: str
    source: str | None  # "file:line"


def plan_padding(
    gm: torch.fx.GraphModule, *, dim: int, static_indices: frozenset[int] | set[int] = frozenset()
) -> PadPlan | PadRefusal | None:
    """The padding plan of a graph, a refusal, or None when no non-static input has a symbolic size at ``dim``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = _batch_symbol(placeholders, dim, static_indices)
    if found is None:
        return None
    symbol, source = found
    symints, padded = [], []
    for i, p in enumerate(placeholders):
        val = p.meta.get("val")
        if isinstance(val, torch.SymInt) and _has(val, symbol):
            if _expr(val) != symbol:
                return _refuse(p, symbol, f"input {p.name} is {_expr(val)}, not the batch size itself")
            symints.append(i)
        elif isinstance(val, torch.Tensor):
            rows = _rows(val, symbol)
            if len(rows) > 1:
                return _refuse(p, symbol, f"input {p.name} has the batch size in several dimensions")
            for d in rows:
                k = _multiple(val.shape[d], symbol)
                if k is None:
                    return _refuse(p, symbol, f"input {p.name} has a dimension of size {_expr(val.shape[d])}")
                padded.append((i, d, k))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            reason = _mixes(node, symbol)
            if reason is not None:
                return _refuse(node, symbol, reason)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    sliced, scalars = [], []
    for index, out in enumerate(output.args[0]):
        val = out.meta.get("val") if isinstance(out, torch.fx.Node) else out
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if _has(size, symbol):
                    k = _multiple(size, symbol)
                    if k is None:
                        return _refuse(out, symbol, f"output {index} has a dimension of size {_expr(size)}")
                    sliced.append((index, d, k))
        elif isinstance(val, torch.SymInt) and _has(val, symbol):
            scalars.append((index, _expr(val)))
    smallest = _smallest(placeholders[source].meta["val"].shape[dim])
    return PadPlan(symbol, dim, source, tuple(symints), tuple(padded), tuple(sliced), tuple(scalars), smallest)


def _smallest(size: torch.SymInt) -> int:
    """The lower bound of the batch symbol's range in its shape environment (1 when it has none)."""
    shape_env = getattr(size.node, "shape_env", None)
    try:
        lower = shape_env.bound_sympy(size.node.expr).lower
    except (AttributeError, TypeError):
        return 1
    return int(lower) if getattr(lower, "is_Integer", False) or isinstance(lower, int) else 1


def _batch_symbol(
    placeholders: list[torch.fx.Node], dim: int, static: frozenset[int] | set[int]
) -> tuple[sympy.Symbol, int] | None:
    for i, p in enumerate(placeholders):
        val = p.meta.get("val")
        if i in static or not isinstance(val, torch.Tensor) or val.dim() <= dim:
            continue
        size = val.shape[dim]
        if isinstance(size, torch.SymInt) and isinstance(_expr(size), sympy.Symbol):
            return _expr(size), i
    return None


def _refuse(node: torch.fx.Node, symbol: sympy.Symbol, why: str) -> PadRefusal:
    where, _ = user_source(frames_of_text(node.meta.get("stack_trace") or ""))
    op = str(node.target) if node.op == "call_function" else node.name
    return PadRefusal(f"{why} (batch size {symbol})", op, where)


# -- symbolic sizes ------------------------------------------------------------------------------------------
def _expr(value: Any) -> Any:
    return value.node.expr if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool) else value


def _has(value: Any, symbol: sympy.Symbol) -> bool:
    expr = _expr(value)
    return isinstance(expr, sympy.Basic) and symbol in expr.free_symbols


def _multiple(size: Any, symbol: sympy.Symbol) -> int | None:
    """``k`` where ``size`` is ``k * symbol`` for a positive integer ``k``, else None."""
    ratio = sympy.simplify(_expr(size) / symbol)
    return int(ratio) if ratio.is_Integer and ratio > 0 else None


def _rows(value: Any, symbol: sympy.Symbol) -> list[int]:
    """The dimensions of a tensor whose size holds the batch symbol."""
    return [d for d, size in enumerate(value.shape) if _has(size, symbol)] if isinstance(value, torch.Tensor) else []


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


# -- ops -----------------------------------------------------------------------------------------------------
# Ops that compute each element from the same element of their inputs (with broadcasting), or copy, or make new
# tensors of given sizes: rows stay apart whatever their dims.
_ELEMENTWISE = frozenset(
    {
        "clone", "_to_copy", "copy", "copy_", "detach", "alias", "lift_fresh_copy", "fill", "fill_",
        "zeros_like", "ones_like", "empty_like", "full_like", "masked_fill", "masked_fill_", "where",
        "empty", "empty_strided", "full", "zeros", "ones", "new_empty", "new_empty_strided", "new_zeros",
        "new_ones", "new_full", "scalar_tensor", "_assert_tensor_metadata", "embedding", "arange",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense",
        "_native_batch_norm_legit_no_training",
    }
)  # fmt: skip
# Views and reshapes: the batch dimension must stay whole (checked by _reshape_keeps_rows for view/reshape).
_VIEWS = frozenset(
    {"view", "reshape", "_unsafe_view", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "_reshape_alias"}
)
# Reductions and scans: the dims they reduce or scan over must not hold the batch.
_REDUCTIONS = frozenset(
    {
        "sum", "mean", "amax", "amin", "argmax", "argmin", "prod", "var", "std", "var_mean", "std_mean",
        "logsumexp", "any", "all", "max", "min", "norm", "linalg_vector_norm", "_softmax", "_log_softmax",
        "softmax", "log_softmax", "_safe_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "sort",
        "argsort", "topk", "kthvalue", "median", "nanmedian", "mode", "cumsum", "cumprod", "cummax", "cummin",
        "logcumsumexp", "flip", "roll",
    }
)  # fmt: skip
# Ops that pick or place along one dimension (``dim``): not along the batch dimension.
_ALONG_DIM = frozenset(
    {
        "cat", "select", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "index_add",
        "index_copy", "index_copy_", "index_fill", "split", "split_with_sizes", "unbind", "unfold", "narrow",
        "select_scatter", "repeat_interleave", "chunk",
    }
)  # fmt: skip
# Of those, the ops that write values into ``self`` at positions given by an index tensor (scatter: an index per
# element; index_*: one index per slice along ``dim``): checked by _places too.
_PLACES = frozenset(
    {"scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_copy_", "index_fill", "index_reduce"}
)
_SIZE_ARGS = frozenset({"size", "stride", "end", "sizes"})  # arguments where the batch size is a size, not a value


def _mixes(node: torch.fx.Node, symbol: sympy.Symbol) -> str | None:
    """Why ``node`` would make a real row depend on a padded one (or the batch size change a value), or None."""
    target = node.target
    ins = [_val(a) for a in node.all_input_nodes]
    out = node.meta.get("val")
    if not any(_has(s, symbol) for v in [*ins, out] for t in _tensors_and_sizes(v) for s in t):
        return None
    if not isinstance(target, torch._ops.OpOverload):
        if target in _SYM_OPS:
            return None
        return f"{getattr(target, '__name__', target)} uses the batch size"
    name = target.overloadpacket.__name__
    label = f"{node.name} = {target}"
    reason = _value_use(node, target, symbol)
    if reason is not None:
        return f"{label} {reason}"
    attention = name.startswith("_scaled_dot_product") or name == "scaled_dot_product_attention"
    if torch.Tag.nondeterministic_seeded in target.tags and not (attention and _no_dropout(node, target)):
        return f"{label} draws random numbers for the whole batch at once"
    if torch.Tag.pointwise in target.tags or name in _ELEMENTWISE:
        return None
    if name in _VIEWS:
        return _view(node, name, symbol, label)
    if name in _REDUCTIONS or name in _ALONG_DIM:
        return _along(node, name, symbol, label) or (_places(node, name, symbol, label) if name in _PLACES else None)
    if name in ("slice", "slice_scatter"):
        return _slice(node, name, symbol, label)
    if name in ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm"):
        a, b = (node.args[1], node.args[2]) if name in ("addmm", "baddbmm") else node.args[:2]
        a, b = _val(a), _val(b)
        if _has(a.shape[-1], symbol) or _has(b.shape[-2], symbol):
            return f"{label} contracts over the batch dimension"
        return None
    if name == "convolution":
        if any(d != 0 for d in _rows(_val(node.args[0]), symbol)):
            return f"{label} convolves over the batch dimension"
        return None
    if name in ("native_layer_norm", "_fused_rms_norm"):
        x, normalized = _val(node.args[0]), len(node.args[1])
        if any(d >= x.dim() - normalized for d in _rows(x, symbol)):
            return f"{label} normalizes over the batch dimension"
        return None
    if name in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"):
        names = [a.name for a in target._schema.arguments]
        if _bound(node, target)[names.index("training")]:
            return f"{label} is batch norm in training: its statistics are taken over the batch"
        return None
    if attention:
        if any(d >= 2 for a in node.args[:3] for d in _rows(_val(a), symbol)):
            return f"{label} attends over the batch dimension"
        return None
    if name in ("index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put"):
        x, indices = _val(node.args[0]), node.args[1]
        if any(d < len(indices) and indices[d] is not None for d in _rows(x, symbol)):
            return f"{label} picks or writes rows of the batch dimension by index"
        if name not in ("index", "_unsafe_index") and not _rows(x, symbol):
            return f"{label} writes batch rows into a tensor of fixed size"
        return None
    return f"{label} is not known to keep the rows of the batch dimension apart"


_SYM_OPS = frozenset(
    {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, operator.ge,
     operator.gt, operator.le, operator.lt, operator.eq, operator.ne, operator.getitem, math.ceil, math.floor,
     torch.sym_int, torch.sym_float, torch.sym_max, torch.sym_min, torch.sym_not}
)  # fmt: skip


def _tensors_and_sizes(value: Any) -> list[tuple]:
    if isinstance(value, torch.SymInt | torch.SymFloat):
        return [(value,)]
    return [tuple(t.shape) for t in tensors(value)]


def _value_use(node: torch.fx.Node, target: torch._ops.OpOverload, symbol: sympy.Symbol) -> str | None:
    """The batch size passed as a value (a scalar operand, a fill value, an index): padding would change it."""
    for argument, value in zip(target._schema.arguments, _bound(node, target), strict=False):
        if argument.name in _SIZE_ARGS or isinstance(argument.type, torch.ListType):
            continue
        if target.overloadpacket.__name__ in ("arange",) and argument.name == "end":
            continue
        if target.overloadpacket.__name__ in ("slice", "slice_scatter", "narrow"):
            continue  # checked by _slice
        val = _val(value)
        if isinstance(val, torch.SymInt | torch.SymFloat) and _has(val, symbol):
            return f"uses the batch size as a value ({argument.name})"
    return None


def _bound(node: torch.fx.Node, target: torch._ops.OpOverload) -> list[Any]:
    return bound_arguments(target, node.args, node.kwargs)


def _dims(node: torch.fx.Node, target: torch._ops.OpOverload, rank: int, key: str = "dim") -> list[int] | None:
    """The ``dim`` argument normalized (None: every dimension)."""
    names = [a.name for a in target._schema.arguments]
    if key not in names:
        return None
    index = names.index(key)
    dim = (
        node.args[index]
        if index < len(node.args)
        else node.kwargs.get(key, target._schema.arguments[index].default_value)
    )
    if dim is None or dim == []:
        return None
    dims = dim if isinstance(dim, list | tuple) else [dim]
    return [d % rank if rank else 0 for d in dims]


def _along(node: torch.fx.Node, name: str, symbol: sympy.Symbol, label: str) -> str | None:
    first = node.args[0]
    x = _val(first[0]) if name == "cat" and isinstance(first, list | tuple) else _val(first)
    rows = _rows(x, symbol)
    if name == "cat":
        rows = sorted({d for t in first for d in _rows(_val(t), symbol)})
    key = "dims" if name in ("flip", "roll") else "dim"
    dims = _dims(node, node.target, x.dim() if isinstance(x, torch.Tensor) else 0, key)
    if dims is None:
        dims = list(range(x.dim())) if name != "cat" else [0]
    if any(d in rows for d in dims):
        verb = "reduces or scans" if name in _REDUCTIONS else "picks or places"
        return f"{label} {verb} along the batch dimension"
    return None


def _places(node: torch.fx.Node, name: str, symbol: sympy.Symbol, label: str) -> str | None:
    """An op writing into ``self`` by an index (``dim`` is not the batch's: _along checked) keeps rows apart only if
    each batch row writes into its own row: a scatter's index has the batch in ``self``'s batch dimensions (its
    position outside ``dim`` is where it writes), and an index_* op's index or slices do not carry the batch (a
    batch of indices would put the batch's rows into ``self``'s ``dim``: the slots of a cache of fixed size, where
    a padded row would write over a real one)."""
    args = _bound(node, node.target)
    x, index = _val(args[0]), _val(args[2])
    rows = _rows(x, symbol)
    if name.startswith("scatter"):
        if _rows(index, symbol) and _rows(index, symbol) != rows:
            where = "a tensor of fixed size" if not rows else "other rows"
            return f"{label} writes batch rows into {where}"
        return None
    dim = args[1] % x.dim()
    sources = [v for v in map(_val, args[3:]) if isinstance(v, torch.Tensor)]
    if _rows(index, symbol) or any(dim in _rows(v, symbol) for v in sources):
        return f"{label} writes batch rows into a tensor of fixed size (by an index of the batch's rows)"
    return None


def _no_dropout(node: torch.fx.Node, target: torch._ops.OpOverload) -> bool:
    """An attention op's ``dropout_p`` is 0: it draws no random numbers (it is tagged as random for dropout)."""
    names = [a.name for a in target._schema.arguments]
    if "dropout_p" not in names:
        return False
    dropout = _bound(node, target)[names.index("dropout_p")]
    return isinstance(dropout, int | float) and dropout == 0


def _slice(node: torch.fx.Node, name: str, symbol: sympy.Symbol, label: str) -> str | None:
    """A slice of the batch dimension is a view of it only from 0, step 1, to the end."""
    args = _bound(node, node.target)
    x = _val(args[0])
    src = _val(args[1]) if name == "slice_scatter" else None
    dim, start, end, step = args[1:5] if name == "slice" else args[2:6]
    dim = dim % x.dim()
    out_rows = _rows(src if src is not None else node.meta.get("val"), symbol)
    if dim not in _rows(x, symbol):
        if dim in out_rows:
            return f"{label} takes a batch of rows from a tensor of fixed size"
        return None
    whole = (start in (None, 0)) and (step in (None, 1)) and (end is None or _covers(_val(end), x.shape[dim]))
    return None if whole else f"{label} slices the batch dimension"


def _covers(end: Any, size: Any) -> bool:
    if isinstance(end, int) and not isinstance(size, torch.SymInt):
        return end >= size
    if isinstance(end, int):
        return end >= 2**62
    return sympy.simplify(_expr(end) - _expr(size)) == 0


def _view(node: torch.fx.Node, name: str, symbol: sympy.Symbol, label: str) -> str | None:
    x, out = _val(node.args[0]), node.meta.get("val")
    before, after = _rows(x, symbol), _rows(out, symbol)
    if len(before) > 1 or len(after) > 1:
        return f"{label} has the batch size in several dimensions"
    if name not in ("view", "reshape", "_unsafe_view", "_reshape_alias"):
        return None if len(before) == len(after) else f"{label} moves the batch dimension"
    if not before and not after:
        return None
    if len(before) != len(after):
        return f"{label} merges the batch dimension away"
    i, j = before[0], after[0]
    prefix_in = sympy.Mul(*[_expr(s) for s in x.shape[:i]])
    prefix_out = sympy.Mul(*[_expr(s) for s in out.shape[:j]])
    if sympy.simplify(prefix_in - prefix_out) != 0:
        return f"{label} reshapes the batch dimension together with the dimensions before it"
    return None
