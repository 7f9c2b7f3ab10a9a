"""Segments and the kernel backends that lower them.

A kernel backend is a function ``(gm, example_inputs, *, kind, donated) -> boxed callable`` (``donated``:
positions of the segment's inputs it may overwrite, from AOTAutograd's donated backward buffers); the
registry below is filled by the ``kernel_backend`` decorator in this module only, so the list of backends
is readable here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.lowering.layouts import Layouts, real_outputs
from airgraph.lowering.partition import DEVICE, HOST, Segment, partition
from airgraph.passes.base import aliased_base

__all__ = ["DEVICE", "HOST", "KERNEL_BACKENDS", "Layouts", "Segment", "lower_segments", "partition"]

KernelBackend = Callable[..., Callable[[list], Any]]
KERNEL_BACKENDS: dict[str, KernelBackend] = {}


def kernel_backend(name: str) -> Callable[[KernelBackend], KernelBackend]:
    def register(fn: KernelBackend) -> KernelBackend:
        KERNEL_BACKENDS[name] = fn
        return fn

    return register


@kernel_backend("inductor")
def _inductor(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, donated: list[int] | None = None
) -> Callable[[list], Any]:
    from airgraph.lowering.inductor import compile_inductor

    return compile_inductor(gm, example_inputs, kind=kind, donated=donated)


@kernel_backend("aten")
def _aten(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, donated: list[int] | None = None
) -> Callable[[list], Any]:
    from airgraph.lowering.aten import compile_aten

    return compile_aten(gm)


@kernel_backend("interpreter")
def _interpreter(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, donated: list[int] | None = None
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
    segments: list[Segment],
    requested: str,
    *,
    kind: str,
    placeholders: list[torch.fx.Node] | None = None,
    layouts: Layouts | None = None,
) -> None:
    """Lower every compute segment, in order. ``placeholders`` (the graph's) let a backward segment overwrite the
    donated inputs it reads last (see :func:`donated_inputs`); without them, none. ``layouts`` (lowering/layouts.py)
    carries the strides values really have from segment to segment; without it, the traced ones."""
    if requested not in KERNEL_BACKENDS:
        raise ValueError(f"unknown kernel backend {requested!r}; known: {', '.join(KERNEL_BACKENDS)}")
    compute = [seg for seg in segments if seg.kind == "compute"]
    donated = donated_inputs(compute, placeholders) if kind == "backward" and placeholders is not None else {}
    for seg in segments:
        if seg.kind != "compute":
            seg.backend = seg.kind
            continue
        seg.backend = backend_for(seg, requested)
        lower = KERNEL_BACKENDS[seg.backend]
        inputs = layouts.inputs(seg.inputs) if layouts is not None else seg.example_inputs()
        seg.compiled, real = real_outputs(
            lambda inputs, seg=seg, lower=lower: lower(seg.gm, inputs, kind=kind, donated=donated.get(seg.id, [])),
            seg.gm,
            inputs,
            reports=seg.backend == "inductor",
        )
        if layouts is not None:
            layouts.record(seg.outputs, real)


def donated_inputs(segments: list[Segment], placeholders: list[torch.fx.Node]) -> dict[int, list[int]]:
    """Segment id -> positions of its inputs it may overwrite: AOTAutograd's donated backward buffers
    (``bw_donated_idxs``, positions among the graph's inputs: saved tensors nothing else holds), each given
    to the one segment that uses its memory, at its position among that segment's inputs.

    A donated input whose memory another segment also reads (the input itself or a view of it), or that a
    segment returns a view of, is not donated: Inductor sees only its own segment, and would overwrite memory
    that another segment, maybe on another stream, still reads."""
    context = torch._guards.TracingContext.try_get()
    graph_donated = getattr(getattr(context, "fw_metadata", None), "bw_donated_idxs", None) or []
    users: dict[torch.fx.Node, set[int]] = {}  # memory (its base node) -> segments reading it
    returned = {aliased_base(node) for seg in segments for node in seg.outputs}  # memory a segment hands on
    for seg in segments:
        for node in seg.inputs:
            users.setdefault(aliased_base(node), set()).add(seg.id)
    by_id = {seg.id: seg for seg in segments}
    donated: dict[int, list[int]] = {}
    for index in graph_donated:
        node = placeholders[index] if index < len(placeholders) else None
        if node is None or node in returned or len(users.get(node, ())) != 1:
            continue
        (seg_id,) = users[node]
        if node in by_id[seg_id].inputs:
            donated.setdefault(seg_id, []).append(by_id[seg_id].inputs.index(node))
    return donated
