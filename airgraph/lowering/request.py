"""What a kernel backend is asked to lower (its own module: backends.py and the implementations share it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["LowerRequest"]


@dataclass(frozen=True)
class LowerRequest:
    """Everything a kernel backend is told about the segment it lowers."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]  # with the strides the inputs really have (lowering/layouts.py)
    kind: str  # the ATen graph's kind: "inference", "forward" or "backward"
    device: torch.device
    config: Any  # the CompilerConfig
    donated: list[int] = field(default_factory=list)  # positions of inputs it may overwrite (backward only)
    shape_key: tuple | None = None  # the inputs' (dtype, sizes, strides) when all static (lowering/keys.py)
    options: Mapping[str, Any] = field(default_factory=dict)  # the chosen Impl's parameters
