"""Where an ATen node comes from in the user's code: the module path (``nn_module_stack``) and the innermost
``file:line`` of its stack trace outside torch and airgraph."""

from __future__ import annotations

import os
import re

import torch

from airgraph.graph.source import frames_of_text, user_source

__all__ = ["module_path", "node_source"]

_AIRGRAPH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = re.compile(r"^L\['(self|fn|model|mod)'\]\.?")


def node_source(node: torch.fx.Node) -> tuple[str | None, str]:
    """``("file:line", code)`` of the user's line that made ``node``, or ``(None, "")`` when it is not known."""
    return user_source(frames_of_text(node.meta.get("stack_trace") or ""), skip=(_AIRGRAPH_DIR,))


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost module the node was traced in, as ``path (Type)`` (``(Type)`` for the model itself)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, kind = list(stack.values())[-1]
    name = _ROOT.sub("", str(path))
    type_name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].rstrip("'>"))
    return f"{name} ({type_name})" if name else f"({type_name})"
