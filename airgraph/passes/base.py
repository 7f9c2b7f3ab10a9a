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


def mutated_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Values some op in the graph writes to: arguments a mutable schema marks as written (``Tensor(a!)``)."""
    mutated = set()
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        for arg, schema_arg in zip(node.args, target._schema.arguments):
            alias = schema_arg.alias_info
            if isinstance(arg, torch.fx.Node) and alias is not None and alias.is_write:
                mutated.add(arg)
        for name, arg in node.kwargs.items():
            schema_arg = next((a for a in target._schema.arguments if a.name == name), None)
            alias = schema_arg.alias_info if schema_arg is not None else None
            if isinstance(arg, torch.fx.Node) and alias is not None and alias.is_write:
                mutated.add(arg)
    return mutated
