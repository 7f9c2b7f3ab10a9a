"""The fix airgraph.compare gives for a wrong decomposition (issue #45), and what it costs.

The issue's model, a two-block MLP with LayerNorm and SiLU, in a process where Inductor's silu decomposition is
replaced by a slightly wrong one (x * sigmoid(1.05 * x)), planted by this script as the issue planted it.
``airgraph.compare`` is run once (it finds the decomposition by switching suspects off, each a compile), then with
``report.fallback()`` (compare must say ok), and the call time is measured with the config compared and with the
fallback (``airgraph.precision.fallback.call_times``: torch.utils.benchmark medians), ``--runs`` times.

    python benchmarks/compare_fallback.py [--batch 64] [--width 256] [--runs 3] [--output PATH]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch._inductor import decomposition as inductor_decomposition

import airgraph
from airgraph.bench.results import environment, write_json
from airgraph.precision.fallback import call_times


class MLP(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.norm1 = torch.nn.Linear(width, 4 * width), torch.nn.LayerNorm(4 * width)
        self.fc2, self.norm2 = torch.nn.Linear(4 * width, width), torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.norm1(self.fc1(x)))
        return torch.nn.functional.silu(self.norm2(self.fc2(h)))


def _wrong_silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.05 * x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", default="benchmarks/results/compare_fallback_cpu.json")
    args = parser.parse_args()
    inductor_decomposition.decompositions[torch.ops.aten.silu.default] = _wrong_silu
    torch.manual_seed(0)
    model, x = MLP(args.width).eval(), torch.randn(args.batch, args.width)
    config = airgraph.CompilerConfig()
    config.compile_cache = False
    with torch.no_grad():
        start = time.perf_counter()
        report = airgraph.compare(model, x, config=config)
        compare_s = time.perf_counter() - start
        fix = report.fallback()
        fixed = airgraph.compare(model, x, config=fix)
        runs = [call_times(model, x, config=config, fallback=fix) for _ in range(args.runs)]
    result = {
        "environment": environment(torch.device("cpu")),
        "settings": {"batch": args.batch, "width": args.width, "runs": args.runs, "planted": "aten.silu decomposition"},
        "found": report.before.to_dict() if report.before else None,
        "compare_s": compare_s,
        "max_abs_before_fix": max(d.max_abs for d in report.values),
        "fallback": fix.fallback.to_dict(),
        "fallback_ok": fixed.ok,
        "runs": [{"without_ms": t["without_s"] * 1e3, "with_ms": t["with_s"] * 1e3} for t in runs],
        "with_over_without": [t["with_s"] / t["without_s"] for t in runs],
    }
    path = write_json(result, args.output)
    print(report.before)
    print(f"fallback ok: {fixed.ok}; with / without per run: {[round(r, 3) for r in result['with_over_without']]}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
