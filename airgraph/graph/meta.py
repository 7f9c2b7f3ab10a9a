"""The node metadata airgraph's passes write and every later stage reads, in one place.

- ``node.meta["stream"]``: the stream tag a node runs on (None: the caller's stream); the streams pass.
- ``node.meta["placement"]``: ``HOST`` when host placement moved the node to the CPU, else absent (``DEVICE``).
- ``node.meta["host_placement"]``: why a host node is there: ``ANCHOR`` (a value already on the host),
  ``MOVED`` (moved by the pass) or ``H2D`` (the copy to the device the pass inserted).
- ``node.meta["fallback"]``: ``COMPARE`` when config.fallback names the node (passes/fallback.py): it runs as eager
  would, in a segment of its own kind, through the aten kernel backend.
- ``node.meta["segment"]``: the id of the segment the partitioner put the node in.

And one mark on tensors: :func:`mark_frozen` on a constant made of frozen parameters (lowering/freeze.py,
passes/concat_linear.py), the attribute torch's own freezing sets, which Inductor reads (its FX graph cache keys
such a constant by its metadata, not its values, and a graph holding one is not cached with its weights).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

__all__ = [
    "ANCHOR",
    "COMPARE",
    "DEVICE",
    "FALLBACK",
    "H2D",
    "HOST",
    "HOST_PLACEMENT",
    "METADATA_OPS",
    "MOVED",
    "PLACEMENT",
    "SEGMENT",
    "STREAM",
    "is_frozen",
    "is_non_blocking",
    "mark_frozen",
    "on_host",
    "placement",
    "tensors",
    "transfer_device",
]

STREAM, PLACEMENT, HOST_PLACEMENT, SEGMENT = "stream", "placement", "host_placement", "segment"
HOST, DEVICE = "host", "device"  # placements
ANCHOR, MOVED, H2D = "anchor", "moved", "h2d"  # why a node is on the host
FALLBACK, COMPARE = "fallback", "compare"  # a node config.fallback names, and the seam's step that runs it

aten, prims = torch.ops.aten, torch.ops.prims

# Ops that read only a tensor's metadata: on the host whatever the tensor's device.
METADATA_OPS = frozenset(
    {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}
)


_FROZEN = "_is_frozen_param"  # torch._inductor.freezing_utils' name for it (torch 2.11 to 2.15)


def mark_frozen(tensor: torch.Tensor) -> torch.Tensor:
    """Mark ``tensor`` (a constant the graph module holds) as made of frozen parameters; returns it."""
    setattr(tensor, _FROZEN, True)
    return tensor


def is_frozen(tensor: object) -> bool:
    return bool(getattr(tensor, _FROZEN, False))


def placement(node: torch.fx.Node) -> str:
    return node.meta.get(PLACEMENT, DEVICE)


def on_host(node: torch.fx.Node) -> bool:
    return node.meta.get(PLACEMENT) == HOST


def tensors(val: object) -> list[torch.Tensor]:
    """The tensors in a node's ``meta["val"]`` (a tensor, or a tuple/list of them)."""
    return [v for v in tree_leaves(val) if isinstance(v, torch.Tensor)]


def transfer_device(node: torch.fx.Node) -> torch.device | None:
    """The target device of a device transfer (``_to_copy(device=...)``, ``prims.device_put``), else None."""
    if node.op != "call_function":
        return None
    if node.target is aten._to_copy.default:
        device = node.kwargs.get("device")
    elif node.target is prims.device_put.default:
        device = node.args[1] if len(node.args) > 1 else node.kwargs.get("device")
    else:
        return None
    return torch.device(device) if device is not None else None


def is_non_blocking(node: torch.fx.Node) -> bool:
    """A transfer's ``non_blocking`` flag."""
    if node.target is prims.device_put.default:
        return bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("non_blocking", False))
    return bool(node.kwargs.get("non_blocking", False))
