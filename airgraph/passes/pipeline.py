"""The pass pipeline: one ordered list; each entry's name is its switch under ``config.passes``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from airgraph.passes.base import CompileContext, PassResult
from airgraph.passes.concat_linear import concat_linear
from airgraph.passes.dce import dead_code_elimination
from airgraph.passes.fallback import fallback
from airgraph.passes.host_placement import host_placement
from airgraph.passes.remove_noops import remove_noops
from airgraph.passes.streams import streams
from airgraph.report.schema import PassReport

Pass = Callable[[torch.fx.GraphModule, CompileContext], PassResult]

# Order matters: streams first (every later pass sees node.meta["stream"]); concat_linear next (its matmuls keep
# their stream; the views it leaves unused DCE sweeps); host placement next (it turns device-to-host copies of
# values now on the host into host copies, which no-op removal then drops); no-op removal leaves dead producers
# behind that DCE then sweeps; fallback last, so the nodes it marks are named as the partitioner sees them.
PIPELINE: list[tuple[str, Pass]] = [
    ("streams", streams),
    ("concat_linear", concat_linear),
    ("host_placement", host_placement),
    ("remove_noops", remove_noops),
    ("dead_code_elimination", dead_code_elimination),
    ("fallback", fallback),
]


def run_pipeline(gm: torch.fx.GraphModule, ctx: CompileContext) -> list[PassReport]:
    """Run every pass in order, honouring its switch; dump the graph after each when asked."""
    reports = []
    dump_dir = _dump_dir(ctx)
    if dump_dir:
        _dump(gm, dump_dir, 0, "input")
    for index, (name, fn) in enumerate(PIPELINE, start=1):
        enabled = bool(getattr(ctx.config.passes, name))
        report = PassReport(name=name, enabled=enabled)
        if enabled:
            start = time.perf_counter()
            result = fn(gm, ctx)
            report.seconds = time.perf_counter() - start
            report.changed, report.details = result.changed, list(result.details)
            if result.changed:
                gm.graph.lint()
                gm.recompile()
        reports.append(report)
        if dump_dir:
            _dump(gm, dump_dir, index, name)
    return reports


def _dump_dir(ctx: CompileContext) -> str | None:
    root = ctx.config.debug.graph_dump
    if not root:
        return None
    path = os.path.join(root, f"graph_{ctx.report.id}_{ctx.kind}")
    os.makedirs(path, exist_ok=True)
    return path


def _dump(gm: torch.fx.GraphModule, folder: str, index: int, name: str) -> None:
    with open(os.path.join(folder, f"{index:02d}_{name}.txt"), "w", encoding="utf-8") as f:
        f.write(gm.print_readable(print_output=False, include_stride=True, include_device=True))
