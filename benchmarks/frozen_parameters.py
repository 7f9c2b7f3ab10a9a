"""The frozen-parameters lever (config.frozen_parameters, issue #33): the LLaMA decode step with it off and on.

With the lever on, the step's parameters are constants of its graph and its q/k/v and gate/up projections are one
matmul each (passes/concat_linear.py). Models from one seed, each compiled once (the lever off, the lever on),
prefill a prompt eagerly, then decode the same tokens at the same positions; their steps are timed in interleaved
blocks (the variants' order turning from block to block), one call at a time, the device synchronized around each
on CUDA; a third variant freezes without concatenating (``passes.concat_linear`` off). Per run: the median ms per
step of each, and each / off. Every step's logits are checked against eager's.

    python benchmarks/frozen_parameters.py [--preset small] [--device cpu] [--dtype float32]
        [--mode max-autotune] [--fast-path] [--steps 200] [--runs 2] [--output PATH]

On a GPU: ``--device cuda --dtype bfloat16 --mode reduce-overhead --fast-path`` (the step replayed as a CUDA graph).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.bench.decode import DTYPES, TOLERANCES
from airgraph.bench.results import environment, write_json
from airgraph.models import build_tiny_llama, prefill_inputs

# (name, config.frozen_parameters, config.passes.concat_linear): the third separates what the constants alone do
# from what the concatenation does
VARIANTS = ("frozen off", "frozen on", "frozen on, no concat")
OPTIONS = {"frozen off": (False, True), "frozen on": (True, True), "frozen on, no concat": (True, False)}
MM = ("aten.mm.default", "aten.addmm.default")
BLOCK = 10  # steps per interleaved block


def _compiled(preset: str, device: torch.device, dtype: torch.dtype, args: argparse.Namespace, variant: str) -> tuple:
    """(the model, its compiled step, the backend) for one variant."""
    model = build_tiny_llama(preset, device=device, dtype=dtype)
    config = airgraph.CompilerConfig()
    config.mode = args.mode
    config.kernel_backend = args.kernel_backend
    config.frozen_parameters, config.passes.concat_linear = OPTIONS[variant]
    if args.fast_path:
        step = airgraph.compile(model, config, fast_path=True, fullgraph=True)
        return model, step, step.backend
    backend = AirgraphBackend(config)
    return model, torch.compile(model, backend=backend, fullgraph=True), backend


def _positions(prompt: int, max_len: int, steps: int) -> list[int]:
    """Decode positions after the prompt, wrapping before the caches' end (the caller refills the prompt)."""
    span = max_len - prompt
    return [prompt + i % span for i in range(steps)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch._dynamo.reset()
    eager = build_tiny_llama(args.preset, device=device, dtype=dtype)
    steps = {v: _compiled(args.preset, device, dtype, args, v) for v in VARIANTS}
    config = eager.config
    prompt = prefill_inputs(config, 1, args.prompt, device=device)
    generator = torch.Generator().manual_seed(1)
    total = args.warmup + args.steps * args.runs
    tokens = torch.randint(0, config.vocab_size, (total, 1, 1), generator=generator).to(device)
    positions = _positions(args.prompt, config.max_seq_len, total)
    result: dict[str, Any] = {"variants": {v: {"compile_s": None} for v in VARIANTS}}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    worst = dict.fromkeys(VARIANTS, 0.0)
    atol, rtol = TOLERANCES[args.dtype]
    ok = dict.fromkeys(VARIANTS, True)
    with torch.no_grad():
        for m in (eager, *(entry[0] for entry in steps.values())):
            m.reset_caches()
            m(*prompt)
        for i in range(total):
            if i and positions[i] == args.prompt:  # wrapped: the caches start again from the prompt
                for m in (eager, *(entry[0] for entry in steps.values())):
                    m.reset_caches()
                    m(*prompt)
            pos = torch.tensor([positions[i]], device=device)
            want = eager(tokens[i], pos)
            # interleaved blocks: the variants' order turns from one block to the next
            turn = (i // BLOCK) % len(VARIANTS)
            order = VARIANTS[turn:] + VARIANTS[:turn]
            for variant in order:
                step = steps[variant][1]
                sync()
                start = time.perf_counter()
                got = step(tokens[i], pos)
                sync()
                elapsed = time.perf_counter() - start
                if i == 0:
                    result["variants"][variant]["compile_s"] = round(elapsed, 3)
                elif i >= args.warmup:
                    times[variant].append(elapsed)
                diff = float((got.float() - want.float()).abs().max())
                worst[variant] = max(worst[variant], diff)
                ok[variant] = ok[variant] and torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol)
                del got
    runs = []
    for r in range(args.runs):
        row = {}
        for variant in VARIANTS:
            chunk = sorted(times[variant][r * args.steps : (r + 1) * args.steps])
            row[variant] = round(statistics.median(chunk) * 1e3, 4)
            tenth = len(chunk) // 10
            row[f"{variant} p10, p90"] = [round(chunk[tenth] * 1e3, 4), round(chunk[-1 - tenth] * 1e3, 4)]
        row["on / off"] = round(row["frozen on"] / row["frozen off"], 3)
        row["on, no concat / off"] = round(row["frozen on, no concat"] / row["frozen off"], 3)
        runs.append(row)
    for variant in VARIANTS:
        reports = steps[variant][2].reports
        result["variants"][variant].update(
            {
                "max_abs_diff_vs_eager": worst[variant],
                "matches_eager": ok[variant],
                "matmuls_per_graph": [sum(1 for n in r.nodes if n.target in MM) for r in reports],
                "frozen_parameters_per_graph": [len(r.frozen_parameters) for r in reports],
            }
        )
    result.update(
        {
            "benchmark": "frozen_parameters",
            "settings": {
                "preset": args.preset,
                "dtype": args.dtype,
                "mode": args.mode,
                "kernel_backend": args.kernel_backend,
                "fast_path": args.fast_path,
                "batch": 1,
                "prompt": args.prompt,
                "warmup": args.warmup,
                "steps_per_run": args.steps,
                "block": BLOCK,
                "threads": torch.get_num_threads(),
            },
            "runs": runs,
        }
    )
    result.update({k: v for k, v in environment(device).items() if k not in result})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--mode", default="max-autotune", choices=("max-autotune", "reduce-overhead"))
    parser.add_argument("--kernel-backend", default="inductor", choices=("inductor", "aten"))
    parser.add_argument("--fast-path", action="store_true", help="airgraph.compile(..., fast_path=True)")
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (a CPU shared with other work: 1 keeps a preempted thread from stalling a step)",
    )
    parser.add_argument("--output", default=None, help="default: benchmarks/results/frozen_parameters_<device>.json")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    result = run(args)
    for i, row in enumerate(result["runs"], start=1):
        shown = {k: v for k, v in row.items() if "p10" not in k}
        print(f"run {i}: " + ", ".join(f"{k} {v}" + (" ms/step" if k in VARIANTS else "") for k, v in shown.items()))
    for variant, entry in result["variants"].items():
        print(f"{variant}: {entry}")
    output = args.output or f"benchmarks/results/frozen_parameters_{torch.device(args.device).type}.json"
    write_json(result, output)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
