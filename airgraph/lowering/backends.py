"""The kernel backends: what turns one segment's graph into a boxed callable, by name.

A kernel backend is a function ``(LowerRequest) -> boxed callable`` (a callable taking a list of inputs, cleared,
airgraph/boxed.py). The registry below is filled by the ``kernel_backend`` decorator in this module only, so
the list of backends is readable here, and it is the one source of the values ``config.kernel_backend`` accepts
(config.py reads :func:`selectable`). The seam (lowering/select.py) chooses one per segment; lower.py calls it.

This module imports no torch: ``import airgraph`` (which validates the config) must stay light. Each backend
imports its implementation when first used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airgraph.boxed import boxed
from airgraph.lowering.request import LowerRequest

__all__ = ["KERNEL_BACKENDS", "KernelBackend", "LowerRequest", "kernel_backend", "selectable"]


KernelBackend = Callable[[LowerRequest], Callable[[list], Any]]


@dataclass(frozen=True)
class _Entry:
    fn: KernelBackend
    selectable: bool  # a value of config.kernel_backend (the others are chosen by the seam only)
    doc: str


KERNEL_BACKENDS: dict[str, _Entry] = {}


def kernel_backend(name: str, *, selectable: bool = True) -> Callable[[KernelBackend], KernelBackend]:
    def register(fn: KernelBackend) -> KernelBackend:
        KERNEL_BACKENDS[name] = _Entry(fn, selectable, next(iter((fn.__doc__ or "").strip().splitlines()), ""))
        return fn

    return register


def selectable() -> tuple[str, ...]:
    """The values ``config.kernel_backend`` accepts."""
    return tuple(name for name, entry in KERNEL_BACKENDS.items() if entry.selectable)


def get(name: str) -> KernelBackend:
    if name not in KERNEL_BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; known: {', '.join(KERNEL_BACKENDS)}")
    return KERNEL_BACKENDS[name].fn


# Options the tuning bank's choices add (airgraph/tuning): per-operator choices and frozen weights.
TUNED_OPTIONS = ("op_choices", "frozen")


def _tuned(request: LowerRequest, lower: KernelBackend, *, inductor: bool) -> Callable[[list], Any]:
    """``lower(request)``, through airgraph/tuning/lowering.py when the request carries tuning choices."""
    if not any(name in request.options for name in TUNED_OPTIONS):
        return lower(request)
    from airgraph.tuning.lowering import lower_tuned

    return lower_tuned(request, lower, inductor=inductor)


@kernel_backend("inductor")
def _inductor(request: LowerRequest) -> Callable[[list], Any]:
    """Inductor: fused Triton kernels on CUDA, C++ on the CPU (options: Inductor config patches, cpp_wrapper)."""
    from airgraph.lowering.inductor import compile_inductor

    return _tuned(request, compile_inductor, inductor=True)


@kernel_backend("aten")
def _aten(request: LowerRequest) -> Callable[[list], Any]:
    """Direct ATen calls: one generated Python function per segment, fast to compile."""
    from airgraph.lowering.aten import compile_aten

    return _tuned(request, lambda r: compile_aten(r.gm), inductor=False)


@kernel_backend("static_kernels", selectable=False)
def _static_kernels(request: LowerRequest) -> Callable[[list], Any]:
    """Static kernels (airgraph/kernels): a prebuilt kernel per input-shape key, others' dynamic kernel lazily."""
    # The seam's static_kernels step put the kernel library itself in the options: lowering imports no kernels/.
    return request.options["kernels"].segment(request)


@kernel_backend("interpreter", selectable=False)
def _interpreter(request: LowerRequest) -> Callable[[list], Any]:
    """debug.run_eagerly: torch.fx.Interpreter, one node at a time, for bisecting."""
    import torch

    interpreter = torch.fx.Interpreter(request.gm)

    def segment(args: list) -> Any:
        return interpreter.boxed_run(args)

    return boxed(segment)
