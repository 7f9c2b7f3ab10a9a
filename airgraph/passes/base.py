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
    from airgraph.report.schema import GraphReport


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
