"""The decomposition table AOTAutograd applies, less the ops ``config.fallback.keep_ops`` keeps.

A kept op stays one node in the ATen graph (its name as eager dispatches it); passes/fallback.py marks its nodes
and the seam runs them through the aten kernel backend, so the op computes what eager computes. This is the fix
``airgraph.compare`` gives for a decomposition that leaves eager (precision/before.py finds which).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airgraph.config import CompilerConfig
from airgraph.passes.fallback import op_names

__all__ = ["kept_names", "without_kept"]


def kept_names(config: CompilerConfig) -> frozenset[str]:
    return frozenset(config.fallback.keep_ops)


def without_kept(decompositions: Mapping[Any, Any], config: CompilerConfig) -> dict[Any, Any]:
    """``decompositions`` without every overload of an op ``config.fallback.keep_ops`` names (``aten.silu`` keeps
    every overload of silu, ``aten.silu.default`` that one)."""
    kept = kept_names(config)
    if not kept:
        return dict(decompositions)
    return {op: fn for op, fn in decompositions.items() if not any(name in kept for name in op_names(op))}
