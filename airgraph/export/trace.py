"""Tracing for export: the eager reference run and Dynamo's one-graph capture (``torch.export.export(strict=True)``).

Failures become :class:`ExportError` naming what went wrong and the user's source line.

Dynamic dims (``dynamic=True``): dims 0 and 1 of every tensor input (batch and sequence by convention) are
``Dim.AUTO``: symbolic unless the model pins them (``nn.Linear`` pins a feature dim, a broadcast ties two
dims into one symbol). Other dims stay static. A dim exported at size 0 or 1 stays static (torch.export
specializes sizes 0 and 1), so export with sizes >= 2 for the dims that should vary.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from airgraph.export.errors import ExportError
from airgraph.graph import source as sources
from airgraph.graph.source import Frame, exception_chain, frames_of_exception, frames_of_text

__all__ = [
    "DYNAMIC_AXES",
    "Reference",
    "call_quietly",
    "capture",
    "conversion_error",
    "dynamic_shapes_spec",
    "eager_reference",
    "user_source",
]

DYNAMIC_AXES = (0, 1)
_EXPORT_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Reference:
    """Flat tensor inputs and outputs of the eager run (non-tensor leaves are constants of the export)."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    non_tensor_outputs: int


def user_source(frames: Sequence[Frame]) -> tuple[str | None, str]:
    """``("file:line", code)`` of the innermost frame outside torch and airgraph.export, or ``(None, "")``."""
    return sources.user_source(frames, skip=(_EXPORT_DIR,))


@torch.no_grad()
def eager_reference(model: torch.nn.Module, args: tuple, kwargs: dict) -> Reference:
    """Run the model eagerly; buffers it updates in place (KV caches) are restored afterwards."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        result = model(*args, **kwargs)
    finally:
        for buf, saved in buffers:
            buf.copy_(saved)
    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    leaves = pytree.tree_leaves(result)
    outputs = [t.detach().clone() for t in leaves if isinstance(t, torch.Tensor)]
    return Reference([t.detach().clone() for t in inputs], outputs, len(leaves) - len(outputs))


def dynamic_shapes_spec(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``dynamic_shapes`` for torch.export: ``Dim.AUTO`` on dims 0 and 1 of every tensor input, by argument name."""
    auto = torch.export.Dim.AUTO

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {axis: auto for axis in DYNAMIC_AXES if axis < value.ndim} or None
        return None

    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        detail = f"the example inputs do not fit {type(model).__name__}.forward: {exc}"
        raise ExportError("invalid argument", detail) from None
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def _classify(exc: BaseException) -> tuple[str, str]:
    """(reason, first line of the explanation) of a torch.export failure."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0].strip() if lines else type(exc).__name__
    lowered = text.lower()
    name = type(exc).__name__
    if "data-dependent branching" in lowered or "dynamic control flow" in lowered:
        return "data-dependent control flow", first
    if name in ("GuardOnDataDependentSymNode", "DataDependentOutputException") or "data-dependent" in lowered:
        return "data-dependent shape", first
    if name in ("Unsupported", "UncapturedHigherOrderOpError") or "graph break" in lowered:
        return "graph break", first
    return "capture failed", f"{name}: {first}"


def capture(
    model: torch.nn.Module, args: tuple, kwargs: dict, *, dynamic: bool
) -> tuple[torch.export.ExportedProgram, dict[str, Any] | None]:
    """Dynamo captures the model as one graph; returns the program and the dynamic_shapes given."""
    shapes = dynamic_shapes_spec(model, args, kwargs) if dynamic else None
    try:
        with _partial_graph_once():
            program = torch.export.export(model, args, kwargs, dynamic_shapes=shapes, strict=True)
    except Exception as exc:
        reason, detail = _classify(exc)
        hint = {
            "graph break": "the exported model must be one graph (fullgraph): remove the unsupported code",
            "data-dependent control flow": "use torch.where or torch.cond instead of a Python if on a tensor",
            "data-dependent shape": "shapes must not depend on tensor values",
        }.get(reason)
        source, code = user_source(frames_of_exception(exc))
        message = f"{detail}{f' in `{code}`' if code else ''}{f' ({hint})' if hint else ''}"
        raise ExportError(reason, message, source=source) from exc
    return program, shapes


@contextlib.contextmanager
def _partial_graph_once() -> Iterator[None]:
    """torch.export prints the graph captured up to a data-dependent failure to stderr from each of its nested
    entry points (twice on torch 2.13): what it writes to stderr is held back and written once per graph."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException as exc:
        text = held.getvalue()
        partial = getattr(exc, "partial_fx_graph", None)
        if partial:
            text = text.replace(f"{partial}\n", "") + f"{partial}\n"
        sys.stderr.write(text)
        raise
    sys.stderr.write(held.getvalue())


def conversion_error(exc: BaseException, program: torch.export.ExportedProgram) -> ExportError:
    """An :class:`ExportError` for a torch.onnx failure: the op it could not lower and the user's line."""
    failed_rerun = _rerun_error(exc)
    if failed_rerun is not None:
        return failed_rerun
    text = "\n".join(str(e) for e in exception_chain(exc))
    target = re.search(r"target=([\w.:]+)\]", text) or re.search(
        r"No ONNX function found for <OpOverload\(op='([^']+)'", text
    )
    node_name = re.search(r"translating node %(\w+)", text)
    op = target.group(1).removeprefix("torch.ops.") if target else None
    source, code = None, ""
    for node in program.graph.nodes:
        matches_name = node_name is not None and node.name == node_name.group(1)
        matches_op = op is not None and str(node.target).removeprefix("torch.ops.") == op
        if node.op == "call_function" and (matches_name or matches_op):
            source, code = user_source(frames_of_text(node.meta.get("stack_trace") or ""))
            if source:
                break
    if op is None:
        return ExportError("conversion failed", _first_line(exc), source=source)
    where = f" (called in `{code}`)" if code else ""
    return ExportError("unsupported op", f"the ONNX exporter has no lowering for it{where}", source=source, op=op)


_RERUN = re.compile(r"While executing %(\w+) : [^\n]*?target=([\w.:]+)\]")


def _rerun_error(exc: BaseException) -> ExportError | None:
    """A failure of an op while torch.onnx re-ran the graph on fake tensors (decomposition, type promotion).

    The op has a lowering: it failed on the shapes or strides of that run. FX names the node of torch.onnx's
    own (decomposed) graph and appends the user's frames after "Original traceback:"; the node's name says
    nothing about the captured program, so the source comes from those frames.
    """
    for error in reversed(exception_chain(exc)):  # innermost first: the op's own message
        text = str(error)
        match = _RERUN.search(text)
        if match is None:
            continue
        op = match.group(2).removeprefix("torch.ops.")
        _, _, original = text.partition("Original traceback:")
        source, code = user_source(frames_of_text(original))
        where = f" (called in `{code}`)" if code else ""
        detail = f"torch.onnx failed running {op} on its decomposed graph{where}: {_first_line(error)}"
        return ExportError("conversion failed", detail, source=source)
    return None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def call_quietly(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with torch.onnx's registry warnings (torchvision missing), onnx_ir's chatter and numpy warnings
    of the onnx reference evaluator (constant folding) silenced."""
    import logging
    import warnings

    names = ("torch.onnx._internal.exporter._registration", "onnx_ir.passes.common.initializer_deduplication")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            # the optimizer folds constants with onnx's numpy evaluator, which warns on values eager computes the
            # same way and then discards (T5's relative-position buckets take log(0) in a branch where() drops)
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnx\.reference\.")
            return fn()
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
