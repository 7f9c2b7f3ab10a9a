"""Segments and the kernel backends that lower them.

A kernel backend is a function ``(gm, example_inputs, *, kind, whole_graph) -> boxed callable``
(``whole_graph``: the segment is the entire ATen graph, inputs in the graph's order); the registry below is
filled by the ``kernel_backend`` decorator in this module only, so the list of backends is readable here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.lowering.partition import DEVICE, HOST, Segment, partition

__all__ = ["DEVICE", "HOST", "KERNEL_BACKENDS", "Segment", "lower_segments", "partition"]

KernelBackend = Callable[..., Callable[[list], Any]]
KERNEL_BACKENDS: dict[str, KernelBackend] = {}


def kernel_backend(name: str) -> Callable[[KernelBackend], KernelBackend]:
    def register(fn: KernelBackend) -> KernelBackend:
        KERNEL_BACKENDS[name] = fn
        return fn

    return register


@kernel_backend("inductor")
def _inductor(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, whole_graph: bool = False
) -> Callable[[list], Any]:
    from airgraph.lowering.inductor import compile_inductor

    return compile_inductor(gm, example_inputs, kind=kind, whole_graph=whole_graph)


@kernel_backend("aten")
def _aten(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, whole_graph: bool = False
) -> Callable[[list], Any]:
    from airgraph.lowering.aten import compile_aten

    return compile_aten(gm)


@kernel_backend("interpreter")
def _interpreter(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, whole_graph: bool = False
) -> Callable[[list], Any]:
    """debug.run_eagerly: torch.fx.Interpreter, one node at a time, for bisecting."""
    interpreter = torch.fx.Interpreter(gm)

    def segment(args: list) -> Any:
        return interpreter.boxed_run(args)

    segment._boxed_call = True
    return segment


def backend_for(segment: Segment, requested: str) -> str:
    """Host segments always run as direct ATen calls: Inductor's win is fusion on the device."""
    if requested == "interpreter":
        return requested
    return "aten" if segment.placement == HOST else requested


def lower_segments(
    segments: list[Segment], requested: str, *, kind: str, placeholders: list[torch.fx.Node] | None = None
) -> None:
    """Lower every compute segment; ``placeholders`` (the graph's) tell which segment is the whole graph."""
    if requested not in KERNEL_BACKENDS:
        raise ValueError(f"unknown kernel backend {requested!r}; known: {', '.join(KERNEL_BACKENDS)}")
    for seg in segments:
        if seg.kind != "compute":
            seg.backend = seg.kind
            continue
        seg.backend = backend_for(seg, requested)
        whole = placeholders is not None and seg.inputs == placeholders
        seg.compiled = KERNEL_BACKENDS[seg.backend](seg.gm, seg.example_inputs(), kind=kind, whole_graph=whole)
