"""``benchmarks/tuning.py --device cuda``: operator tuning of the 1B preset's GEMMs on a GPU (issue #36).

Models, bfloat16: ``decode-1b`` and ``prefill-1b``: the GEMMs of two of Llama-3.2-1B's layers and its LM head at
their shapes (hidden 2048, 32 query heads and 8 KV heads of 64, intermediate 8192, vocab 128256, no biases), the
norms and the gated MLP between them but no attention, for one token (every GEMM a single row: split-K's case) and
for 128; ``llama-1b-decode`` and ``llama-1b-prefill``: the roofline issue's 1b preset itself (#33,
airgraph/models/llama.py: 16 layers, a static KV cache), a decode step at position 128 after a 128-token prompt,
and that prompt.

Per model, in reduce-overhead (the graph captured and replayed, as decode runs): a first tuning run (operator mode,
timed on the replay clock: CUDA events, the host's launches hidden), a second one (all hits), then a fresh process
that compiles the model with the bank and without and times both calls interleaved (each call synchronized: what
a user's step costs), beside eager. Targets: decode tuned / untuned <= 0.9 in the fresh process, no model > 1.02.
Results: ``benchmarks/results/tuning_cuda.json`` (device, torch, commit), written after each model.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.config import CompilerConfig

HIDDEN, KV, INTERMEDIATE, VOCAB = 2048, 512, 8192, 128256
TOKENS = {"decode-1b": 1, "llama-1b-decode": 1, "prefill-1b": 128, "llama-1b-prefill": 128}  # default order


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)


class Llama1BGemms(torch.nn.Module):
    """The GEMMs of ``layers`` Llama-3.2-1B blocks and its LM head, the norms and the gated MLP between them; q, k
    and v mixed elementwise where attention would be (module docstring)."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()

        def linear(n_in: int, n_out: int) -> torch.nn.Linear:
            return torch.nn.Linear(n_in, n_out, bias=False)

        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "q": linear(HIDDEN, HIDDEN),
                    "k": linear(HIDDEN, KV),
                    "v": linear(HIDDEN, KV),
                    "o": linear(HIDDEN, HIDDEN),
                    "gate": linear(HIDDEN, INTERMEDIATE),
                    "up": linear(HIDDEN, INTERMEDIATE),
                    "down": linear(INTERMEDIATE, HIDDEN),
                }
            )
            for _ in range(layers)
        )
        self.head = linear(HIDDEN, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            h = _rms(x)
            repeat = HIDDEN // KV
            mixed = block["q"](h) * torch.sigmoid(block["k"](h).repeat(1, repeat)) + block["v"](h).repeat(1, repeat)
            x = x + block["o"](mixed)
            h = _rms(x)
            x = x + block["down"](F.silu(block["gate"](h)) * block["up"](h))
        return self.head(_rms(x))


def build_cuda(name: str) -> tuple[torch.nn.Module, tuple]:
    if name not in TOKENS:
        raise SystemExit(f"--device cuda: models are {', '.join(TOKENS)}, not {name!r}")
    torch.manual_seed(0)
    if name.startswith("llama-1b"):
        from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs

        llama = build_tiny_llama("1b", device="cuda", dtype=torch.bfloat16)
        prompt = prefill_inputs(llama.config, 1, 128, device="cuda")
        if name == "llama-1b-prefill":
            return llama, prompt
        with torch.no_grad():
            llama(*prompt)  # the cache holds the prompt
        return llama, decode_inputs(llama.config, 1, 128, device="cuda")
    model = Llama1BGemms().to("cuda", torch.bfloat16).eval()
    return model, (torch.randn(TOKENS[name], HIDDEN, device="cuda", dtype=torch.bfloat16),)


def cuda_config(bank: Path | None) -> CompilerConfig:
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    if bank is None:
        config.tuning.use_bank = False
    else:
        config.tuning.bank_dir = str(bank)
    return config


def per_call_synchronized(variants: dict[str, Callable], args: tuple, rounds: int) -> dict[str, list[float]]:
    """Seconds of each call, each followed by a synchronize (a step's latency as its caller sees it), in
    interleaved rounds of about 20 ms per variant."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        calls = {}
        for name, fn in variants.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            calls[name] = max(3, min(200, int(0.02 / max(time.perf_counter() - start, 1e-6))))
        for _ in range(rounds):
            for name, fn in variants.items():
                for _ in range(calls[name]):
                    start = time.perf_counter()
                    fn(*args)
                    torch.cuda.synchronize()
                    samples[name].append(time.perf_counter() - start)
    return samples


def measure_fresh_cuda(name: str, bank: Path, rounds: int) -> dict[str, Any]:
    """In this (fresh) process: the model compiled with the bank and without, in reduce-overhead, and eager."""
    model, args = build_cuda(name)
    variants = {
        "untuned": torch.compile(model, backend=AirgraphBackend(cuda_config(None))),
        "tuned": torch.compile(model, backend=AirgraphBackend(cuda_config(bank))),
        "eager": model,
    }
    differences = {}
    with torch.no_grad():
        expected = model(*args).float()
        for vname, fn in variants.items():
            for _ in range(3):  # compile, warm up, capture
                out = fn(*args)
            differences[vname] = (out.float() - expected).abs().max().item() / expected.abs().max().item()
    samples = per_call_synchronized(variants, args, rounds)
    median = {v: statistics.median(s) * 1e6 for v, s in samples.items()}
    quartiles = {v: statistics.quantiles(s, n=4) for v, s in samples.items()}
    spread = {v: (q[2] - q[0]) / statistics.median(samples[v]) for v, q in quartiles.items()}
    return {
        "median_us": median,
        "spread": spread,
        "tuned/untuned": median["tuned"] / median["untuned"],
        "max_difference_from_eager": differences,  # relative to the largest output, bfloat16
    }


def _fresh(script: str, name: str, bank: Path, rounds: int) -> dict[str, Any]:
    command = [sys.executable, script, "--device", "cuda", "--fresh", str(bank), "--models", name]
    done = subprocess.run([*command, "--rounds", str(rounds)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process of {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_cuda_model(script: str, name: str, rounds: int, budget: float, work: Path) -> dict[str, Any]:
    """A first tuning run, a second, and the fresh process's tuned / untuned (module docstring)."""
    torch._dynamo.reset()
    model, args = build_cuda(name)
    bank = work / f"bank-{name}"
    config = cuda_config(bank)
    config.tuning.budget_s = budget
    start = time.perf_counter()
    report = airgraph.tune(model, *args, mode="op", bank_dir=bank, work_path=work, config=config)
    tuning_s = time.perf_counter() - start
    torch._dynamo.reset()
    start = time.perf_counter()
    again = airgraph.tune(model, *args, mode="op", bank_dir=bank, work_path=work, config=config)
    again_s = time.perf_counter() - start
    fresh = _fresh(script, name, bank, rounds)
    claimed = report.call.ratio if report.call is not None else 1.0
    ratio = fresh["tuned/untuned"]
    return {
        "model": name,
        "tokens": TOKENS[name],
        "tuning_s": tuning_s,
        "counts": report.counts(),
        "units": [
            {
                "name": o.name,
                "status": o.status,
                "choice": f"{o.tune_mode} {o.choice}".strip(),
                "before_us": o.before_us,
                "after_us": o.after_us,
                "measured_us": o.measured,
                "note": o.note,
            }
            for o in report.outcomes
        ],
        "dropped": [list(d) for t in report.tasks for d in t.dropped],
        "report_call": report.call.to_dict() if report.call is not None else None,
        "second_run": {"seconds": again_s, "counts": again.counts(), "over_first": again_s / tuning_s},
        "fresh_process": fresh,
        "checks": {
            "report_tuned_over_untuned": claimed,
            "fresh_tuned_over_untuned": ratio,
            "decode_target_met": name != "decode-1b" or ratio <= 0.9,
            "never_slower": ratio <= 1.02,
        },
    }
