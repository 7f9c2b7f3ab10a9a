"""Multi-stream benchmark (issue #3): two independent branches, multi-stream vs single stream.

In reduce-overhead on CUDA the whole multi-stream DAG is one captured CUDA graph. Targets (GPU):
small branches (each well under half the SMs): single / multi latency >= 1.3x (aim 1.4x); branches that
saturate the GPU: multi-stream at most 3% slower than single stream. On the CPU there are no device
streams: both variants run the same ordered executor (recorded for completeness).

    python benchmarks/multistream.py [--device auto] [--mode reduce-overhead] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import airgraph
from airgraph.bench import environment, resolve_device, write_json
from airgraph.models import TwoBranch, two_branch_inputs

CASES = {  # name: (batch, dim, depth)
    "small": (16, 256, 8),
    "saturating": (8192, 4096, 4),
}


def measure(model: torch.nn.Module, inputs, mode: str, kernel_backend: str, device, steps: int) -> dict:
    config = airgraph.CompilerConfig()
    config.mode = mode
    config.kernel_backend = kernel_backend
    torch._dynamo.reset()
    backend = airgraph.get_backend(config)
    step = torch.compile(model, backend=backend, fullgraph=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(5):
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
        "median_ms": statistics.median(samples),
        "captured": any(r.captured for r in backend.reports),
        "streams": sorted({s.stream for r in backend.reports for s in r.segments if s.stream}),
        "output": out,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--mode", default="reduce-overhead", choices=["max-autotune", "reduce-overhead"])
    parser.add_argument("--kernel-backend", default="inductor", choices=["inductor", "aten"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--cases", default=None, help="comma list of: " + ", ".join(CASES))
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    cases = args.cases.split(",") if args.cases else (list(CASES) if device.type == "cuda" else ["small"])
    results = {}
    for name in cases:
        batch, dim, depth = CASES[name]
        inputs = two_branch_inputs(batch, dim, device=device)
        row = {}
        for streams in (False, True):
            model = TwoBranch(dim, depth, streams=streams).to(device)
            row["multi" if streams else "single"] = measure(
                model, inputs, args.mode, args.kernel_backend, device, args.steps
            )
        torch.testing.assert_close(row["multi"].pop("output"), row["single"].pop("output"), atol=1e-3, rtol=1e-3)
        row["single_over_multi"] = row["single"]["median_ms"] / row["multi"]["median_ms"]
        results[name] = row
        print(f"{name:11s} single {row['single']['median_ms']:.4f} ms  multi {row['multi']['median_ms']:.4f} ms  "
              f"single/multi {row['single_over_multi']:.3f}  streams {row['multi']['streams']}")  # fmt: skip
    report = {
        **environment(device),
        "benchmark": "multistream",
        "settings": {"mode": args.mode, "kernel_backend": args.kernel_backend, "steps": args.steps, "cases": CASES},
        "results": results,
        "targets": {"small single/multi": ">= 1.3 (aim 1.4)", "saturating single/multi": ">= 0.97"},
    }
    output = args.output or f"benchmarks/results/multistream_{device.type}.json"
    write_json(report, output)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
