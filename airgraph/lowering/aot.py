"""AOTAutograd's knowledge of the graph being compiled, read from torch's tracing context: the one reader.

While AOTAutograd compiles a graph it keeps, in ``torch._guards.TracingContext``, its metadata (``fw_metadata``:
which inputs are parameters and buffers, which it mutates, which outputs alias an input, which backward inputs
are donated) and a list in which the compiler reports its outputs' strides. The backend, the lowering, the static
kernels and tuning read and set them through this module only, so that torch 2.11 to 2.15's differences are
handled here once.

Invariants:

- outside a compile (no tracing context), and for a field a torch version lacks, every reader answers "nothing
  known": no static inputs, no donations, no frozen weights, no warm start; never an error, never a guess;
- only compile-time code imports it (the runtime does not: ``import_graph.py --rule runtime:passes,lowering``);
- a graph compiled from the compile cache (AOTAutograd skipped) is answered from the facts AOTAutograd gave when
  the entry was written (:func:`snapshot`, :func:`replaying`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch._guards import TracingContext

__all__ = [
    "donated_inputs",
    "donating",
    "no_runtime_wrappers",
    "replaying",
    "report_output_strides",
    "reported_output_strides",
    "snapshot",
    "static_input_indices",
    "tracing",
    "tracing_active",
    "unchanged_weights",
]


# The facts of a graph compiled from the compile cache, AOTAutograd's answers recorded with the entry (snapshot).
_replayed: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("airgraph_aot_replayed", default=None)


def _metadata() -> Any | None:
    """AOTAutograd's ``ViewAndMutationMeta`` of the graph compiling now, or None."""
    return getattr(TracingContext.try_get(), "fw_metadata", None)


def snapshot(num_inputs: int) -> dict[str, Any] | None:
    """What the readers below answer for the inference graph compiling now, to answer the same for it without
    AOTAutograd (:func:`replaying`); None when AOTAutograd's runtime wrappers have work around it (the graph then
    needs AOTAutograd every time) or nothing is compiling."""
    if not no_runtime_wrappers(num_inputs):
        return None
    return {
        "num_inputs": num_inputs,
        "static_input_indices": static_input_indices(),
        "unchanged_weights": sorted(unchanged_weights()),
    }


@contextlib.contextmanager
def replaying(facts: dict[str, Any]) -> Iterator[None]:
    """Answer from ``facts`` (a :func:`snapshot`) where no AOTAutograd metadata is present, for the duration."""
    token = _replayed.set(facts)
    try:
        yield
    finally:
        _replayed.reset(token)


def static_input_indices() -> list[int]:
    """Positions of the graph inputs that are parameters and buffers (Dynamo marks them static)."""
    replayed = _replayed.get()
    if replayed is not None and _metadata() is None:
        return list(replayed["static_input_indices"])
    return list(getattr(_metadata(), "static_input_indices", None) or [])


def unchanged_weights() -> set[int]:
    """Static inputs the graph neither updates (a KV cache, a running statistic) nor returns a view of."""
    replayed = _replayed.get()
    if replayed is not None and _metadata() is None:
        return set(replayed["unchanged_weights"])
    metadata = _metadata()
    try:
        static = set(metadata.static_input_indices or ())
        mutated = {i for i, info in enumerate(metadata.input_info) if info.mutates_data or info.mutates_metadata}
        aliased = {o.base_idx for o in metadata.output_info if o.base_idx is not None}
    except AttributeError:  # no graph compiling, or another AOTAutograd
        return set()
    return static - mutated - aliased


def donated_inputs() -> list[int]:
    """A backward's inputs it may overwrite (``bw_donated_idxs``: saved tensors nothing else holds)."""
    return list(getattr(_metadata(), "bw_donated_idxs", None) or [])


@contextlib.contextmanager
def donating(donated: list[int] | None) -> Iterator[None]:
    """Inductor reads ``bw_donated_idxs`` as positions among the graph it compiles: set to ``donated`` (a segment's
    own positions) for the duration; None, or a torch without donations, leaves them alone."""
    metadata = _metadata()
    if donated is None or metadata is None or not hasattr(metadata, "bw_donated_idxs"):
        yield
        return
    saved = metadata.bw_donated_idxs
    metadata.bw_donated_idxs = donated
    try:
        yield
    finally:
        metadata.bw_donated_idxs = saved


def no_runtime_wrappers(num_inputs: int) -> bool:
    """Whether AOTAutograd's runtime wrappers have nothing to do around the graph compiling now (of ``num_inputs``
    inputs): no input mutation left to them, no aliased output, no intermediate base, no effect token, no tensor
    subclass input."""
    metadata = _metadata()
    if metadata is None:
        replayed = _replayed.get()
        return replayed is not None and replayed["num_inputs"] == num_inputs
    return (
        metadata.num_mutated_inp_runtime_indices == 0
        and not metadata.aliased_out_indices
        and metadata.num_intermediate_bases == 0
        and not metadata.tokens
        and len(metadata.input_info) == num_inputs
        and not any(type(m).__name__ == "SubclassCreationMeta" for m in metadata.subclass_inp_meta)
    )  # (by name: torch 2.15's PlainTensorMeta has an arg_count too)


def report_output_strides(strides: list[tuple[int, ...] | None]) -> None:
    """Tell AOTAutograd the graph outputs' real strides (it compiles the backward for them), when it asks.

    A graph with side effects (``torch.linalg.solve``'s error checks, say) returns its effect tokens first unless
    AOTAutograd unlifted them (as Inductor has it do); the strides it asks for are those of the outputs after the
    tokens, which it splits off itself, so theirs are left out here (issue #44: else the saved tensors' strides
    are off by one and the backward fails to compile)."""
    context = TracingContext.try_get()
    if context is None or context.output_strides is None:
        return
    metadata = context.fw_metadata
    tokens = 0
    if metadata is not None and not torch._functorch.config.unlift_effect_tokens:
        tokens = len(metadata.tokens)
    context.output_strides.clear()
    context.output_strides.extend(strides[tokens:])


@contextlib.contextmanager
def reported_output_strides() -> Iterator[list]:
    """A list of our own in which a compiler reports its outputs' strides; the enclosing graph's is left alone."""
    with TracingContext.report_output_strides() as strides:
        yield strides


def tracing_active() -> bool:
    return TracingContext.try_get() is not None


@contextlib.contextmanager
def tracing(fake_mode: Any | None, *, guards_to_current: bool = False) -> Iterator[None]:
    """A tracing context of its own for ``fake_mode`` (compiling outside torch.compile's), or none (None).
    ``guards_to_current``: the guards installed meanwhile (frozen parameters' identity guards) go to the context
    current now, Dynamo's, whose compiled graph they guard (a compile-cache hit compiles in a context of its own)."""
    context = TracingContext(fake_mode) if fake_mode is not None else None
    outer = TracingContext.try_get()
    if context is not None and guards_to_current and outer is not None:
        context.guards_context = outer.guards_context
    with torch._guards.tracing(context):
        yield
