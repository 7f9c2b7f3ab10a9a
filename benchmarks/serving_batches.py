"""Serving benchmark (issue #34): a decode step called with batch sizes drawn from 1..64, as continuous batching.

The step is airgraph/models/serving.py's: the KV caches are inputs of the call's rows, written at each row's own
position. A server of 64 request slots calls it ``--calls`` times (default 1000) with a batch drawn uniformly from
1..64 (fixed ``--seed``); the call's rows are slots 0..b-1, each at its own position, which advances by one per
call (wrapping at ``max_len``). Variants, one after another in one process, each from a fresh compile and zeroed
caches (the same inputs for all):

- ``eager``; ``torch.compile reduce-overhead, dynamic=False`` (one compile and graph per size; Dynamo's
  ``recompile_limit`` sends later sizes to eager) and ``..., mark_dynamic`` (dimension 0 of every input);
- ``airgraph reduce-overhead`` (mark_dynamic: one compile, one graph per size) and ``..., capture sizes``
  ([1, 2, 4, 8, 16, 24, 32, 48, 64]); ``..., capture size 64 only``: the largest size alone (the memory target's
  reference).

Per variant: the whole loop's seconds and the first 100 calls' (compiles and captures included; the time of the
eager checks left out), the median per call after the first 100, CUDA graphs recorded (airgraph: its reports;
on CUDA every variant's ``CUDAGraph.capture_end`` calls too), ``torch.cuda.memory_reserved()`` at the end (null
off CUDA), and the outputs (logits and the caches' real rows) checked against eager on ``--checks`` calls. Each
call is synchronized, as a server reads its sampled tokens every step. Partial results are written after every
variant (``complete: false``). ``--device simulated-cuda`` (the default without a GPU) runs airgraph's CUDA paths
on the CPU (runtime/simulated.py): its counts and checks are the CPU's result; torch.compile has no CUDA graphs
there (``--device cpu`` times its CPU code).

    python benchmarks/serving_batches.py [--device cuda|simulated-cuda|cpu] [--preset 1b|small] [--calls N]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.bench.results import environment, write_json
from airgraph.models import LlamaConfig, ServingDecode, build_serving_decode, mark_batch_dynamic
from airgraph.runtime.simulated import SimulatedCuda

CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64]
MAX_BATCH = 64
# LlamaConfig's presets (1b: Llama-3.2-1B's shapes, the roofline issue's), with the caches' length ``max_len``.
PRESETS: dict[str, dict[str, Any]] = {
    "small": {"max_len": 64, "dtype": "float32", "kernel_backend": "aten"},
    "1b": {"max_len": 256, "dtype": "bfloat16", "kernel_backend": "inductor"},
}
# In the order they run; dynamic=False last: it compiles a graph per size (up to recompile_limit), the longest on a
# GPU, and a run cut short keeps the others (written after every variant).
VARIANTS = {
    "eager": "eager",
    "tc-dynamic": "torch.compile reduce-overhead, mark_dynamic",
    "ag": "airgraph reduce-overhead",
    "ag-sizes": "airgraph reduce-overhead, capture sizes",
    "ag-64": "airgraph reduce-overhead, capture size 64 only",
    "tc-static": "torch.compile reduce-overhead, dynamic=False",
}
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-3, 3e-3)}


@dataclass
class Workload:
    """The calls: batch sizes, and each call's tokens [b, 1] and positions [b] on the device."""

    batches: list[int]
    tokens: list[torch.Tensor]
    positions: list[torch.Tensor]
    checks: set[int]


