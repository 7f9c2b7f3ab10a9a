"""LLM decode against the memory roofline (issue #33): ms per token of a Llama-architecture model, the bytes each
decode step must read, and the device's copy bandwidth, for eager, torch.compile and airgraph.

The model is airgraph's own (airgraph/models/llama.py, gpt-fast's layout), random weights, nothing downloaded:
see MODEL_CHOICE. Presets: tiny (the CPU), 1b (Llama-3.2-1B's shapes, tied embeddings), 8b (Llama-3.1-8B's).
The loop is gpt-fast's: an eager prefill of the prompt, its argmax the first token, then new_tokens - 1 calls of
the compiled step (the model and a greedy argmax, on the device), each given the last token and its position (a
device tensor incremented in place); no host sync per token; the tokens stay on the device until the loop ends.

Per batch: each variant (the VARIANTS table: one row per variant, opt-in ones marked) compiled and warmed by two
generates (the first timed: ``first_call_s``), then ``--rounds`` interleaved rounds of one generate each. A step is
timed by CUDA events between steps (the CPU: perf_counter, each step done when it returns); ``ms_per_token`` is
the median step of all rounds (one token per sequence per step). ``achieved_gbps`` = (``weight_bytes`` +
``kv_bytes_per_token``) / step time; ``fraction_of_copy`` = achieved_gbps / ``copy_gbps``, the best of several
large device-to-device copies (bytes read + written per second) in the same process. Every call's tokens are
checked against eager's (``tokens_match``; bfloat16 may differ at rounding ties, judged as in airgraph/bench/ties.py).
A variant that fails is recorded in its row and the others go on; results are written after every variant and
round (``complete: false`` until the end); ``--append`` adds them to the file of an earlier call at the same commit.

    python benchmarks/llm_roofline.py --device cpu --preset tiny
    python benchmarks/llm_roofline.py --device cuda --preset 1b --batch 1 --append --profile
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Measure the airgraph of this checkout (python benchmarks/llm_roofline.py puts only benchmarks/ on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import airgraph
from airgraph.bench import ties
from airgraph.bench.results import counter_delta, counters, environment, failure, write_json
from airgraph.models import LlamaConfig, TinyLlama

MODEL_CHOICE = (
    "airgraph's model (airgraph/models/llama.py), not transformers' LlamaForCausalLM: it is gpt-fast's layout (the "
    "static KV cache as module buffers written by index_copy_, rotary tables and causal mask precomputed), so the "
    "decode step is a plain forward(token, input_pos) as gpt-fast compiles it; HF's forward takes its cache object "
    "as an argument, which airgraph's fast path refuses (an object among the arguments), and adds mask and cache "
    "bookkeeping in Python that a compiled step does away with. The weights and the KV cache read per token are the "
    "same (same shapes, dtype and cache layout), so the roofline is the same; HF's own generate with a static cache "
    "is measured by benchmarks/hf_generate.py (its 1b preset)."
)


@dataclass(frozen=True)
class Variant:
    """One way to run the decode step. A later airgraph lever is one more row: its ``config`` (CompilerConfig
    options as a nested dict, ``CompilerConfig.update``) and ``opt_in=True`` until it is a default."""

    name: str
    compiler: str  # "eager", "torch.compile" or "airgraph"
    mode: str | None = None  # torch.compile's mode
    config: dict[str, Any] = field(default_factory=dict)  # airgraph: options set on a default CompilerConfig
    fast_path: bool = False  # airgraph.compile(..., fast_path=True)
    opt_in: bool = False  # not what airgraph does by default

    def airgraph_mode(self) -> str | None:
        if self.compiler != "airgraph":
            return None
        try:
            return airgraph_config(self).mode
        except (ValueError, AttributeError):  # a config airgraph refuses: the variant's row says why it failed
            return None

    def describe(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "compiler": self.compiler,
            "mode": self.mode,
            "config": self.config,
            "airgraph_mode": self.airgraph_mode(),
            "fast_path": self.fast_path,
            "opt_in": self.opt_in,
        }


VARIANTS = (
    Variant("eager", "eager"),
    Variant("torch.compile default", "torch.compile", mode="default"),
    Variant("torch.compile reduce-overhead", "torch.compile", mode="reduce-overhead"),
    Variant("airgraph default", "airgraph"),
    Variant("airgraph reduce-overhead", "airgraph", config={"mode": "reduce-overhead"}),
    Variant("airgraph fast path", "airgraph", config={"mode": "reduce-overhead"}, fast_path=True, opt_in=True),
    # Levers of issue #33, each on top of airgraph reduce-overhead: weights as constants with q/k/v and gate/up
    # each one GEMM (docs/modes.md, "Frozen parameters"); the inputs' copies recorded in the graph
    Variant(
        "airgraph frozen parameters",
        "airgraph",
        config={"mode": "reduce-overhead", "frozen_parameters": True},
        opt_in=True,
    ),
    Variant(
        "airgraph in-graph input copies",
        "airgraph",
        config={"mode": "reduce-overhead", "reduce_overhead": {"input_copies": "in-graph"}},
        opt_in=True,
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}
REFERENCE = "torch.compile reduce-overhead"
PRESETS = ("tiny", "1b", "8b")  # airgraph.models.LlamaConfig presets
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
COPY_MIB = {"cuda": 1024, "cpu": 256}  # default size of one copy's source


def log(message: str) -> None:
    """A progress line with the wall clock and the seconds since the start, so a log shows where time went."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    print(f"[{stamp} +{now - _START:7.1f}s] {message}", flush=True)


