"""Multi-stream benchmark: the two-branch model with its branches on side streams vs on one stream.

``run_multistream`` compiles :class:`airgraph.models.TwoBranch` twice per case (``streams=True`` and
``streams=False``, same weights), times ``steps`` calls of each (device synchronized around each call on
CUDA), checks the two outputs agree, and returns one JSON-able dict. On CUDA in reduce-overhead the whole
multi-stream DAG is one captured CUDA graph. On the CPU there are no device streams: both variants run the
same ordered executor, so the ratio is ~1 (recorded for completeness).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from rich import box
from rich.table import Table

import airgraph
from airgraph.bench.decode import resolve_device
from airgraph.bench.results import environment
from airgraph.models import TwoBranch, two_branch_inputs

# name: (batch, dim, depth). "small": each branch uses well under half the SMs of an H100; "saturating": each
# branch alone fills the GPU.
CASES = {"small": (16, 256, 8), "saturating": (8192, 4096, 4)}
TARGETS = {"small": "single/multi >= 1.3 (aim 1.4)", "saturating": "single/multi >= 0.97"}


def _time(model: torch.nn.Module, inputs: tuple, config: airgraph.CompilerConfig, steps: int, device) -> dict:
    torch._dynamo.reset()
    backend = airgraph.get_backend(config)
    step = torch.compile(model, backend=backend, fullgraph=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(5):  # compile, warm-up, record
            step(*inputs)
        sync()
        samples = []
        for _ in range(steps):
            start = time.perf_counter()
            step(*inputs)
            sync()
            samples.append((time.perf_counter() - start) * 1e3)
        out = step(*inputs)
    return {
        "median_ms": round(statistics.median(samples), 4),
        "captured": any(r.captured for r in backend.reports),
        # Streams the scopes assigned (on the CPU they do not split segments: no device streams there).
        "streams": sorted({n.stream for r in backend.reports for n in r.nodes if n.stream}),
        "output": out,
    }


def run_multistream(
    *,
    device: str = "auto",
    mode: str = "reduce-overhead",
    kernel_backend: str = "inductor",
    steps: int = 100,
    cases: Sequence[str] | None = None,
) -> dict[str, Any]:
    dev = resolve_device(device)
    config = airgraph.CompilerConfig()
    config.mode = mode
    config.kernel_backend = kernel_backend
    chosen = list(cases) if cases else (list(CASES) if dev.type == "cuda" else ["small"])
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        raise ValueError(f"unknown multi-stream case {unknown[0]!r}; known: {', '.join(CASES)}")
    results = {}
    for name in chosen:
        batch, dim, depth = CASES[name]
        inputs = two_branch_inputs(batch, dim, device=dev)
        row: dict[str, Any] = {}
        for streams in (False, True):
            model = TwoBranch(dim, depth, streams=streams).to(dev)
            row["multi" if streams else "single"] = _time(model, inputs, config, steps, dev)
        multi_out, single_out = row["multi"].pop("output"), row["single"].pop("output")
        row["max_abs_diff"] = float((multi_out.float() - single_out.float()).abs().max())
        row["ok"] = bool(torch.allclose(multi_out, single_out, atol=1e-3, rtol=1e-3))
        row["single_over_multi"] = round(row["single"]["median_ms"] / row["multi"]["median_ms"], 3)
        # The targets are for CUDA; on the CPU both variants compile to the same graph (no device streams).
        row["target"] = TARGETS[name] if dev.type == "cuda" else "none on CPU (same graph both ways)"
        results[name] = row
    torch._dynamo.reset()
    settings = {
        "device_type": dev.type,
        "mode": mode,
        "kernel_backend": kernel_backend,
        "steps": steps,
        "cases": {c: CASES[c] for c in chosen},
    }
    return {**environment(dev), "benchmark": "multistream", "settings": settings, "results": results}


def multistream_table(result: dict[str, Any]) -> Table:
    s = result["settings"]
    table = Table(
        title=f"two-branch model · side streams vs one stream · {s['mode']} · {s['steps']} steps",
        caption=f"{result['device']} · torch {result['torch']} · kernel backend {s['kernel_backend']}",
        box=box.SIMPLE_HEAD,
    )
    for name in ("case", "one stream ms", "two streams ms", "one/two", "captured", "match", "target"):
        table.add_column(name, justify="left" if name in ("case", "target") else "right")
    for case, r in result["results"].items():
        table.add_row(
            case,
            f"{r['single']['median_ms']:.3f}",
            f"{r['multi']['median_ms']:.3f}",
            f"{r['single_over_multi']:.2f}x",
            "yes" if r["multi"]["captured"] else "no",
            "[green]✓[/]" if r["ok"] else "[red]✗[/]",
            r["target"],
        )
    return table