def workload(config: LlamaConfig, calls: int, checks: int, seed: int, device: torch.device) -> Workload:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randint(0, config.max_seq_len, (MAX_BATCH,), generator=generator)  # each request's position
    batches, tokens, positions = [], [], []
    for _ in range(calls):
        b = rng.randint(1, MAX_BATCH)
        batches.append(b)
        tokens.append(torch.randint(0, config.vocab_size, (b, 1), generator=generator).to(device))
        positions.append(slots[:b].clone().to(device))
        slots[:b] = (slots[:b] + 1) % config.max_seq_len
    every = max(calls // max(checks, 1), 1)
    return Workload(batches, tokens, positions, set(range(0, calls, every)[:checks]) if checks else set())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def counting_cuda_graphs() -> Iterator[list[int]]:
    """Counts ``torch.cuda.CUDAGraph.capture_end`` calls (every CUDA graph recorded, whoever records it)."""
    count = [0]
    if not torch.cuda.is_available():
        yield count
        return
    original = torch.cuda.CUDAGraph.capture_end

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(self, *args, **kwargs)

    torch.cuda.CUDAGraph.capture_end = capture_end  # type: ignore[method-assign]
    try:
        yield count
    finally:
        torch.cuda.CUDAGraph.capture_end = original  # type: ignore[method-assign]


def compiled(
    key: str, step: ServingDecode, device_kind: str, kernel_backend: str
) -> tuple[Callable[..., Any], AirgraphBackend | None, SimulatedCuda | None, bool]:
    """(the step to call, airgraph's backend, the simulator, whether each call's inputs are marked dynamic)."""
    torch._dynamo.reset()
    if key == "eager":
        return step, None, None, False
    if key.startswith("tc-"):
        return (
            torch.compile(step, mode="reduce-overhead", dynamic=False if key == "tc-static" else None),
            None,
            None,
            (key == "tc-dynamic"),
        )
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = kernel_backend
    config.reduce_overhead.capture_sizes = {"ag": [], "ag-sizes": CAPTURE_SIZES, "ag-64": [MAX_BATCH]}[key]
    sim = SimulatedCuda() if device_kind == "simulated-cuda" else None
    backend = AirgraphBackend(config, runtime=sim)
    return torch.compile(step, backend=backend, fullgraph=True), backend, sim, True


def run_variant(
    key: str, step: ServingDecode, caches: tuple[list, list], work: Workload, device_kind: str, settings: dict
) -> dict[str, Any]:
    device = step.model.output.weight.device
    k_caches, v_caches = caches
    for cache in (*k_caches, *v_caches):
        cache.zero_()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        reserved_before = torch.cuda.memory_reserved(device)  # the weights and the caches, shared by all variants
    counters = torch._dynamo.utils.counters
    before = {
        "skips": counters["inductor"]["cudagraph_skips"],
        "graphs": counters["stats"]["unique_graphs"],
    }
    fn, backend, sim, mark = compiled(key, step, device_kind, settings["kernel_backend"])
    if sim is not None:  # traced as CUDA tensors (runtime/simulated_device.py)
        sim.to_device(step, *k_caches, *v_caches)
    rtol, atol = TOLERANCE[step.model.output.weight.dtype]
    per_call, checks, elapsed, first_100 = [], [], 0.0, None
    with counting_cuda_graphs() as captured, torch.no_grad():
        for i, b in enumerate(work.batches):
            args = (work.tokens[i], work.positions[i], [c[:b] for c in k_caches], [c[:b] for c in v_caches])
            if sim is not None:
                sim.to_device(args[0], args[1], *args[2], *args[3])
            if mark:
                mark_batch_dynamic(*args)
            if i in work.checks:  # eager on copies of the call's rows, before the compiled call (not timed)
                ref_k, ref_v = [c[:b].clone() for c in k_caches], [c[:b].clone() for c in v_caches]
                ref = step(work.tokens[i], work.positions[i], ref_k, ref_v)
            with sim.call() if sim is not None else contextlib.nullcontext():
                sync(device)
                start = time.perf_counter()
                out = fn(*args)
                sync(device)
                took = time.perf_counter() - start
            per_call.append(took)
            elapsed += took
            if i in work.checks:
                checks.append(compare(out, ref, args, ref_k, ref_v, rtol, atol))
                del ref, ref_k, ref_v
            del out, args
            if i == 99:
                first_100 = elapsed
    result: dict[str, Any] = {
        "variant": VARIANTS[key],
        "loop_s": round(elapsed, 3),
        "first_100_calls_s": round(first_100, 3) if first_100 is not None else None,
        "median_call_ms_after_100": round(statistics.median(per_call[100:]) * 1e3, 3) if per_call[100:] else None,
        "outputs_match": all(c["ok"] for c in checks),
        "checked_calls": len(checks),
        "max_abs_diff_logits": max((c["logits"] for c in checks), default=None),
        "max_abs_diff_caches": max((c["caches"] for c in checks), default=None),
        "dynamo_graphs": counters["stats"]["unique_graphs"] - before["graphs"],
    }
    result.update(
        graph_counts(key, backend, device, captured[0], counters["inductor"]["cudagraph_skips"] - before["skips"])
    )
    if device.type == "cuda":
        sync(device)
        result["memory_reserved_bytes"] = torch.cuda.memory_reserved(device)
        result["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        result["memory_added_bytes"] = result["memory_reserved_bytes"] - reserved_before  # the variant's own
    else:
        result["memory_reserved_bytes"] = None
        result["memory_note"] = "torch.cuda.memory_reserved: no CUDA device"
    if sim is not None:
        result["simulator_problems"] = len(sim.problems)
    del fn, backend, sim
    torch._dynamo.reset()
    return result


def compare(
    out: torch.Tensor, ref: torch.Tensor, args: tuple, ref_k: list, ref_v: list, rtol: float, atol: float
) -> dict:
    got_caches, want_caches = [*args[2], *args[3]], [*ref_k, *ref_v]
    logits = (out.float() - ref.float()).abs().max().item()
    caches = max((g.float() - w.float()).abs().max().item() for g, w in zip(got_caches, want_caches, strict=True))
    ok = torch.allclose(out.float(), ref.float(), rtol=rtol, atol=atol) and all(
        torch.allclose(g.float(), w.float(), rtol=rtol, atol=atol) for g, w in zip(got_caches, want_caches, strict=True)
    )
    return {"ok": ok, "logits": logits, "caches": caches}


def graph_counts(key: str, backend: AirgraphBackend | None, device: torch.device, captures: int, skips: int) -> dict:
    """CUDA graphs recorded: airgraph's from its reports; on CUDA, every variant's capture_end calls too."""
    counts: dict[str, Any] = {}
    if backend is not None:
        reports = backend.reports
        counts["graphs_recorded"] = sum(r.capture_keys + r.recaptures for r in reports)
        counts["graphs"] = [
            {"capture_sizes": r.capture_sizes, "keys": r.capture_keys, "recaptures": r.recaptures,
             "padded_calls": r.padded_calls, "padded_rows": r.padded_rows, "padding_refused": r.padding_refused,
             "uncaptured_reason": r.uncaptured_reason}
            for r in reports
        ]  # fmt: skip
    elif device.type == "cuda" or key == "eager":
        counts["graphs_recorded"] = captures if key != "eager" else 0
    else:
        counts["graphs_recorded"] = None
        counts["graphs_note"] = "torch.compile records CUDA graphs only for CUDA tensors"
    if device.type == "cuda":
        counts["cuda_graph_captures"] = captures
    if key.startswith("tc-"):
        counts["cudagraph_skips"] = skips  # torch's counter: graphs Inductor ran without CUDA graphs
    return counts


def summary(results: list[dict]) -> dict[str, Any]:
    by = {r["variant"]: r for r in results}
    out: dict[str, Any] = {}
    sized = by.get(VARIANTS["ag-sizes"])
    torch_loops = [by[VARIANTS[k]]["loop_s"] for k in ("tc-static", "tc-dynamic") if VARIANTS[k] in by]
    if sized and torch_loops:
        out["capture_sizes_loop_over_best_torch_compile"] = round(sized["loop_s"] / min(torch_loops), 3)
    if sized and VARIANTS["ag"] in by:
        out["capture_sizes_loop_over_airgraph_without"] = round(sized["loop_s"] / by[VARIANTS["ag"]]["loop_s"], 3)
    largest = by.get(VARIANTS["ag-64"])
    if sized and largest and sized.get("memory_added_bytes") and largest.get("memory_added_bytes"):
        # what each variant added to the shared weights and caches
        out["capture_sizes_memory_over_largest_alone"] = round(
            sized["memory_added_bytes"] / largest["memory_added_bytes"], 3
        )
    if sized:
        out["capture_sizes_graphs_recorded"] = sized.get("graphs_recorded")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    has_cuda = torch.cuda.is_available()
    parser.add_argument(
        "--device", choices=("cuda", "simulated-cuda", "cpu"), default="cuda" if has_cuda else "simulated-cuda"
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: 1b on cuda, else small")
    parser.add_argument("--calls", type=int, default=None, help="default: 1000 on cuda, 120 off it (a 2-core CPU)")
    parser.add_argument("--checks", type=int, default=20, help="calls checked against eager")
    parser.add_argument("--max-len", type=int, default=None, help="cache length (default: the preset's)")
    parser.add_argument("--variants", default=None, help=f"comma-separated of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--kernel-backend", choices=("inductor", "aten"), default=None, help="airgraph's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not has_cuda:
        parser.error("--device cuda: CUDA is not available here")
    preset_name = args.preset or ("1b" if args.device == "cuda" else "small")
    preset = PRESETS[preset_name]
    calls = args.calls or (1000 if args.device == "cuda" else 120)
    keys = args.variants.split(",") if args.variants else list(VARIANTS)
    if args.variants is None and args.device == "simulated-cuda":
        # torch.compile records no CUDA graphs for the simulator's (CPU) tensors; memory is not measured there
        keys = ["eager", "ag", "ag-sizes"]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    max_len = args.max_len or preset["max_len"]
    config = LlamaConfig.preset(preset_name, max_seq_len=max_len)
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    dtype = getattr(torch, preset["dtype"])
    settings = {
        "device_kind": args.device,
        "preset": preset_name,
        "model": {
            k: getattr(config, k)
            for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size", "tie_embeddings")
        },
        "max_len": max_len,
        "dtype": preset["dtype"],
        "calls": calls,
        "calls_note": None if calls == 1000 else f"{calls} calls, not the issue's 1000 (--calls; a 2-core CPU)",
        "batch_sizes": f"uniform 1..{MAX_BATCH}, seed {args.seed}",
        "capture_sizes": CAPTURE_SIZES,
        "kernel_backend": args.kernel_backend or preset["kernel_backend"],
        "checks": args.checks,
        "recompile_limit": getattr(torch._dynamo.config, "recompile_limit", None),
        "threads": torch.get_num_threads(),
    }
    step = build_serving_decode(config, seed=args.seed, device=device, dtype=dtype)
    caches = step.new_caches(MAX_BATCH)
    output = args.output or f"benchmarks/results/serving_batches_{'cuda' if args.device == 'cuda' else 'cpu'}.json"
    results: list[dict[str, Any]] = []

    def report(complete: bool) -> dict[str, Any]:
        return {
            **environment(device),
            "benchmark": "serving_batches",
            "complete": complete,
            "settings": settings,
            "results": results,
            "summary": summary(results),
            "targets": "GPU, with capture sizes: <= 9 graphs; loop <= 0.7 of torch.compile reduce-overhead's better "
            "variant; memory <= 1.3 x the largest size recorded alone. CPU: the simulator's counts, outputs = eager",
        }

    for key in keys:
        started = time.perf_counter()
        # the same calls for every variant, as new tensors: mark_dynamic marks the tensor objects it is given
        work = workload(config, calls, args.checks, args.seed, device)
        result = run_variant(key, step, caches, work, args.device, settings)
        result["variant_wall_s"] = round(time.perf_counter() - started, 1)
        results.append(result)
        print(
            f"{result['variant']:48s} loop {result['loop_s']:8.2f} s  first 100 {result['first_100_calls_s']} s  "
            f"graphs {result.get('graphs_recorded')}  match {result['outputs_match']}",
            flush=True,
        )
        write_json(report(complete=False), output)
    write_json(report(complete=True), output)
    print(summary(results))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