_START = time.time()


# -- the device's bandwidth -------------------------------------------------------------------------------------
def measure_copy(device: torch.device, mib: int, repeats: int = 10) -> dict[str, Any]:
    """The best of ``repeats`` copies of ``mib`` MiB into another buffer, as (bytes read + written) / time (GB/s,
    1e9 bytes): CUDA events around each copy on a GPU, perf_counter around it on the CPU (host memory)."""
    n = mib * 2**20
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    dst.copy_(src)  # untimed: first touch of the pages, lazy initialisation
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            start = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - start
        samples.append(2 * n / seconds / 1e9)
    ok = bool(torch.equal(dst[:4096], src[:4096]))
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "copy_gbps": round(max(samples), 2),
        "median_gbps": round(statistics.median(samples), 2),
        "bytes_per_copy": n,
        "repeats": repeats,
        "samples_gbps": [round(s, 2) for s in samples],
        "copied_right": ok,
        "method": "Tensor.copy_ of a uint8 buffer into another; 2 x bytes / time (read + written), best of repeats",
    }


# -- what a step reads --------------------------------------------------------------------------------------------
def weight_bytes(model: TinyLlama, batch: int) -> dict[str, int]:
    """The weights one decode step reads: every parameter once (a tied embedding is one matrix, read whole by the
    output projection), except an untied input embedding, of which the step reads only ``batch`` rows."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields a tied one once
    table = model.tok_embeddings.weight
    read = params
    if not model.config.tie_embeddings:
        read -= table.numel() * table.element_size()
        read += batch * table.shape[1] * table.element_size()
    return {"weight_bytes": read, "parameter_bytes": params}


def kv_bytes(config: LlamaConfig, batch: int, positions: float, element_size: int) -> int:
    """Keys and values of ``positions`` positions, every layer, ``batch`` sequences."""
    return round(2 * config.n_layers * batch * config.n_kv_heads * config.head_dim * positions * element_size)


# -- the decode loop ---------------------------------------------------------------------------------------------
class DecodeStep(torch.nn.Module):
    """What is compiled, as gpt-fast's decode_one_token: one forward of the last token and the greedy pick."""

    def __init__(self, model: TinyLlama) -> None:
        super().__init__()
        self.model = model

    def forward(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        logits = self.model(token, input_pos)
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True)


def airgraph_config(variant: Variant) -> airgraph.CompilerConfig:
    config = airgraph.CompilerConfig()
    config.update(variant.config)
    return config


