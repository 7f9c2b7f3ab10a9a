"""Fake CUDA tensors on a machine without a usable GPU: :func:`fake_cuda_guard`. Used by planning (report/) and
by the CUDA simulator (runtime/simulated_device.py), so it lives below both."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["fake_cuda_guard"]

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

    It also keeps ``torch.tensor(..., device="cuda")`` from allocating on the device while AOTAutograd traces
    (``torch._C._set_only_lift_cpu_tensors``: the tensor is made on the CPU and moved by a traced op, which is
    what ``FakeTensorMode`` itself does inside its ``with`` block when no GPU is available), and turns off
    make_fx's constant propagation of one-element tensors (``proxy_tensor.CONSTANT_NUMEL_LIMIT``), which runs
    the op for real, on the device. (A one-element constant that a GPU run would fold into a Python number
    then shows as an op in the planned graph.) It does both on a machine with a GPU too, so that a plan and
    the simulator trace the same graph on every machine: on the H100 they traced real CUDA constants where the
    CPU machines traced a CPU constant and a copy, and CPU tests that read those graphs failed there.
    """
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
