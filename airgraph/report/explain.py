"""airgraph.explain (and airgraph.plan): compile a function with airgraph, run it once, and return what was compiled.

Fake inputs (``FakeTensorMode``, e.g. faked on ``device="cuda"`` on a laptop) mean planning: the pass pipeline,
the capture plan and the partitioning run for real, but no kernel is generated, launched or captured
(``AirgraphBackend(plan_only=True)``), and every graph report says ``planned``. :func:`plan` fakes real inputs
and a module's parameters and buffers onto the device for the call, and puts the module's own tensors back
(the API behind ``airgraph inspect --device cuda``).

Invariants (the rules and their reasons: docs/design/compile.md, "Planning for a device you do not have"):

- the module is never modified: its state is faked for the call only;
- planned outputs are empty fake tensors shaped like the traced ones (a data-dependent size counts as 1);
- code that needs a tensor's value (a Python branch on a tensor, ``.item()``, a data-dependent shape) raises
  :class:`PlanError`, naming the user's line and the ways around it;
- training graphs need a CUDA build of PyTorch to plan; on a CPU-only build the error says to plan under
  ``torch.no_grad()``.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._pytree import tree_leaves

from airgraph.backend import AirgraphBackend
from airgraph.config import CompilerConfig
from airgraph.graph.source import exception_chain, frames_of_exception, user_source
from airgraph.report.fake import fake_cuda_guard, fake_inputs, faked_state
from airgraph.report.schema import ExplainReport

__all__ = ["PlanError", "explain", "plan", "write_trace"]

_REPORT_DIR = os.path.dirname(os.path.abspath(__file__))


class PlanError(RuntimeError):
    """Planning met code that needs a tensor's value, which fake tensors do not have.

    ``reason``: ``"data-dependent branch or value"`` (a Python ``if`` on a tensor, ``.item()``, ``bool()``) or
    ``"data-dependent shape"`` (an op whose output size depends on values, ``nonzero``); ``source``: ``"file:line"``
    of the user's code, when known; ``op``: the op that needed the value. The torch exception is the ``__cause__``.
    """

    def __init__(self, reason: str, detail: str, *, source: str | None = None, op: str | None = None) -> None:
        self.reason, self.detail, self.source, self.op = reason, detail, source, op
        where = f" at {source}" if source else ""
        super().__init__(f"airgraph.plan: {reason}{where}: {detail}")


def explain(fn: Any, *args: Any, config: CompilerConfig | None = None, **kwargs: Any) -> ExplainReport:
    """Compile ``fn`` (a module or function) with airgraph, run it once on the arguments, and report.

    The report lists every ATen graph compiled (inference, or forward and backward), each with its nodes
    (stream, placement, segment), segments, pass results and whether it was captured as a CUDA graph.

    Fake arguments (``FakeTensor``) mean planning: nothing is lowered, run or captured, the module's real
    state is faked onto the inputs' device for the call, and each graph report has ``planned=True``.
    """
    fakes = [t for t in tree_leaves((args, kwargs)) if isinstance(t, FakeTensor)]
    if not fakes:
        return _explain(AirgraphBackend(config), fn, args, kwargs)
    mode = fakes[0].fake_mode
    device = next((t.device for t in fakes if t.device.type != "cpu"), fakes[0].device)
    with fake_cuda_guard(), faked_state(fn, mode, device):
        return _explain(AirgraphBackend(config, plan_only=True), fn, args, kwargs)


def plan(
    fn: Any,
    *args: Any,
    device: str | torch.device = "cuda",
    config: CompilerConfig | None = None,
    dynamic: bool | None = None,
    **kwargs: Any,
) -> ExplainReport:
    """``explain`` for ``device`` without needing one: real tensors in the arguments, and ``fn``'s parameters and
    buffers when it is a module, are faked onto ``device``; fake ones are used as they are. Nothing runs.

    ``device``, ``config`` and ``dynamic`` (``torch.compile``'s) are keywords of this function, not of ``fn``.
    Example (on a laptop)::

        report = plan(model, tokens, input_pos, device="cuda")
        [(n.name, n.placement, n.segment, n.stream) for n in report.graphs[0].nodes]
    """
    device = torch.device(device)
    fakes = [t for t in tree_leaves((args, kwargs)) if isinstance(t, FakeTensor)]
    mode = fakes[0].fake_mode if fakes else FakeTensorMode(allow_non_fake_inputs=True)
    with fake_cuda_guard():
        args, kwargs = fake_inputs((args, kwargs), device=device, mode=mode)
        with faked_state(fn, mode, device):
            return _explain(AirgraphBackend(config, plan_only=True), fn, args, kwargs, dynamic=dynamic)


def _explain(
    backend: AirgraphBackend, fn: Any, args: tuple, kwargs: dict, *, dynamic: bool | None = None
) -> ExplainReport:
    before = Counter(torch._dynamo.utils.counters["graph_break"])
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    try:
        compiled(*args, **kwargs)
    except Exception as exc:
        if backend.plan_only and "Cannot access accelerator device" in str(exc):
            raise RuntimeError(
                "airgraph: planning a training graph (autograd on, tensors requiring grad) traces the backward "
                "through the autograd engine, which needs a CUDA build of PyTorch even with fake tensors; on a "
                "CPU-only build, plan inference: call explain/plan under torch.no_grad()"
            ) from exc
        error = _data_dependent(exc) if backend.plan_only else None
        if error is not None:
            raise error from exc
        raise
    if backend.config.debug.trace_path and not backend.plan_only:
        write_trace(compiled, args, kwargs, backend.config.debug.trace_path)
    after = Counter(torch._dynamo.utils.counters["graph_break"])
    breaks = sorted((after - before).elements())
    return ExplainReport(
        graphs=list(backend.reports),
        config=backend.config.as_dict(),
        dynamo_graphs=backend.dynamo_graphs,
        graph_breaks=breaks,
    )


def _data_dependent(exc: BaseException) -> PlanError | None:
    """A :class:`PlanError` for a planning failure that needed a tensor's value, naming the user's line; else None."""
    cause = exception_chain(exc)
    dynamic = next((e for e in cause if isinstance(e, DynamicOutputShapeException)), None)
    value = next((e for e in cause if isinstance(e, (DataDependentOutputException, GuardOnDataDependentSymNode))), None)
    found = value if value is not None else dynamic
    if found is None:
        return None
    op = str(found.func) if isinstance(found, (DataDependentOutputException, DynamicOutputShapeException)) else None
    source, code = None, ""
    for error in (found, *cause):  # the failure's own frames, else a wrapper's (Dynamo's real_stack)
        source, code = user_source(frames_of_exception(error), skip=(_REPORT_DIR,))
        if source is not None:
            break
    if found is value:
        reason = "data-dependent branch or value"
        what = f"{op} reads a tensor's value on the host" if op else "a guard depends on a tensor's value"
        examples = "a Python `if` on a tensor, .item(), bool(), int()"
        graph_fix = "keep the choice in the graph (torch.where, torch.cond) or branch on shapes, not values"
    else:
        reason = "data-dependent shape"
        what = f"{op}'s output size depends on a tensor's values"
        examples = "nonzero, boolean-mask indexing, unique"
        graph_fix = "give the op a size known from shapes (torch.where, a fixed-size mask)"
    in_code = f" in `{code}`" if code else ""
    detail = (
        f"planning runs on fake tensors, which have shapes but no values, and {what}{in_code} ({examples}). To plan "
        f"it: run airgraph.explain(fn, *inputs) on real inputs on the device instead (it runs fn, so the value is "
        f"known), or {graph_fix}"
    )
    return PlanError(reason, detail, source=source, op=op)


def write_trace(fn: Any, args: tuple, kwargs: dict, path: str) -> None:
    """Profile one call of ``fn`` and write a Chrome/Perfetto trace (open it in ui.perfetto.dev), e.g. to see
    side streams overlap."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    prof.export_chrome_trace(path)