def make_step(variant: Variant, model: TinyLlama) -> tuple[Callable[..., torch.Tensor], Any]:
    """The variant's decode step and, for airgraph, the backend torch.compile calls (its graph reports)."""
    step = DecodeStep(model)
    if variant.compiler == "eager":
        return step, None
    if variant.compiler == "torch.compile":
        return torch.compile(step, mode=variant.mode, fullgraph=True, dynamic=False), None
    config = airgraph_config(variant)
    if variant.fast_path:
        fast = airgraph.compile(step, config, fast_path=True, fullgraph=True, dynamic=False)
        return fast, fast.backend
    backend = airgraph.get_backend(config)
    return torch.compile(step, backend=backend, fullgraph=True, dynamic=False), backend


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(
    model: TinyLlama, step: Callable[..., torch.Tensor], prompt: torch.Tensor, new_tokens: int
) -> tuple[torch.Tensor, list[float], float]:
    """Greedy decoding of ``new_tokens`` tokens after ``prompt`` [B, P], gpt-fast's way. Returns the tokens
    [B, new_tokens] (on the device), each decode step's milliseconds and the loop's wall milliseconds per step."""
    device = prompt.device
    prompt_len = prompt.shape[1]
    model.reset_caches()
    logits = model(prompt, torch.arange(prompt_len, device=device))  # the prefill, eager
    token = torch.argmax(logits[:, -1], dim=-1, keepdim=True)
    del logits
    kept = [token]
    input_pos = torch.tensor([prompt_len], dtype=torch.long, device=device)
    steps = new_tokens - 1
    cuda = device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
    clock: list[float] = []
    _sync(device)
    start = time.perf_counter()
    if cuda:
        events[0].record()
    else:
        clock.append(start)
    for i in range(steps):
        token = step(token, input_pos).clone()  # the step's output dropped at once (a replay then copies nothing)
        input_pos += 1
        kept.append(token)
        if cuda:
            events[i + 1].record()
        else:
            clock.append(time.perf_counter())
    _sync(device)
    loop_ms = (time.perf_counter() - start) * 1e3 / steps
    if cuda:
        step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    else:
        step_ms = [(clock[i + 1] - clock[i]) * 1e3 for i in range(steps)]
    return torch.cat(kept, dim=1), step_ms, loop_ms


# -- one batch size: every variant ----------------------------------------------------------------------------
@dataclass
class Case:
    variant: Variant
    step: Callable[..., torch.Tensor] | None = None
    backend: Any = None
    error: dict[str, str] | None = None
    first_call_s: float | None = None
    step_ms: list[float] = field(default_factory=list)  # every timed step of every round
    round_ms: list[float] = field(default_factory=list)  # each round's median step
    loop_ms: list[float] = field(default_factory=list)  # each round's loop wall time per step
    calls_checked: int = 0
    calls_differing: int = 0
    differing: dict[bytes, torch.Tensor] = field(default_factory=dict)  # distinct token tensors unlike eager's
    judged: list[dict[str, Any]] = field(default_factory=list)
    compile_counters: dict[str, int] = field(default_factory=dict)
    timed_counters: dict[str, int] = field(default_factory=dict)
    profile: dict[str, Any] | None = None


@dataclass
class Group:
    batch: int
    model: TinyLlama
    prompt: torch.Tensor
    cases: list[Case]
    reference: torch.Tensor | None = None  # eager's first tokens (CPU)


def check_tokens(group: Group, case: Case, tokens: torch.Tensor) -> None:
    """Count a call; keep its tokens when they differ from eager's first call's (eager: from its own first)."""
    tokens = tokens.cpu()
    if group.reference is None:
        group.reference = tokens
    case.calls_checked += 1
    if not torch.equal(tokens, group.reference):
        case.calls_differing += 1
        key = tokens.numpy().tobytes()
        if key not in case.differing and len(case.differing) < 3:
            case.differing[key] = tokens


