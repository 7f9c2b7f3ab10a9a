"""GPU benchmark: tiny LLaMA decode (batch 1) and the host cost of one CUDA graph replay.

Targets (issue #2, on the GPU machine): airgraph reduce-overhead / torch.compile(mode="reduce-overhead")
latency <= 1.0 (aim 0.9); eager / airgraph reduce-overhead >= 3x; host cost of one replay <= 20 us. Issue #19:
airgraph's fast path (``airgraph.compile(..., fast_path=True)``) / torch.compile reduce-overhead <= 0.9 on the tiny
and small presets; host time to issue one step <= 20 us.

    python benchmarks/llama_decode.py [--preset tiny] [--steps 200] [--output PATH]

The latency table comes from airgraph.bench.decode.run_bench (all modes side by side in one process). The host
cost is the wall time of issuing one airgraph reduce-overhead decode call without synchronizing (Dynamo
guards, AOTAutograd's wrapper, input copies, the replay launch and the output copy), over a burst short
enough that the GPU never makes the host wait.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import airgraph
from airgraph.bench.decode import print_results, run_bench
from airgraph.bench.results import environment, write_json
from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs


def replay_host_cost_us(preset: str, bursts: int = 20, calls: int = 20, *, fast_path: bool = False) -> float:
    model = build_tiny_llama(preset, device="cuda")
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    torch._dynamo.reset()
    step = airgraph.compile(model, config, fast_path=fast_path, fullgraph=True)
    with torch.no_grad():
        model(*prefill_inputs(model.config, 1, 8, device="cuda"))
        tokens, pos = decode_inputs(model.config, 1, 8, device="cuda")
        for _ in range(5):  # warm-up, record, a few replays
            step(tokens, pos)
        samples = []
        for _ in range(bursts):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                step(tokens, pos)  # the output dropped at once: a replay then copies nothing
            samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output", default="benchmarks/results/llama_decode_cuda.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (run it on the GPU machine)")
    result = run_bench(preset=args.preset, batch=1, steps=args.steps, warmup=20, device="cuda", progress=False)
    print_results(result)
    median = {r["mode"]: r["median_ms"] for r in result["results"]}
    result["host_cost_per_replay_us"] = replay_host_cost_us(args.preset)
    result["host_cost_per_fast_path_call_us"] = replay_host_cost_us(args.preset, fast_path=True)
    torch_ro = median["torch.compile reduce-overhead"]
    result["ratios"] = {
        "airgraph reduce-overhead / torch.compile reduce-overhead": median["airgraph reduce-overhead"] / torch_ro,
        "airgraph fast-path / torch.compile reduce-overhead": median["airgraph fast-path"] / torch_ro,
        "eager / airgraph reduce-overhead": median["eager"] / median["airgraph reduce-overhead"],
    }
    result.update({k: v for k, v in environment(torch.device("cuda")).items() if k not in result})
    print(
        result["ratios"],
        f"host cost per replay: {result['host_cost_per_replay_us']:.1f} us, "
        f"per fast-path call {result['host_cost_per_fast_path_call_us']:.1f} us",
    )
    write_json(result, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
