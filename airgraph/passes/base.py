"""The contract every pass keeps.

A pass is a plain function ``(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult``. It edits
``gm.graph`` in place (or only annotates ``node.meta``), and returns what it changed: a count and one
readable line per affected node. Invariants every pass keeps:

- the graph stays a valid, functional ATen graph: every new node carries ``meta["val"]`` (a fake
  tensor, SymInt or a structure of them), so later passes and Inductor see shapes and dtypes;
- graph inputs, graph outputs and their aliasing are unchanged (AOTAutograd computed its runtime
  wrappers from them);
- side-effecting nodes (mutable schemas, airgraph's stream and event ops) are never removed or reordered
  across each other.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from airgraph.config import CompilerConfig
    from airgraph.report import GraphReport


@dataclass
class PassResult:
    changed: int = 0
    details: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.changed += 1
        self.details.append(line)


@dataclass
class CompileContext:
    """What a pass may know about the graph it runs on, beyond the graph itself."""

    config: CompilerConfig
    report: GraphReport
    kind: str  # "inference", "forward" or "backward"
    device: torch.device
    example_inputs: list[Any] = field(default_factory=list)


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
