"""CPU overhead benchmark: a 100-op chain of tiny elementwise ops (issue #2's per-call overhead target).

Measures, side by side in one process: eager, the bare FX GraphModule Dynamo captures, torch.compile's
default (Inductor), airgraph default (Inductor kernels) and airgraph with the aten kernel backend.
Targets: airgraph default / torch.compile default <= 1.1; airgraph aten / bare FX GraphModule <= 1.1.

    python benchmarks/elementwise_chain.py [--ops 100] [--numel 16] [--reps 2000] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import airgraph
from airgraph.bench.results import environment, write_json


def chain(x: torch.Tensor, ops: int) -> torch.Tensor:
    for i in range(ops):
        kind = i % 4
        if kind == 0:
            x = x * 1.0001
        elif kind == 1:
            x = x + 0.001
        elif kind == 2:
            x = torch.sin(x)
        else:
            x = torch.relu(x)
    return x


def per_call_us(fn, x: torch.Tensor, reps: int, rounds: int = 7) -> float:
    """Median over rounds of the mean per-call time of `reps` back-to-back calls, in microseconds."""
    for _ in range(max(10, reps // 20)):
        fn(x)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            fn(x)
        samples.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--numel", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds over all candidates")
    parser.add_argument("--output", default="benchmarks/results/elementwise_chain_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.randn(args.numel)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return chain(t, args.ops)

    captured: list[torch.fx.GraphModule] = []

    def grab(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        captured.append(gm)
        return gm.forward

    torch.compile(fn, backend=grab, fullgraph=True)(x)
    graph_module = captured[0]

    def bare_fx(t: torch.Tensor) -> torch.Tensor:
        (out,) = graph_module(t)
        return out

    def compiled(backend) -> object:
        torch._dynamo.reset()
        f = torch.compile(fn, backend=backend, fullgraph=True)
        f(x)
        return f

    aten_config = airgraph.CompilerConfig()
    aten_config.kernel_backend = "aten"
    candidates = {
        "eager": fn,
        "bare FX GraphModule": bare_fx,
        # Dynamo's own per-call cost (guards, frame) with the same graph behind it: a floor for any backend.
        "Dynamo + bare FX GraphModule": compiled(lambda gm, example_inputs: gm.forward),
        "torch.compile default": compiled("inductor"),
        "airgraph default": compiled(airgraph.get_backend()),
        "airgraph aten": compiled(airgraph.get_backend(aten_config)),
    }
    with torch.no_grad():
        expected = fn(x)
        for f in candidates.values():
            torch.testing.assert_close(f(x), expected)
        # Interleave candidates over rounds so machine noise hits them alike.
        results: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, f in candidates.items():
                results[name].append(per_call_us(f, x, args.reps))
    medians = {name: statistics.median(v) for name, v in results.items()}
    ratios = {
        "airgraph default / torch.compile default": medians["airgraph default"] / medians["torch.compile default"],
        "airgraph aten / bare FX GraphModule": medians["airgraph aten"] / medians["bare FX GraphModule"],
        "airgraph aten / Dynamo + bare FX GraphModule": medians["airgraph aten"]
        / medians["Dynamo + bare FX GraphModule"],
    }
    report = {
        **environment(torch.device("cpu")),
        "benchmark": "elementwise_chain",
        "settings": {"ops": args.ops, "numel": args.numel, "reps": args.reps, "rounds": args.rounds, "threads": 1},
        "per_call_us": medians,
        "ratios": ratios,
        "targets": {"airgraph default / torch.compile default": 1.1, "airgraph aten / bare FX GraphModule": 1.1},
    }
    for name, value in medians.items():
        print(f"{name:30s} {value:9.1f} us/call")
    for name, value in ratios.items():
        print(f"{name:50s} {value:.3f}")
    write_json(report, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