def judge_differing(group: Group, case: Case, dtype: str) -> None:
    """Each distinct differing token tensor judged on eager's logits for its own prefix (airgraph/bench/ties.py)."""
    prompt = group.prompt
    prompt_len = prompt.shape[1]
    for tokens in case.differing.values():
        differ = (tokens != group.reference).nonzero()
        first_step = int(differ[:, 1].min())
        sequences = torch.cat([prompt.cpu(), tokens], dim=1)
        group.model.reset_caches()
        with torch.no_grad():
            positions = torch.arange(sequences.shape[1] - 1, device=prompt.device)
            logits = group.model(sequences[:, :-1].to(prompt.device), positions)
        judged = ties.judge(ties.margins(logits, sequences, prompt_len), dtype)
        del logits
        rows = sorted({int(r) for r, s in differ.tolist() if s == first_step})
        case.judged.append({"first_step": first_step, "first_step_rows": rows, **judged})
    group.model.reset_caches()


def warm_up(group: Group, case: Case, new_tokens: int) -> None:
    """Compile (the first generate, timed whole) and one more generate; both calls' tokens checked."""
    before = counters()
    case.step, case.backend = make_step(case.variant, group.model)
    start = time.perf_counter()
    tokens, _, _ = generate(group.model, case.step, group.prompt, new_tokens)
    _sync(group.prompt.device)
    case.first_call_s = time.perf_counter() - start
    check_tokens(group, case, tokens)
    tokens, _, _ = generate(group.model, case.step, group.prompt, new_tokens)
    check_tokens(group, case, tokens)
    case.compile_counters = counter_delta(before, counters())


def timed_round(group: Group, case: Case, new_tokens: int) -> None:
    before = counters()
    tokens, step_ms, loop_ms = generate(group.model, case.step, group.prompt, new_tokens)
    for k, v in counter_delta(before, counters()).items():
        case.timed_counters[k] = case.timed_counters.get(k, 0) + v
    case.step_ms.extend(step_ms)
    case.round_ms.append(statistics.median(step_ms))
    case.loop_ms.append(loop_ms)
    check_tokens(group, case, tokens)


