"""airgraph.explain: compile a function with airgraph, run it once, and return what was compiled."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch

from airgraph.backend import AirgraphBackend
from airgraph.config import CompilerConfig
from airgraph.report import ExplainReport


def explain(fn: Any, *args: Any, config: CompilerConfig | None = None, **kwargs: Any) -> ExplainReport:
    """Compile ``fn`` (a module or function) with airgraph, run it once on the arguments, and report.

    The report lists every ATen graph compiled (inference, or forward and backward), each with its nodes
    (stream, placement, segment), segments, pass results and whether it was captured as a CUDA graph.
    """
    backend = AirgraphBackend(config)
    before = Counter(torch._dynamo.utils.counters["graph_break"])
    compiled = torch.compile(fn, backend=backend)
    compiled(*args, **kwargs)
    if backend.config.debug.trace_path:
        write_trace(compiled, args, kwargs, backend.config.debug.trace_path)
    after = Counter(torch._dynamo.utils.counters["graph_break"])
    breaks = sorted((after - before).elements())
    return ExplainReport(
        graphs=list(backend.reports),
        config=backend.config.as_dict(),
        dynamo_graphs=backend.dynamo_graphs,
        graph_breaks=breaks,
    )


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
