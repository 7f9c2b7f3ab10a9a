"""fallback: mark the nodes ``config.fallback`` names, so they run as eager would.

``config.fallback.aten_nodes`` names nodes (``name``) or every node of an op (``aten.silu.default``), in every graph
or, as ``kind:name``, in one graph kind (inference, forward, backward); ``config.fallback.keep_ops`` names ATen ops
the backend did not decompose (lowering/decompositions.py), whose every node is marked. A marked node (and its
getitems) gets ``node.meta["fallback"] = "compare"``: the partitioner gives marked nodes segments of their own and
the seam's ``compare`` step runs those through the aten kernel backend. The pass runs last, so the names are those
of the graph the partitioner sees (and ``airgraph.compare`` reports).
"""

from __future__ import annotations

import operator

import torch

from airgraph.graph.analysis import target_name
from airgraph.graph.meta import COMPARE, FALLBACK
from airgraph.passes.base import CompileContext, PassResult

__all__ = ["PER_NODE", "fallback", "op_names", "skipped"]

# The passes that honour config.fallback.pass_nodes ("pass:node": leave that node as it is).
PER_NODE = frozenset({"remove_noops"})


def skipped(ctx: CompileContext, name: str, node: torch.fx.Node) -> bool:
    """Whether config.fallback.pass_nodes tells pass ``name`` to leave ``node`` as it is."""
    return f"{name}:{node.name}" in ctx.config.fallback.pass_nodes


def op_names(target: object) -> tuple[str, ...]:
    """``("aten.silu", "aten.silu.default")`` for ``aten.silu.default``: the spellings keep_ops accepts."""
    if not isinstance(target, torch._ops.OpOverload):
        return ()
    packet = f"{target.namespace}.{target._opname}"
    return packet, f"{packet}.{target._overloadname}"


def fallback(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    names = set(ctx.config.fallback.aten_nodes)
    ops = set(ctx.config.fallback.keep_ops)
    if not names and not ops:
        return result
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        spellings = (node.name, str(node.target))
        named = any(name in names or f"{ctx.kind}:{name}" in names for name in spellings)
        kept = any(name in ops for name in op_names(node.target))
        if named or kept:
            node.meta[FALLBACK] = COMPARE
            why = "config.fallback.aten_nodes" if named else "config.fallback.keep_ops"
            result.note(f"{node.name} ({target_name(node)}): runs as aten ({why})")
            for user in node.users:  # a multi-output op's getitems share its segment (lowering/partition.py)
                if user.target is operator.getitem:
                    user.meta[FALLBACK] = COMPARE
    return result