def profile_step(group: Group, case: Case, device: torch.device, top: int = 30) -> dict[str, Any]:
    """One decode step under torch.profiler (after a prefill and three steps): its key_averages table, the
    ``top`` rows by self device time (the CPU: self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    model, step = group.model, case.step
    prompt_len = group.prompt.shape[1]
    with torch.no_grad():
        model.reset_caches()
        token = torch.argmax(model(group.prompt, torch.arange(prompt_len, device=device))[:, -1], -1, keepdim=True)
        input_pos = torch.tensor([prompt_len], dtype=torch.long, device=device)
        for _ in range(3):
            token = step(token, input_pos).clone()
            input_pos += 1
        _sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            token = step(token, input_pos).clone()
            _sync(device)
    rows = []
    for e in prof.key_averages():
        self_device = getattr(e, "self_device_time_total", None) or 0.0
        rows.append(
            {
                "name": e.key,
                "count": e.count,
                "self_cpu_us": round(e.self_cpu_time_total, 2),
                "cpu_total_us": round(e.cpu_time_total, 2),
                "self_device_us": round(self_device, 2),
                "device_total_us": round(getattr(e, "device_time_total", None) or 0.0, 2),
            }
        )
    key = "self_device_us" if device.type == "cuda" else "self_cpu_us"
    rows.sort(key=lambda r: r[key], reverse=True)
    return {
        "sorted_by": key,
        "self_device_us_total": round(sum(r["self_device_us"] for r in rows), 2),
        "self_cpu_us_total": round(sum(r["self_cpu_us"] for r in rows), 2),
        "events": len(rows),
        "top": rows[:top],
    }


# -- results ----------------------------------------------------------------------------------------------------
def _airgraph_graphs(case: Case) -> list[dict[str, Any]] | None:
    if case.backend is None:
        return None
    return [
        {
            "kind": r.kind,
            "captured": r.captured,
            "capture_keys": r.capture_keys,
            "recaptures": r.recaptures,
            "uncaptured_reason": r.uncaptured_reason,
            "segments": len(r.segments),
            "backends": sorted({s.backend for s in r.segments}),
            "compile_seconds": round(r.compile_seconds, 3),
        }
        for r in case.backend.reports
    ]


def row(group: Group, case: Case, run: dict[str, Any]) -> dict[str, Any]:
    settings, copy = run["settings"], run["copy"]
    model, batch = group.model, group.batch
    config = model.config
    element_size = DTYPES[settings["dtype"]].itemsize
    weights = weight_bytes(model, batch)
    prompt_len, new_tokens = settings["prompt_len"], settings["new_tokens"]
    filled = prompt_len + new_tokens / 2  # positions each step reads, averaged over the decode steps
    out: dict[str, Any] = {
        "preset": settings["preset"],
        "batch": batch,
        "dtype": settings["dtype"],
        **case.variant.describe(),
        "run": run["started"],
        **weights,
        "kv_bytes_per_token": kv_bytes(config, batch, filled, element_size),
        "kv_positions_read": filled,
        "kv_bytes_per_token_as_read": kv_bytes(config, batch, config.max_seq_len, element_size),
        "copy_gbps": copy["copy_gbps"],
    }
    if case.error is not None:
        out["error"] = case.error
    if case.step_ms:
        median = statistics.median(case.step_ms)
        deciles = statistics.quantiles(case.step_ms, n=10) if len(case.step_ms) > 1 else [median] * 9
        achieved = (out["weight_bytes"] + out["kv_bytes_per_token"]) / (median / 1e3) / 1e9
        out.update(
            {
                "ms_per_token": round(median, 4),
                "p10_ms_per_token": round(deciles[0], 4),
                "p90_ms_per_token": round(deciles[-1], 4),
                "tokens_per_s": round(batch * 1e3 / median, 1),
                "achieved_gbps": round(achieved, 2),
                "fraction_of_copy": round(achieved / copy["copy_gbps"], 4),
                "round_ms_per_token": [round(x, 4) for x in case.round_ms],
                "loop_ms_per_token": [round(x, 4) for x in case.loop_ms],
                "steps_timed": len(case.step_ms),
            }
        )
    out["first_call_s"] = None if case.first_call_s is None else round(case.first_call_s, 3)
    equal = case.calls_differing == 0
    if case.calls_checked == 0 or group.reference is None:
        match, verdict = None, None
    elif equal:
        match, verdict = True, "equal"
    else:
        verdict = "wrong" if any(j["verdict"] == "wrong" for j in case.judged) or not case.judged else "rounding tie"
        match = verdict == "rounding tie" and settings["dtype"] != "float32"
    out.update(
        {
            "tokens_match": match,
            "tokens_equal": equal if case.calls_checked else None,
            "tokens_verdict": verdict,
            "calls_checked": case.calls_checked,
            "calls_differing": case.calls_differing,
            "token_mismatches": case.judged,
            "compile_counters": case.compile_counters,
            "timed_counters": case.timed_counters,
            "airgraph_graphs": _airgraph_graphs(case),
        }
    )
    if case.variant.fast_path and case.step is not None:
        out["fast_path_calls"] = getattr(case.step, "fast_calls", None)
        out["fast_path_refused"] = [str(why) for why in getattr(case.step, "refused", {}).values()]
    if case.profile is not None:
        out["profile"] = case.profile
    return out


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["preset"], r["batch"], r["dtype"], r["variant"])


def problems(rows: list[dict[str, Any]]) -> list[str]:
    found = []
    for r in rows:
        name = f"{r['preset']} {r['dtype']} batch {r['batch']} {r['variant']}"
        if "error" in r:
            found.append(f"{name}: failed ({r['error']['phase']}): {r['error']['type']}: {r['error']['message'][:200]}")
        if r.get("tokens_match") is False:
            found.append(f"{name}: tokens differ from eager's ({r['tokens_verdict']}, {r['calls_differing']} calls)")
        if any(k.startswith(("stats.unique_graphs", "recompiles")) for k in r.get("timed_counters", {})):
            found.append(f"{name}: recompiled while timed: {r['timed_counters']}")
    return found


def ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's ms_per_token over torch.compile reduce-overhead's, same preset, batch and dtype."""
    reference = {_key(r)[:3]: r["ms_per_token"] for r in rows if r["variant"] == REFERENCE and "ms_per_token" in r}
    for r in rows:
        ref = reference.get(_key(r)[:3])
        r["ratio_to_torch_compile_reduce_overhead"] = (
            round(r["ms_per_token"] / ref, 4) if ref and "ms_per_token" in r else None
        )


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue #33's targets (1b, bfloat16, on a GPU; airgraph reduce-overhead, no opt-in flag), where measured."""
    found = {_key(r): r for r in rows}

    def get(batch: int, field_name: str) -> float | None:
        r = found.get(("1b", batch, "bfloat16", "airgraph reduce-overhead"))
        return None if r is None else r.get(field_name)

    out = []
    value = get(1, "fraction_of_copy")
    out.append({"target": "1b bf16 batch 1: airgraph reduce-overhead >= 0.8 of copy_gbps", "value": value})
    out[-1]["met"] = None if value is None else value >= 0.8
    for batch in (1, 8):
        value = get(batch, "ratio_to_torch_compile_reduce_overhead")
        name = f"1b bf16 batch {batch}: airgraph reduce-overhead ms/token <= 0.9 of torch.compile reduce-overhead"
        out.append({"target": name, "value": value, "met": None if value is None else value <= 0.9})
    return out


