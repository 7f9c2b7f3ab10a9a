"""dead_code_elimination: drop nodes whose values are never used and that have no side effects."""

from __future__ import annotations

import torch

from airgraph.graph.analysis import has_side_effects, node_label
from airgraph.passes.base import CompileContext, PassResult


def dead_code_elimination(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    # Walk backwards so a chain of dead nodes goes in one sweep.
    for node in reversed(list(gm.graph.nodes)):
        if node.users or node.op in ("placeholder", "output") or has_side_effects(node):
            continue
        result.note(node_label(node))
        gm.graph.erase_node(node)
    return result
