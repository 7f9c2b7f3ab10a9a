"""Planning for a device you do not have: real inputs and module state faked onto it (the fake CUDA device
guard of a CPU-only build of PyTorch is graph/fake_guard.py's :func:`fake_cuda_guard`).

Module state, the rule: a module's real parameters and buffers are faked onto the device of the fake inputs for
the duration of the call (the module is not modified afterwards). Modules built directly under a fake mode work
too, when their constructor does (``nn.Linear(..., device="cuda")`` does; ``Module.to`` does not, as a fake tensor
cannot be swapped). Plain tensor attributes that are neither parameters nor buffers are not faked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_map

from airgraph.graph.fake_guard import fake_cuda_guard

__all__ = ["fake_cuda_guard", "fake_inputs", "faked_state"]  # fake_cuda_guard: re-exported for planning code


def fake_inputs(values: Any, *, device: str | torch.device = "cuda", mode: FakeTensorMode | None = None) -> Any:
    """``values`` (any pytree) with every real tensor replaced by a fake one on ``device`` (same sizes, strides,
    dtype; no memory); fake tensors and other leaves are kept. All fakes come from ``mode`` (a new
    ``FakeTensorMode`` when None), the mode :func:`explain` then plans in."""
    mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
    device = torch.device(device)
    memo: dict[int, torch.Tensor] = {}
    with fake_cuda_guard():
        return tree_map(lambda v: _fake(v, mode, device, memo), values)


def _fake(value: Any, mode: FakeTensorMode, device: torch.device, memo: dict[int, torch.Tensor]) -> Any:
    if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
        return value
    if id(value) not in memo:
        fake = mode.from_tensor(value.detach())
        if fake.device != device:
            with mode:
                fake = fake.to(device)
        if isinstance(value, torch.nn.Parameter):
            fake = torch.nn.Parameter(fake, requires_grad=value.requires_grad)
        elif value.requires_grad:
            fake.requires_grad_()
        memo[id(value)] = fake
    return memo[id(value)]


@contextlib.contextmanager
def faked_state(fn: Any, mode: FakeTensorMode, device: torch.device) -> Iterator[None]:
    """A module's real parameters and buffers replaced by fakes on ``device`` for the duration; put back after."""
    if not isinstance(fn, torch.nn.Module):
        yield
        return
    memo: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    try:
        for module in fn.modules():
            for table in (module._parameters, module._buffers):
                for name, value in list(table.items()):
                    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                        saved.append((table, name, value))
                        table[name] = _fake(value, mode, device, memo)
        yield
    finally:
        for table, name, value in reversed(saved):
            table[name] = value


# -- fake CUDA on a CPU-only build ------------------------------------------------------------------------