def report(groups: list[Group], run: dict[str, Any], earlier: dict[str, Any] | None, complete: bool) -> dict[str, Any]:
    rows = [row(g, c, run) for g in groups for c in g.cases]
    runs = [run]
    if earlier is not None:  # --append: the earlier call's rows, less the ones this call measured again
        mine = {_key(r) for r in rows}
        rows = [r for r in earlier["results"] if _key(r) not in mine] + rows
        runs = [r for r in earlier.get("runs", []) if r["started"] != run["started"]] + runs
    ratios(rows)
    return {
        **run["environment"],
        "benchmark": "llm_roofline",
        "complete": complete,
        "model_choice": MODEL_CHOICE,
        "settings": run["settings"],
        "copy_gbps": run["copy"]["copy_gbps"],
        "copy": run["copy"],
        "variants": [v.describe() for v in VARIANTS],
        "targets": targets(rows),
        "problems": problems(rows),
        "results": rows,
        "runs": [{k: v for k, v in r.items() if k != "environment"} for r in runs],
    }


def earlier_results(path: Path, environment_now: dict[str, Any]) -> dict[str, Any] | None:
    """The file an earlier ``--append`` call wrote, when it was measured on this device, torch and commit."""
    if not path.exists():
        log(f"--append: {path} does not exist yet; starting it")
        return None
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log(f"--append: {path} is unreadable ({exc}); replacing it")
        return None
    same = earlier.get("benchmark") == "llm_roofline" and all(
        earlier.get(k) == environment_now[k] for k in ("device", "torch", "commit")
    )
    if not same:
        found = {k: earlier.get(k) for k in ("benchmark", "device", "torch", "commit")}
        log(f"--append: {path} is from another run ({found}); replacing it")
        return None
    log(f"--append: adding to {path} ({len(earlier.get('results', []))} rows)")
    return earlier


def print_rows(result: dict[str, Any]) -> None:
    head = f"{'variant':<32} {'batch':>5} {'ms/token':>9} {'tok/s':>9} {'GB/s':>8} {'of copy':>7} {'x torchRO':>9}"
    print(f"{result['device']}, copy {result['copy_gbps']} GB/s\n{head} tokens", flush=True)
    for r in result["results"]:
        if "ms_per_token" not in r:
            print(f"{r['variant']:<32} {r['batch']:>5} {'FAILED' if 'error' in r else '-':>9}", flush=True)
            continue
        ratio = r.get("ratio_to_torch_compile_reduce_overhead")
        print(
            f"{r['variant']:<32} {r['batch']:>5} {r['ms_per_token']:>9.3f} {r['tokens_per_s']:>9.1f} "
            f"{r['achieved_gbps']:>8.1f} {r['fraction_of_copy']:>7.3f} {'-' if ratio is None else ratio:>9} "
            f"{r['tokens_verdict']}",
            flush=True,
        )


