"""Planning for a device you do not have: real inputs and module state faked onto it, and a fake CUDA device
guard on a CPU-only build of PyTorch (see :func:`fake_cuda_guard`).

Module state, the rule: a module's real parameters and buffers are faked onto the device of the fake inputs for
the duration of the call (the module is not modified afterwards). Modules built directly under a fake mode work
too, when their constructor does (``nn.Linear(..., device="cuda")`` does; ``Module.to`` does not, as a fake tensor
cannot be swapped). Plain tensor attributes that are neither parameters nor buffers are not faked.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_map

__all__ = ["fake_cuda_guard", "fake_inputs", "faked_state"]


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
_CUDA, _LAZY = 1, 17  # c10::DeviceType values (fixed: they are serialized)
_REGISTRY_SYMBOL = "_ZN3c104impl26device_guard_impl_registryE"  # c10::impl::device_guard_impl_registry


def _guard_registry() -> Any:
    """c10's device guard registry (one pointer per device type), or None where it cannot be found."""
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*c10.*"))
    for path in sorted(libs):
        try:
            return (ctypes.c_void_p * (_LAZY + 1)).in_dll(ctypes.CDLL(path), _REGISTRY_SYMBOL)
        except (OSError, ValueError):
            continue
    return None


@contextlib.contextmanager
def fake_cuda_guard() -> Iterator[None]:
    """Let fake CUDA tensors be indexed and moved on a CPU-only build of PyTorch, for the duration.

    Python indexing (``t[1:]``, ``t[idx] = v``) and ``Tensor.to`` take a device guard for the tensor's device
    before any fake-tensor dispatch, and a CPU-only build registers no guard for CUDA ("PyTorch is not linked
    with support for cuda devices"). PyTorch has its own fix for a CUDA build without GPUs:
    ``torch._C._ensureCUDADeviceGuardSet()`` (which ``FakeTensorMode`` calls) installs its fake CUDA guard when
    the registered one reports no devices. On a CPU-only build nothing is registered, so this puts a guard that
    reports no devices (the lazy-tensor one) in CUDA's slot of c10's registry, lets PyTorch replace it with
    its fake CUDA guard, and empties the slot again on exit. It does not touch the registry where CUDA is
    compiled in (a CUDA build finds no GPU and installs the fake guard itself), where the slot is already
    taken, or where the registry cannot be found (then indexing a fake CUDA tensor fails as before). No public
    API registers a CUDA device guard.

    Wherever no GPU is usable (a CPU-only build, or a CUDA build on a machine without a driver) it also keeps
    ``torch.tensor(..., device="cuda")`` from allocating on the device while AOTAutograd traces
    (``torch._C._set_only_lift_cpu_tensors``: the tensor is made on the CPU and moved by a traced op, which is
    what ``FakeTensorMode`` itself does inside its ``with`` block when no GPU is available), and turns off
    make_fx's constant propagation of one-element tensors (``proxy_tensor.CONSTANT_NUMEL_LIMIT``), which runs
    the op for real, on the device. (A one-element constant that the GPU run would fold into a Python number
    then shows as an op in the planned graph.) With a usable GPU it does nothing.
    """
    if torch.cuda.is_available():
        yield
        return
    from torch.fx.experimental import proxy_tensor

    lift_cpu_only, numel_limit = torch._C._only_lift_cpu_tensors(), proxy_tensor.CONSTANT_NUMEL_LIMIT
    torch._C._set_only_lift_cpu_tensors(True)
    proxy_tensor.CONSTANT_NUMEL_LIMIT = 0
    registry = None if torch.backends.cuda.is_built() else _guard_registry()
    installed = registry is not None and not registry[_CUDA] and bool(registry[_LAZY])
    if installed:
        registry[_CUDA] = registry[_LAZY]
        torch._C._ensureCUDADeviceGuardSet()
        if registry[_CUDA] == registry[_LAZY]:  # this PyTorch did not install its fake guard: undo
            registry[_CUDA] = None
    try:
        yield
    finally:
        torch._C._set_only_lift_cpu_tensors(lift_cpu_only)
        proxy_tensor.CONSTANT_NUMEL_LIMIT = numel_limit
        if installed:
            registry[_CUDA] = None
