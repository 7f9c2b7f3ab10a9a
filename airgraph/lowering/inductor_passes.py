"""Inductor's graph-level passes, run where torch.compile runs them, when the kernel backend is Inductor.

torch.compile's Inductor path (``torch._inductor.compile_fx``) rewrites a graph at three levels:

- pre-grad passes, on the Dynamo graph (Torch IR) before AOTAutograd traces it (``_recursive_pre_grad_passes``);
- joint-graph passes (``_recursive_joint_graph_passes``): on the joint forward + backward graph before it is
  partitioned (``compile_fx.partition_fn``), and on an inference graph before it is compiled
  (``compile_fx_forward``). They rewrite patterns across the graph: e.g. ``full`` + ``scatter`` into a
  ``where`` (cross-entropy's backward), attention patterns into SDPA, no-op removal, constant folding;
- post-grad passes, inside ``compile_fx_inner``: every segment airgraph compiles with Inductor gets those.

airgraph calls ``compile_fx_inner`` per segment, not ``compile_fx``, so without this module the first two levels
never run and its graphs keep kernels torch.compile's do not. The passes emit ATen graphs like any other, so
the segments that another kernel backend lowers (aten, host placement) run the rewritten graph as well.

Random ops stay ATen's (lowering/inductor.py: ``fallback_random``): the passes run with ``fallback_random``
set, which leaves out the joint-graph pass that would replace them with Inductor's own random ops.

torch internals used (present with these signatures from torch 2.11 to 2.13):
``torch._inductor.compile_fx._recursive_pre_grad_passes(gm, example_inputs)``,
``torch._inductor.compile_fx._recursive_joint_graph_passes(gm, input_device=...)``,
``torch._inductor.compile_fx.partition_fn(gm, joint_inputs, **kwargs)`` and
``torch._dynamo.utils.get_inputs_devices(inputs, gm)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["inference_passes", "partition_joint", "pre_grad_passes"]


def _inductor_patch() -> Any:
    from torch._inductor import config as inductor_config

    return inductor_config.patch(fallback_random=True)


def pre_grad_passes(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """Inductor's pre-grad passes on a Dynamo graph (rewritten in place; the graph is returned)."""
    from torch._inductor.compile_fx import _recursive_pre_grad_passes

    with _inductor_patch():
        return _recursive_pre_grad_passes(gm, example_inputs)


def partition_joint(gm: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> tuple[Any, Any]:
    """AOTAutograd's ``partition_fn``: Inductor's joint-graph passes, then its min-cut rematerialization
    partitioner (``compile_fx.partition_fn``, which runs both, as torch.compile does)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.compile_fx import partition_fn

    if _devices(gm, joint_inputs) is None:  # see _devices: the partitioner alone
        return min_cut_rematerialization_partition(gm, joint_inputs, compiler="inductor", **kwargs)
    with _inductor_patch():
        return partition_fn(gm, joint_inputs, **kwargs)


def inference_passes(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """Inductor's joint-graph passes on an inference graph (no partitioner runs for one), as
    ``compile_fx_forward`` applies them before compiling it. Returns the rewritten graph (the same object)."""
    from torch._inductor.compile_fx import _recursive_joint_graph_passes

    devices = _devices(gm, example_inputs)
    if devices is None:
        return gm
    with _inductor_patch():
        return _recursive_joint_graph_passes(gm, input_device=devices[0])


def _devices(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> list[torch.device | None] | None:
    """The devices the graph touches (Inductor's order, None last), or None when one of them is not on this
    machine: a plan of a CUDA graph made on a machine without a GPU (``airgraph.plan(..., device="cuda")``,
    fake tensors). The joint-graph passes trace their patterns on the graph's device, so such a plan shows
    the graph without them."""
    from torch._dynamo.utils import get_inputs_devices

    devices = get_inputs_devices(inputs, gm)
    for device in devices:
        if device is not None and device.type != "cpu":
            module = getattr(torch, device.type, None)
            if module is None or not module.is_available():
                return None
    return devices