# -- the command line -----------------------------------------------------------------------------------------
def _preset(text: str) -> str:
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}: use one of {', '.join(PRESETS)} (tiny on a CPU)")
    return text


def _batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch size: give positive integers, e.g. --batch 1 8")
    return value


def _at_least(low: int, example: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= {low}, e.g. {example}")
        return value

    return parse


def _dtype(text: str) -> str:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: use {' or '.join(DTYPES)}")
    return text


def _variants(text: str) -> list[Variant]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if bad := [n for n in names if n not in BY_NAME]:
        raise argparse.ArgumentTypeError(
            f"unknown variant {bad[0]!r}: give a comma-separated subset of {', '.join(BY_NAME)}, e.g. "
            "--variants 'eager,airgraph reduce-overhead'"
        )
    chosen = list(dict.fromkeys(names))
    return [BY_NAME["eager"], *(BY_NAME[n] for n in chosen if n != "eager")]  # eager first: the reference tokens


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--preset", type=_preset, default=None, help="tiny, 1b or 8b (default: 1b on cuda, tiny)")
    parser.add_argument("--batch", type=_batch, nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    parser.add_argument("--new-tokens", type=_at_least(2, "--new-tokens 256"), default=256)
    parser.add_argument("--prompt-len", type=_at_least(1, "--prompt-len 128"), default=128)
    parser.add_argument("--dtype", type=_dtype, default=None, help="float32 or bfloat16 (default: bf16 on cuda)")
    parser.add_argument(
        "--variants", type=_variants, default=list(VARIANTS), help=f"comma-separated, of: {', '.join(BY_NAME)}"
    )
    parser.add_argument("--rounds", type=_at_least(1, "--rounds 3"), default=3, help="timed generates per variant")
    parser.add_argument("--threads", type=_at_least(1, "--threads 1"), default=None, help="CPU threads (default 1)")
    parser.add_argument("--copy-mib", type=_at_least(1, "--copy-mib 1024"), default=None, help="copy size, MiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="one step per variant under torch.profiler, last")
    parser.add_argument("--append", action="store_true", help="add to --output if it is from this commit and device")
    parser.add_argument("--output", default=None, help="default: benchmarks/results/llm_roofline_<device>.json")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    args.preset = args.preset or ("1b" if args.device == "cuda" else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.batch = list(dict.fromkeys(args.batch))
    args.output = Path(args.output or f"benchmarks/results/llm_roofline_{args.device}.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:  # one thread on the CPU by default: a shared machine's waits make every matmul slower in bursts
        torch.set_num_threads(threads)
    # every variant stays compiled in this process, all on DecodeStep.forward: raise Dynamo's limit, and fail
    # rather than fall back to eager past it
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if args.profile and device.type == "cuda":  # CUPTI torn down under live CUDA graphs crashes (torch's workaround)
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
    dtype = DTYPES[args.dtype]
    max_seq_len = (args.prompt_len + args.new_tokens + 7) // 8 * 8  # as gpt-fast sizes its caches
    config = LlamaConfig.preset(args.preset, max_seq_len=max_seq_len)
    run: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(device),
    }
    earlier = earlier_results(args.output, run["environment"]) if args.append else None
    log(
        f"airgraph from {os.path.dirname(airgraph.__file__)}, torch {torch.__version__}, {run['environment']['device']}"
    )
    log(f"measuring the copy bandwidth ({args.copy_mib or COPY_MIB[device.type]} MiB copies)")
    run["copy"] = measure_copy(device, args.copy_mib or COPY_MIB[device.type])
    log(f"copy_gbps {run['copy']['copy_gbps']} (median {run['copy']['median_gbps']})")
    run["settings"] = {
        "preset": args.preset,
        "model": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "weights": f"random, N(0, 0.02), seed {args.seed}, drawn on {device.type}",
        "dtype": args.dtype,
        "batches": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "decode_steps": args.new_tokens - 1,
        "rounds": args.rounds,
        "variants": [v.name for v in args.variants],
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "profile": args.profile,
        "loop": "gpt-fast's: eager prefill, then the compiled step (model + argmax) per token, its output cloned and "
        "fed back, input_pos incremented in place on the device; no host sync until the loop ends",
        "timing": "CUDA events between steps (CPU: perf_counter); ms_per_token: median over every timed step of "
        "every round; loop_ms_per_token: each round's loop wall time per step",
        "bytes": "weight_bytes: parameters a step reads (tied embedding once; an untied input embedding by its batch "
        "rows); kv_bytes_per_token: keys and values of the filled positions at the average decode step (prompt_len "
        "+ new_tokens / 2); kv_bytes_per_token_as_read: the whole static cache, which the model's attention reads "
        "today; GB = 1e9 bytes",
        "tokens_match": "every call's tokens equal eager's; bfloat16: or differ only at rounding ties "
        f"(airgraph/bench/ties.py, tolerance {ties.TIE_TOLERANCE})",
        "first_call": "the first generate, compile included, with the Inductor caches as they are",
    }
    groups: list[Group] = []

    def write(complete: bool) -> dict[str, Any]:
        result = report(groups, run, earlier, complete)
        write_json(result, args.output)
        return result

    for batch in args.batch:
        log(f"batch {batch}: building {args.preset} ({args.dtype}) on {device}")
        model = TinyLlama(config, seed=args.seed, device=device, dtype=dtype)
        model.setup_caches(batch, dtype=dtype, device=device)
        model.eval()
        generator = torch.Generator().manual_seed(args.seed + batch)
        prompt = torch.randint(0, config.vocab_size, (batch, args.prompt_len), generator=generator).to(device)
        group = Group(batch, model, prompt, [])
        groups.append(group)
        log(f"batch {batch}: {weight_bytes(model, batch)['weight_bytes'] / 1e9:.3f} GB of weights per step")
        for variant in args.variants:
            case = Case(variant)
            group.cases.append(case)
            log(f"batch {batch} {variant.name}: compile and warm up (two generates)")
            try:
                if variant.name != "eager" and group.reference is None:
                    raise RuntimeError("eager failed: no reference tokens")
                warm_up(group, case, args.new_tokens)
                log(f"batch {batch} {variant.name}: first generate {case.first_call_s:.1f} s")
            except Exception as exc:  # recorded; the others go on
                case.error = failure(exc, "compile and warm-up")
                log(f"batch {batch} {variant.name}: FAILED {case.error['type']}: {case.error['message'][:300]}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            write(complete=False)
        for i in range(args.rounds):
            live = [c for c in group.cases if c.error is None]
            shift = i % len(live) if live else 0
            for case in live[shift:] + live[:shift]:  # each round starts with another variant
                try:
                    timed_round(group, case, args.new_tokens)
                except Exception as exc:
                    case.error = failure(exc, f"timed round {i + 1}")
                    log(
                        f"batch {batch} {case.variant.name}: FAILED {case.error['type']}: {case.error['message'][:300]}"
                    )
            done = ", ".join(f"{c.variant.name} {c.round_ms[-1]:.3f}" for c in live if c.error is None and c.round_ms)
            log(f"batch {batch} round {i + 1}/{args.rounds}: ms/token {done}")
            write(complete=False)
        for case in group.cases:
            if case.differing and group.reference is not None:
                try:
                    judge_differing(group, case, args.dtype)
                except Exception as exc:
                    case.judged.append({"verdict": "wrong", "judging_error": failure(exc, "judging")})
                log(f"batch {batch} {case.variant.name}: tokens differ from eager's: {case.judged}")
        write(complete=False)
    if args.profile:  # last: the profiler leaves CUPTI loaded, and host costs grow after it
        for group in groups:
            for case in group.cases:
                if case.step is None or case.error is not None:
                    continue
                log(f"batch {group.batch} {case.variant.name}: profiling one step")
                try:
                    case.profile = profile_step(group, case, device)
                except Exception as exc:
                    case.profile = {"error": failure(exc, "profile")}
    result = write(complete=True)
    print_rows(result)
    for target in result["targets"]:
        log(f"target: {target['target']}: {target['value']} (met: {target['met']})")
    for problem in result["problems"]:
        log(f"PROBLEM {problem}")
    log(f"wrote {args.output}")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
