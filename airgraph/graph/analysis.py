"""Analysis of ATen FX graphs shared by passes, lowering and runtime: names, side effects, mutation, aliasing."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "aliased_base",
    "bound_arguments",
    "has_side_effects",
    "is_graph_output",
    "mutated_nodes",
    "node_label",
    "target_name",
    "views_of_inputs",
    "written_inputs",
]


def node_label(node: torch.fx.Node) -> str:
    """``name = target`` for pass details and reports."""
    return f"{node.name} = {target_name(node)}"


def target_name(node: torch.fx.Node) -> str:
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "get_attr":
        return f"get_attr {node.target}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.add.Tensor"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)


def bound_arguments(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """Every argument of ``op``'s schema, in order, for a call with ``args`` and ``kwargs``: the ones left out at the
    schema's defaults (None where it has none)."""
    values = list(args)
    for argument in op._schema.arguments[len(values) :]:
        values.append(kwargs.get(argument.name, argument.default_value if argument.has_default_value() else None))
    return values


def has_side_effects(node: torch.fx.Node) -> bool:
    """True when removing or reordering ``node`` could change what the program does.

    Mutating ops (mutable schemas, ``copy_`` into inputs), ops FX knows as side-effectful (asserts, profiler
    ranges, airgraph's stream and event ops), and random ops (removing one would shift the RNG stream
    against eager) all count.
    """
    if node.op in ("placeholder", "output"):
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and (
        target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
    ):
        return True
    return node.is_impure()


def is_graph_output(node: torch.fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)


def mutated_nodes(nodes: torch.fx.Graph | Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    """Values some op among ``nodes`` (a graph's, or any) writes to: arguments a mutable schema marks as
    written (``Tensor(a!)``, ``Tensor(a!)[]``), passed by position or by keyword."""
    mutated = set()
    for node in nodes.nodes if isinstance(nodes, torch.fx.Graph) else nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        for index, argument in enumerate(target._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, torch.fx.Node):
                    mutated.add(item)
    return mutated


_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default  # a view, though its schema says it returns a new tensor


def aliased_base(node: Any) -> torch.fx.Node | None:
    """The node whose memory ``node``'s value is: followed back through view ops, elements of split/unbind
    (getitem) and in-place ops (which return their argument) to a placeholder or the op that made the memory.
    None for a non-node."""
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return node
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]  # an element of split/unbind/chunk: a view of that op's input
            continue
        if node.target is _UNSAFE_VIEW:
            node = node.args[0]
            continue
        schema = getattr(node.target, "_schema", None)
        returns = schema.returns if schema is not None else ()
        if not returns or any(r.alias_info is None for r in returns):
            return node
        aliased = returns[0].alias_info.before_set
        source = None
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.before_set & aliased:
                continue
            source = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            break
        if not isinstance(source, torch.fx.Node):
            return node
        node = source
    return None


def written_inputs(nodes: Iterable[torch.fx.Node], inputs: list[torch.fx.Node]) -> frozenset[int]:
    """Positions among ``inputs`` of the values one of ``nodes`` writes in place."""
    written = mutated_nodes(nodes)
    return frozenset(i for i, node in enumerate(inputs) if node in written)


def views_of_inputs(gm: torch.fx.GraphModule) -> dict[int, int]:
    """Graph output position -> input position, for each output that is a view of an input (or the input):
    followed back through view ops (and in-place ops, which return their argument) in the FX graph."""
    inputs = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    views: dict[int, int] = {}
    for position, node in enumerate(gm.graph.find_nodes(op="output")[0].args[0]):
        base = aliased_base(node)
        if base in inputs:
            views[position] = inputs[base]
    return views
