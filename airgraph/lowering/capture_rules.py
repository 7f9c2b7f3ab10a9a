"""Which ops a CUDA graph cannot record: torch's own list, and what airgraph adds to it.

A CUDA graph records device work only. An op that synchronises with the host (it reads a device value on the
host, or sizes its output from the data) fails while recording and invalidates the capture; an op whose host
side decides per call what work runs is recorded with the decision of the recording. The rule is torch
Inductor's own, ``torch._inductor.utils.is_cudagraph_unsafe_fx_node`` (the same in torch 2.11 to 2.15: ops
tagged ``cudagraph_unsafe``, ``index_put`` with a boolean mask, sparse outputs, ``FORBIDDEN_CUDAGRAPH_OPS``),
or, where it cannot be imported, :func:`_torch_rule_fallback`, which reads the same way. airgraph extends it:

- the forbidden ops are Inductor's list and :data:`FORBIDDEN_OPS` together, so that every supported torch refuses
  the same ops: torch 2.15 added ``aten._linalg_eigh`` (cuSOLVER's eigh cannot be recorded, in any torch);

- ``FORBIDDEN_CUDAGRAPH_OPS`` names some ops by their overload packet (``aten._local_scalar_dense``), which
  Inductor compares with ``str(node.target)``, the overload's name (``aten._local_scalar_dense.default``): the
  packet name is compared too;
- ``.item()`` and ops whose output size depends on the data (``nonzero``, ``masked_select``, ``x[mask]``):
  named first, they are what a user changes;
- control flow (``torch.cond``, ``while_loop``, ``scan``, ...): the branch or trip count is a device value;
- copies of a device value to the host;
- ``_assert_scalar`` (in Inductor's list) is allowed where it checks values the shape key fixes (sizes, and
  host work computed once per key: the reshape of GE's host-placement example): the recording checks it once for
  the key, which is all it needs. It is refused where it checks anything else.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airgraph.graph.meta import tensors, transfer_device

__all__ = ["CONTROL_FLOW", "FORBIDDEN_OPS", "host_sync_reason", "torch_rule"]

aten = torch.ops.aten

# torch._inductor.utils.FORBIDDEN_CUDAGRAPH_OPS as of torch 2.15 (ROCm adds topk): the fallback rule's list, and
# added to Inductor's own where that is older (torch 2.11 to 2.14 lack _linalg_eigh).
FORBIDDEN_OPS = frozenset(
    {
        "aten._fused_moving_avg_obs_fq_helper.default",
        "aten._fused_moving_avg_obs_fq_helper_functional.default",
        "fbgemm.dense_to_jagged.default",
        "fbgemm.jagged_to_padded_dense.default",
        "run_and_save_rng_state",
        "run_with_rng_state",
        "aten._local_scalar_dense",
        "aten._linalg_eigh.default",
        "aten._assert_scalar",
    }
)
CONTROL_FLOW = frozenset({"cond", "while_loop", "scan", "map_impl", "associative_scan"})
_BOOL_INDEX_PUT = (aten.index_put.default, aten.index_put_.default, aten._unsafe_index_put.default)

_rule: Callable[[torch.fx.Node], bool] | None = None
_forbidden: frozenset[str] | None = None


def torch_rule() -> tuple[Callable[[torch.fx.Node], bool], frozenset[str]]:
    """Inductor's ``is_cudagraph_unsafe_fx_node`` and ``FORBIDDEN_CUDAGRAPH_OPS``, or the fallback's."""
    global _rule, _forbidden
    if _rule is None:
        try:
            from torch._inductor.utils import FORBIDDEN_CUDAGRAPH_OPS, is_cudagraph_unsafe_fx_node
        except ImportError:
            _rule, _forbidden = _torch_rule_fallback, FORBIDDEN_OPS
        else:
            _rule, _forbidden = is_cudagraph_unsafe_fx_node, frozenset(FORBIDDEN_CUDAGRAPH_OPS) | FORBIDDEN_OPS
    return _rule, _forbidden


def _torch_rule_fallback(node: torch.fx.Node) -> bool:
    """Inductor's rule where it cannot be imported: forbidden ops, the ``cudagraph_unsafe`` tag, ``index_put`` with
    a boolean mask, sparse outputs."""
    target = node.target
    if str(target) in FORBIDDEN_OPS:
        return True
    if isinstance(target, torch._ops.OpOverload) and torch.Tag.cudagraph_unsafe in target.tags:
        return True
    if _bool_index_put(node):
        return True
    return any(t.is_sparse for t in tensors(node.meta.get("val")))


def _bool_index_put(node: torch.fx.Node) -> bool:
    if node.target not in _BOOL_INDEX_PUT:
        return False
    indices = node.args[1] if len(node.args) > 1 else node.kwargs.get("indices", ())
    vals = [i.meta.get("val") for i in indices or () if isinstance(i, torch.fx.Node)]
    return any(isinstance(v, torch.Tensor) and v.dtype in (torch.bool, torch.uint8) for v in vals)


def host_sync_reason(node: torch.fx.Node, static_symbols: Callable[[], set]) -> str | None:
    """Why the device op ``node`` cannot be recorded in a CUDA graph, or None. ``static_symbols()``: the unbacked
    symbols that host work computes once per shape key."""
    target, label = node.target, f"{node.name} = {node.target}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        if target.name() in CONTROL_FLOW:
            return f"{label} is control flow on a device value (it needs a host sync to choose the work)"
        return None
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if target.overloadpacket in (aten._local_scalar_dense, aten.item):
        return f"{label} reads a device value on the host (.item(), a host sync)"
    dynamic = torch.Tag.dynamic_output_shape in target.tags or torch.Tag.data_dependent_output in target.tags
    if dynamic and _data_dependent(node):
        return f"{label} has a data-dependent output (needs a host sync)"
    if target is aten._assert_scalar.default:
        condition = node.args[0]
        val = condition.meta.get("val") if isinstance(condition, torch.fx.Node) else condition
        unchecked = free_unbacked_symbols(val) - static_symbols()
        if unchecked:
            names = ", ".join(sorted(map(str, unchecked)))
            return f"{label} checks {names} on the host: checked once when recording, never on a replay"
        return None
    device = transfer_device(node)
    sources = tensors(node.args[0].meta.get("val")) if device is not None and node.args else []
    if device is not None and device.type == "cpu" and any(t.device.type != "cpu" for t in sources):
        return f"{label} copies a device value to the host (a host sync)"
    rule, forbidden = torch_rule()
    if rule(node) or str(target) in forbidden or str(target.overloadpacket) in forbidden:
        if torch.Tag.cudagraph_unsafe in target.tags:
            return f"{label} is tagged cudagraph_unsafe (its author says a CUDA graph cannot record it)"
        if _bool_index_put(node):
            return f"{label} indexes with a boolean mask (it calls nonzero: a host sync)"
        if any(t.is_sparse for t in tensors(node.meta.get("val"))):
            return f"{label} has a sparse output (its size is known on the host only)"
        return f"{label} is among the ops torch's Inductor never records in a CUDA graph (FORBIDDEN_CUDAGRAPH_OPS)"
    return None


def _data_dependent(node: torch.fx.Node) -> bool:
    """A node of an op that *may* depend on data (``index`` with a bool mask, ``nonzero``) that here does: its
    traced value has sizes no input determines (unbacked SymInts), or is unknown."""
    val = node.meta.get("val")
    if val is None:
        return True
    return bool(free_unbacked_symbols(val))
