"""remove_noops: replace ops that return their input unchanged by that input.

Two families:

- views that change nothing: ``view``/``reshape``/``expand``/``alias`` to the same shape, ``slice`` over a
  whole dimension, ``permute`` by the identity. The result aliases the input either way.
- copies and arithmetic identities: ``clone``/``_to_copy`` to the same dtype and device, ``x + 0``,
  ``x - 0``, ``x * 1``, ``x / 1``, ``cat`` of one tensor. The result was a fresh tensor, so it is replaced
  only when nothing could tell: neither value is mutated anywhere in the graph.

A graph output is never replaced: AOTAutograd has already decided how outputs alias inputs. Shapes are
compared with ``statically_known_true`` so a dynamic-shape graph gains no guards. A node that
``config.fallback.pass_nodes`` names (``remove_noops:NODE``) is left as it is.
"""

from __future__ import annotations

import sys

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airgraph.graph.analysis import is_graph_output, mutated_nodes, node_label
from airgraph.passes.base import CompileContext, PassResult
from airgraph.passes.fallback import skipped

aten = torch.ops.aten

_SAME_SHAPE_VIEWS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.expand.default,
    aten.alias.default,
}
_COPIES = {aten.clone.default, aten._to_copy.default}
_IDENTITY_SCALAR = {
    aten.add.Tensor: 0,
    aten.add.Scalar: 0,
    aten.sub.Tensor: 0,
    aten.sub.Scalar: 0,
    aten.mul.Tensor: 1,
    aten.mul.Scalar: 1,
    aten.div.Tensor: 1,
    aten.div.Scalar: 1,
}


def _val(node: object) -> torch.Tensor | None:
    if isinstance(node, torch.fx.Node):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val
    return None


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.device != b.device or a.dim() != b.dim():
        return False
    same_sizes = all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape, strict=True))
    same_strides = all(statically_known_true(x == y) for x, y in zip(a.stride(), b.stride(), strict=True))
    return same_sizes and same_strides


def _noop_source(node: torch.fx.Node) -> tuple[torch.fx.Node, bool] | None:
    """(the input this node passes through, whether the node is a copy) or None."""
    target = node.target
    args = node.args
    if not args or not isinstance(args[0], torch.fx.Node):
        return None
    src = args[0]
    if target in _SAME_SHAPE_VIEWS:
        return src, False
    if target is aten.slice.Tensor:
        dim = args[1] if len(args) > 1 else 0
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = args[4] if len(args) > 4 else 1
        src_val = _val(src)
        if src_val is None or step != 1 or start not in (None, 0):
            return None
        full = (
            end is None
            or end == sys.maxsize
            or (isinstance(end, int) and statically_known_true(end >= src_val.shape[dim]))
        )
        return (src, False) if full else None
    if target is aten.permute.default:
        return (src, False) if list(args[1]) == list(range(len(args[1]))) else None
    if target in _COPIES:
        memory_format = node.kwargs.get("memory_format")
        if memory_format not in (None, torch.preserve_format):
            return None
        return src, True
    if target in _IDENTITY_SCALAR:
        other = args[1] if len(args) > 1 else None
        alpha = node.kwargs.get("alpha", 1)
        is_number = isinstance(other, (int, float)) and not isinstance(other, bool)
        return (src, True) if is_number and alpha == 1 and other == _IDENTITY_SCALAR[target] else None
    if target is aten.cat.default and len(args[0]) == 1 and isinstance(args[0][0], torch.fx.Node):
        return args[0][0], True
    return None


def remove_noops(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    mutated = mutated_nodes(gm.graph)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or is_graph_output(node) or skipped(ctx, "remove_noops", node):
            continue
        found = _noop_source(node)
        if found is None:
            continue
        src, is_copy = found
        out, inp = _val(node), _val(src)
        if out is None or inp is None or not _same_meta(out, inp):
            continue
        if is_copy and (node in mutated or src in mutated):
            continue
        node.replace_all_uses_with(src)
        result.note(f"{node_label(node)} -> {src.name}")
        gm.graph.erase_node(node)
    return result
