"""Tuning benchmark (issue #13): tuned vs untuned airgraph vs torch.compile(mode="max-autotune"), side by side.

For each model of the set, in one process: airgraph untuned (the bank ignored), airgraph after operator tuning
(OPAT) and after subgraph tuning (SGAT) (each a fresh compile that takes its choices from the bank), torch.compile
max-autotune, and eager. Per-call latencies are measured in interleaved rounds (every variant once per round, so
load from other processes hits all alike): medians and ratios. Also recorded:

- tuning time of each mode vs torch.compile max-autotune's compile time (its autotuning included), both with
  Inductor's caches off (as on a fresh machine);
- tuning cost per GEMM (operator mode: seconds spent on each GEMM unit);
- a second tuning run on the same bank: what it measured (nothing: all hits) and how long it took;
- the noise floor: the untuned graph compiled twice, measured as two variants (identical code);
- compile time with the bank vs untuned (first call, Inductor's caches on and warm for both: a segment compiled
  with frozen weights is not in Inductor's FX graph cache, it compiles every time).

Targets (issue #13, 2-core CPU): tuned/untuned <= 0.7 on the batch-8 MLP, <= 0.9 on tiny LLaMA decode, never above
1.02; tuned faster or equal to max-autotune and less tuning time; <= 6 s per GEMM; a second run all hits and a
compile with the bank within 1.2x of an untuned compile. Issue #20: where users meet it, in a fresh process that
compiles the model with the bank and without (``fresh_process``): tuned / untuned <= 0.9 where the report claims a
gain of 10% or more, never > 1.02, and agreeing with the report's graph after/before within noise; a second tuning
run <= 0.2 of the first. Models ``gelu-mlp-<d>``: Linear(d, 2d) -> GELU -> Linear(2d, 2d) -> GELU -> Linear(2d, d).

    python benchmarks/tuning.py [--models mlp,gelu-mlp-384,gelu-mlp-640,gelu-mlp-896,llama-decode,llama-prefill,cnn]
        [--threads 1] [--rounds 15]

``--device cuda`` (benchmarks/tuning_cuda.py): the 1B preset's GEMMs, decode (one token) and prefill (128), op-tuned
on the GPU in reduce-overhead against untuned in a fresh process, into ``benchmarks/results/tuning_cuda.json``.

Issue #36's modes, each process fresh, results in their own section of the output (the rest is kept):
``--mode concurrent`` (``--pair A,B``): the two models tuned alone, then by two processes at once into one bank
(taking turns on the device, and as before #36 with a lock folder each), and each model in a fresh process with
the shared bank: inconclusive units, verdicts against alone, waits, tuned / untuned. ``--mode all-hit``: per model
and repetition, with a fresh Inductor cache each, a first tuning run, a second (all hits), a plain compile and
first call, a compile with the bank; and with one Inductor cache shared by a first and a second run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.bench.results import environment, write_json
from airgraph.config import CompilerConfig
from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs


class MLP(torch.nn.Module):
    """A GEMM-bound MLP: residual blocks of Linear(d, h) -> GELU -> Linear(h, d)."""

    def __init__(self, d: int = 512, h: int = 2048, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)) for _ in range(blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def gelu_mlp(d: int) -> torch.nn.Module:
    """Issue #20's MLP: Linear(d, 2d) -> GELU -> Linear(2d, 2d) -> GELU -> Linear(2d, d) (d = 384: the user's)."""
    h = 2 * d
    layers = [torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, h), torch.nn.GELU(), torch.nn.Linear(h, d)]
    return torch.nn.Sequential(*layers)


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, padding=1, stride=2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, padding=1, stride=2),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def build(name: str) -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval(), (torch.randn(8, 512),)
    if name.startswith("gelu-mlp-"):
        d = int(name.removeprefix("gelu-mlp-"))
        return gelu_mlp(d).eval(), (torch.randn(8, d),)
    if name == "cnn":
        return CNN().eval(), (torch.randn(4, 3, 32, 32),)
    model = build_tiny_llama("tiny")
    prompt = prefill_inputs(model.config, 1, 16)
    if name == "llama-prefill":
        return model, prompt
    with torch.no_grad():
        model(*prompt)
    return model, decode_inputs(model.config, 1, 16)


_frames = iter(range(1_000_000))


def own_frame(model: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of ``model`` (the same parameters and buffers) whose ``forward`` has a code object of its own.
    Dynamo keeps its compiled entries per code object and checks them in turn on every call: variants compiled
    from one ``forward`` with different backends would each pay the guards of all those compiled after it (here,
    up to a fifth of a tiny LLaMA step), so every variant gets its own."""
    cls = type(model)
    forward = cls.forward
    code = forward.__code__.replace(co_name=f"{forward.__name__}_{next(_frames)}")
    own = types.FunctionType(code, forward.__globals__, code.co_name, forward.__defaults__, forward.__closure__)
    variant = type(f"{cls.__name__}Variant", (cls,), {"forward": own})
    copied = copy.copy(model)
    copied.__class__ = variant
    return copied


def config_for(bank: Path | None) -> CompilerConfig:
    config = CompilerConfig()
    if bank is None:
        config.tuning.use_bank = False
    else:
        config.tuning.bank_dir = str(bank)
    return config


def first_call(fn: Callable, args: tuple) -> tuple[Any, float]:
    """The first call's output and its seconds (the compile)."""
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(*args)
    return out, time.perf_counter() - start


def per_call(variants: dict[str, Callable], args: tuple, rounds: int) -> dict[str, list[float]]:
    """Seconds of each call of each variant, interleaved: each round runs every variant for about 20 ms, in a new
    random order. Each call is timed on its own: on a shared machine a call the scheduler preempts takes a time
    slice longer (4 to 9 ms here), so medians of single calls are what compares, not means of batches."""
    calls = {}
    with torch.no_grad():
        for name, fn in variants.items():
            start = time.perf_counter()
            fn(*args)
            calls[name] = max(3, min(500, int(0.02 / max(time.perf_counter() - start, 1e-6))))
        samples: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants.items())
        shuffle = random.Random(0).shuffle
        for _ in range(rounds):
            shuffle(order)
            for name, fn in order:
                for _ in range(calls[name]):
                    start = time.perf_counter()
                    fn(*args)
                    samples[name].append(time.perf_counter() - start)
    return samples


@contextlib.contextmanager
def cold_caches() -> Iterator[None]:
    """Inductor's caches empty (a new cache folder): tuning and max-autotune's compile timed as on a fresh machine.
    (Not ``force_disable_caches``: that also changes the graphs AOTAutograd hands over, so a bank tuned under it
    would not match a later compile.)"""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        try:
            yield
        finally:
            if saved is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def bench_model(name: str, rounds: int, work: Path, budget: float) -> dict[str, Any]:
    torch._dynamo.reset()  # Dynamo would mark dims dynamic after seeing one model at several shapes
    model, args = build(name)
    with torch.no_grad():
        expected = model(*args)
    result: dict[str, Any] = {"model": name}
    variants: dict[str, Callable] = {"eager": model}
    compile_s: dict[str, float] = {}

    # untuned: compiled twice, the second with Inductor's caches warm (what the bank compile is compared with)
    copies, seconds = [], []
    for _ in range(3):  # Dynamo compiles again for a new backend object; the fastest of 3 (caches warm)
        copies.append(torch.compile(own_frame(model), backend=AirgraphBackend(config_for(None))))
        seconds.append(first_call(copies[-1], args)[1])
    compile_s["airgraph untuned"] = min(seconds)
    copies = copies[-2:]
    # Two compiles of one graph, measured side by side: how far apart identical code measures here (noise floor).
    variants["airgraph untuned"], variants["airgraph untuned, 2nd compile"] = copies

    for mode in ("op", "subgraph"):
        bank = work / f"bank-{name}-{mode}"
        base = config_for(bank)
        base.tuning.budget_s = budget
        start = time.perf_counter()
        with cold_caches():
            report = airgraph.tune(model, *args, mode=mode, bank_dir=bank, work_path=work, config=base)
        tuning_s = time.perf_counter() - start
        again_start = time.perf_counter()
        again = airgraph.tune(model, *args, mode=mode, bank_dir=bank, work_path=work, config=base)
        again_s = time.perf_counter() - again_start
        compiled, seconds = None, []
        for _ in range(3):  # as untuned: the fastest of 3, Inductor's caches warm
            compiled = torch.compile(own_frame(model), backend=AirgraphBackend(config_for(bank)))
            seconds.append(first_call(compiled, args)[1])
        compile_s[f"airgraph {mode}-tuned"] = min(seconds)
        variants[f"airgraph {mode}-tuned"] = compiled
        outcomes = report.outcomes
        result[f"{mode}_tuning"] = {
            "tuning_s": tuning_s,
            "report": str(report.path),
            "counts": report.counts(),
            "stale": sum(t.stale for t in report.tasks),
            "dynamic": sum(t.dynamic for t in report.tasks),
            "units": [
                {
                    "name": o.name,
                    "type": o.op_type,
                    "status": o.status,
                    "choice": f"{o.tune_mode} {o.choice}".strip(),
                    "before_us": o.before_us,
                    "after_us": o.after_us,
                    "seconds": o.seconds,
                    "measured_us": o.measured,
                    "note": o.note,
                }
                for o in outcomes
            ],
            "dropped": [list(d) for t in report.tasks for d in t.dropped],
            "graph_before_after_ms": [(t.model_before_ms, t.model_after_ms) for t in report.tasks],
            "second_run": {
                "seconds": again_s,
                "counts": again.counts(),
                "measured_units": sum(1 for o in again.outcomes if o.measured),
            },
        }
        # The claim of the run that wrote the bank: the second run measures again what the first left undecided
        # (inconclusive on a busy machine).
        claiming = again if again.measured else report
        graphs = [(t.model_before_ms, t.model_after_ms) for t in claiming.tasks if t.model_before_ms]
        # What the report claims: the whole call, tuned / untuned (report.call); the graphs alone beside it.
        claimed = claiming.call.ratio if claiming.call is not None else 1.0
        fresh = fresh_process(name, bank, rounds)
        result[f"{mode}_tuning"]["report_call"] = claiming.call.to_dict() if claiming.call is not None else None
        result[f"{mode}_tuning"]["report_graphs_after_over_before"] = (
            sum(a for _, a in graphs) / sum(b for b, _ in graphs) if graphs else 1.0
        )
        result[f"{mode}_tuning"]["report_after_over_before"] = claimed
        result[f"{mode}_tuning"]["fresh_process"] = fresh
        result[f"{mode}_tuning"]["second_run_over_first"] = again_s / tuning_s
        if mode == "op":
            gemms = [o.seconds for o in outcomes if o.op_type in ("addmm", "mm", "bmm") and o.measured]
            result["op_tuning"]["seconds_per_gemm_max"] = max(gemms, default=0.0)

    start = time.perf_counter()
    max_autotune = torch.compile(own_frame(model), mode="max-autotune")
    with cold_caches():
        first_call(max_autotune, args)
    result["max_autotune_compile_s"] = time.perf_counter() - start
    variants["torch.compile max-autotune"] = max_autotune

    with torch.no_grad():
        for vname, fn in variants.items():
            torch.testing.assert_close(fn(*args), expected, rtol=1e-3, atol=1e-3, msg=lambda m, v=vname: f"{v}: {m}")
    samples = per_call(variants, args, rounds)
    median = {v: statistics.median(s) * 1e6 for v, s in samples.items()}
    result["median_us"] = median
    result["p10_p90_us"] = {v: (_quantile(s, 0.1) * 1e6, _quantile(s, 0.9) * 1e6) for v, s in samples.items()}
    best = min(median["airgraph op-tuned"], median["airgraph subgraph-tuned"])
    untuned_us = median["airgraph untuned"]
    result["ratios"] = {
        "op-tuned / untuned": median["airgraph op-tuned"] / untuned_us,
        "subgraph-tuned / untuned": median["airgraph subgraph-tuned"] / untuned_us,
        "best tuned / untuned": best / untuned_us,
        "best tuned / max-autotune": best / median["torch.compile max-autotune"],
        "untuned / eager": untuned_us / median["eager"],
        "noise floor: untuned 2nd compile / untuned": median["airgraph untuned, 2nd compile"] / untuned_us,
    }
    # Issue #20's checks, per mode: the report's claim (the whole call) agrees with the fresh process within noise;
    # a claimed gain of 10% or more reaches the fresh process
    # (<= 0.9); tuning never leaves a model slower (<= 1.02); a second tuning run <= 0.2 of the first.
    noise = abs(result["ratios"]["noise floor: untuned 2nd compile / untuned"] - 1)
    for mode in ("op", "subgraph"):
        tuning = result[f"{mode}_tuning"]
        fresh_ratio, claimed = tuning["fresh_process"]["tuned/untuned"], tuning["report_after_over_before"]
        # Within noise: 5%, plus how far identical code compiled twice measured apart here (the noise floor). The
        # rounds' spreads are kept beside it: on this shared machine they reach 30% and would excuse anything.
        allowed = 0.05 + noise
        tuning["checks"] = {
            "report_vs_fresh_gap": abs(claimed - fresh_ratio),
            "spreads": {"report": (tuning["report_call"] or {}).get("spread"), **tuning["fresh_process"]["spread"]},
            "allowed_gap": allowed,
            "report_agrees_with_fresh": abs(claimed - fresh_ratio) <= allowed,
            "claimed_gain_reached": claimed > 0.9 or fresh_ratio <= 0.9,
            # tuned / untuned of identical code (the bank chose nothing) is the noise floor again, not a slowdown
            "changed": tuning["counts"]["repo_add_num"] + tuning["counts"]["repo_update_num"] > 0,
            "never_slower": fresh_ratio <= 1.02,
            "second_run_fast": tuning["second_run_over_first"] <= 0.2,
        }
    result["compile_s"] = compile_s
    result["compile_ratio_with_bank"] = {
        mode: compile_s[f"airgraph {mode}-tuned"] / compile_s["airgraph untuned"] for mode in ("op", "subgraph")
    }
    return result


def fresh_process(name: str, bank: Path, rounds: int) -> dict[str, Any]:
    """Tuned / untuned where users meet it: a new process (this script, ``--fresh BANK``) compiles the model once
    with the bank and once without, and times both interleaved (per_call)."""
    command = [sys.executable, __file__, "--fresh", str(bank), "--models", name, "--rounds", str(rounds)]
    command += ["--threads", str(torch.get_num_threads())]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_fresh(name: str, bank: Path, rounds: int) -> dict[str, Any]:
    model, args = build(name)
    variants = {
        "untuned": torch.compile(own_frame(model), backend=AirgraphBackend(config_for(None))),
        "tuned": torch.compile(own_frame(model), backend=AirgraphBackend(config_for(bank))),
    }
    for fn in variants.values():
        first_call(fn, args)
    samples = per_call(variants, args, rounds)
    median = {v: statistics.median(s) * 1e6 for v, s in samples.items()}
    spread = {v: (_quantile(s, 0.75) - _quantile(s, 0.25)) / statistics.median(s) for v, s in samples.items()}
    return {"median_us": median, "spread": spread, "tuned/untuned": median["tuned"] / median["untuned"]}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- issue #36: concurrent tuners, the all-hit run --------------------------------------------------------------
def child(kind: str, name: str, bank: Path | None, lock_dir: str | None, budget: float, work: Path) -> dict[str, Any]:
    """One measurement of a fresh process (``--child``): ``tune`` (airgraph.tune, operator mode), ``plain`` (a compile
    without the bank and its first call) or ``bank`` (a compile with the bank and its first call); seconds from
    the model built to the call returned."""
    model, args = build(name)
    if kind in ("plain", "bank"):
        compiled = torch.compile(model, backend=AirgraphBackend(config_for(bank if kind == "bank" else None)))
        return {"seconds": first_call(compiled, args)[1]}
    assert bank is not None
    config = config_for(bank)
    config.tuning.budget_s = budget
    if lock_dir is not None:
        config.tuning.lock_dir = lock_dir
    start = time.perf_counter()
    report = airgraph.tune(model, *args, mode="op", bank_dir=bank, work_path=work, config=config)
    seconds = time.perf_counter() - start
    units = [[o.name, o.status, f"{o.tune_mode} {o.choice}".strip(), o.note[:100]] for o in report.outcomes]
    return {
        "seconds": seconds,
        "counts": report.counts(),
        "units": units,
        "inconclusive": sum("inconclusive" in o.note for o in report.outcomes),  # a unit, or its whole graph
        "measured_units": sum(1 for o in report.outcomes if o.measured),
        "call": report.call.to_dict() if report.call is not None else None,
        "waits": report.waits.to_dict(),
    }


def _child_command(kind: str, name: str, bank: Path | None, cache: Path, lock_dir: Path | None, args) -> tuple:
    command = [sys.executable, __file__, "--child", kind, "--models", name, "--threads", str(args.threads)]
    command += ["--budget", str(args.budget), "--work", str(cache.parent)]
    command += ["--bank", str(bank)] if bank is not None else []
    command += ["--lock-dir", str(lock_dir)] if lock_dir is not None else []
    return command, {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}


def run_children(jobs: list[tuple], args) -> list[dict[str, Any]]:
    """Fresh processes started together, each ``(kind, name, bank, inductor cache, lock folder)``; their results
    (``process_s``: the whole process, interpreter and imports included)."""
    procs = []
    for kind, name, bank, cache, lock_dir in jobs:
        command, env = _child_command(kind, name, bank, cache, lock_dir, args)
        procs.append(
            (
                subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
                time.perf_counter(),
                f"{kind} {name}",
            )
        )
    results = []
    for proc, start, what in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{err[-3000:]}")
        results.append({**json.loads(out.strip().splitlines()[-1]), "process_s": time.perf_counter() - start})
    return results


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _cache(work: Path, tag: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"inductor-{tag}-", dir=work))
    return folder


def bench_concurrent(pair: list[str], args, work: Path) -> dict[str, Any]:
    """Issue #36: two tuners at once on this machine reach the verdicts each reaches alone, none inconclusive, and
    a fresh process meets what each report claims."""
    locks = work / "locks"
    result: dict[str, Any] = {"models": pair, "load_before": _load()}
    alone = [run_children([("tune", name, work / f"alone-{name}", _cache(work, "a"), locks)], args)[0] for name in pair]
    result["alone"] = dict(zip(pair, alone, strict=True))
    separate = [("tune", name, work / "separate-bank", _cache(work, "s"), work / f"own-locks-{name}") for name in pair]
    result["together_without_turns"] = dict(zip(pair, run_children(separate, args), strict=True))
    shared = [("tune", name, work / "shared-bank", _cache(work, "t"), locks) for name in pair]
    together = run_children(shared, args)
    result["together"] = dict(zip(pair, together, strict=True))
    result["fresh_process"] = {name: fresh_process(name, work / "shared-bank", args.rounds) for name in pair}
    result["load_after"] = _load()
    checks = {}
    for name, lone, both in zip(pair, alone, together, strict=True):
        claimed = (both["call"] or {}).get("tuned_over_untuned", 1.0)
        fresh = result["fresh_process"][name]["tuned/untuned"]
        checks[name] = {
            "inconclusive_together": both["inconclusive"],
            "inconclusive_without_turns": result["together_without_turns"][name]["inconclusive"],
            "same_verdicts_as_alone": [u[1:3] for u in both["units"]] == [u[1:3] for u in lone["units"]],
            "waited_s": both["waits"]["waited_s"],
            "report_tuned_over_untuned": claimed,
            "fresh_tuned_over_untuned": fresh,
            "claimed_gain_reached": claimed > 0.9 or fresh <= 0.9,
        }
    result["checks"] = checks
    return result


def bench_all_hit(name: str, args, work: Path) -> dict[str, Any]:
    """Issue #36: a tuning run whose units are all in the bank against a plain compile and first call, each in a
    fresh process with a fresh Inductor cache; and a second run over the first with one shared Inductor cache.
    (Where the first run left units inconclusive, runs follow until the bank answers every unit: the all-hit run
    comes after them, its ratio still over the first.)"""

    def fill(bank: Path, cache: Path | None) -> tuple[dict[str, Any], int]:
        """The first tuning run, then more until one leaves no unit inconclusive (a busy machine's leave some
        for the next run to measure; an all-hit run follows a bank that answers every unit)."""
        runs = run_children([("tune", name, bank, cache or _cache(work, "f"), None)], args)
        while runs[-1]["inconclusive"] and len(runs) < 4:
            runs += run_children([("tune", name, bank, cache or _cache(work, "f"), None)], args)
        return runs[0], len(runs)

    reps = []
    for rep in range(args.reps):
        bank = work / f"hit-{name}-{rep}"
        load = _load()
        first, filled = fill(bank, None)
        order = ["second", "plain", "bank"] if rep % 2 == 0 else ["plain", "bank", "second"]
        kinds = {"second": ("tune", bank), "plain": ("plain", None), "bank": ("bank", bank)}
        runs = {
            key: run_children([(kinds[key][0], name, kinds[key][1], _cache(work, key), None)], args)[0] for key in order
        }
        cache = _cache(work, "shared")
        first_shared, filled_shared = fill(work / f"shared-{name}-{rep}", cache)
        (second_shared,) = run_children([("tune", name, work / f"shared-{name}-{rep}", cache, None)], args)
        reps.append(
            {
                "load": load,
                "first_s": first["seconds"],
                "tuning_runs_before": filled,  # the first, and any the inconclusive units of a busy machine took
                "second_s": runs["second"]["seconds"],
                "plain_s": runs["plain"]["seconds"],
                "with_bank_s": runs["bank"]["seconds"],
                "second_measured_units": runs["second"]["measured_units"],
                "second_counts": runs["second"]["counts"],
                "second_turns": runs["second"]["waits"]["turns"],
                "process_s": {key: runs[key]["process_s"] for key in order} | {"first": first["process_s"]},
                "second_over_plain": runs["second"]["seconds"] / runs["plain"]["seconds"],
                "shared_cache": {
                    "first_s": first_shared["seconds"],
                    "tuning_runs_before": filled_shared,
                    "second_s": second_shared["seconds"],
                    "second_measured_units": second_shared["measured_units"],
                    "second_over_first": second_shared["seconds"] / first_shared["seconds"],
                },
            }
        )
    median = statistics.median
    return {
        "model": name,
        "reps": reps,
        "second_over_plain": median(r["second_over_plain"] for r in reps),
        "second_over_plain_of_medians": median(r["second_s"] for r in reps) / median(r["plain_s"] for r in reps),
        "with_bank_over_plain": median(r["with_bank_s"] / r["plain_s"] for r in reps),
        "shared_cache_second_over_first": median(r["shared_cache"]["second_over_first"] for r in reps),
    }


def update_section(path: str, section: str, value: Any, *, run: int | None = None) -> None:
    """Write ``value`` as ``section`` of the JSON file at ``path``, keeping its other fields; with ``run``, as that
    entry of the section's list of runs (a figure from one run is a sample: each mode is run twice)."""
    target = Path(path)
    data = json.loads(target.read_text()) if target.exists() else {}
    if run is None:
        data[section] = value
    else:
        runs = data.get(section) if isinstance(data.get(section), list) else []
        data[section] = [*runs[:run], value]
    write_json(data, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=parser_default_models())
    parser.add_argument("--mode", choices=["models", "concurrent", "all-hit"], default="models")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: benchmarks/tuning_cuda.py")
    parser.add_argument("--pair", default="gelu-mlp-896,mlp", help="concurrent: the two models tuned at once")
    parser.add_argument("--reps", type=int, default=2, help="all-hit: repetitions per model")
    parser.add_argument("--run", type=int, default=0, help="concurrent, all-hit: the run's place in its section's list")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default: 1, steadier when shared)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=6.0, help="config.tuning.budget_s (seconds per unit)")
    parser.add_argument("--output", default="benchmarks/results/tuning_cpu.json", help="(cuda: tuning_cuda.json)")
    parser.add_argument("--fresh", metavar="BANK", help=argparse.SUPPRESS)  # fresh_process's child
    parser.add_argument("--child", choices=["tune", "plain", "bank"], help=argparse.SUPPRESS)  # run_children's
    parser.add_argument("--bank", help=argparse.SUPPRESS)
    parser.add_argument("--lock-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        return cuda_main(args)
    torch.set_num_threads(args.threads)
    if args.fresh:
        print(json.dumps(measure_fresh(args.models, Path(args.fresh), args.rounds)))
        return 0
    if args.child:
        bank = Path(args.bank) if args.bank else None
        print(json.dumps(child(args.child, args.models, bank, args.lock_dir, args.budget, Path(args.work))))
        return 0
    if args.mode != "models":
        return issue36(args)
    for name in ("cache_size_limit", "recompile_limit"):  # several compiled variants of one model, side by side
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    out: dict[str, Any] = {
        **environment(torch.device("cpu")),
        "threads": args.threads,
        "settings": {"rounds": args.rounds, "budget_s": args.budget},
    }
    out["models"] = []
    with tempfile.TemporaryDirectory(prefix="airgraph-tuning-bench-") as work:
        for name in args.models.split(","):
            print(f"== {name}", file=sys.stderr, flush=True)
            result = bench_model(name, args.rounds, Path(work), args.budget)
            out["models"].append(result)
            print(
                f"{name}: "
                + ", ".join(f"{k} {v:.1f} us" for k, v in result["median_us"].items())
                + " | "
                + ", ".join(f"{k} {v:.3f}" for k, v in result["ratios"].items())
                + " | "
                + ", ".join(
                    f"{mode}: report {result[f'{mode}_tuning']['report_after_over_before']:.3f}, fresh process "
                    f"{result[f'{mode}_tuning']['fresh_process']['tuned/untuned']:.3f}, second run "
                    f"{result[f'{mode}_tuning']['second_run_over_first']:.2f}"
                    for mode in ("op", "subgraph")
                ),
                flush=True,
            )
            for key, value in out.items():
                update_section(args.output, key, value)
    return 0


def cuda_main(args) -> int:
    """``--device cuda`` (benchmarks/tuning_cuda.py): the 1B preset's decode step and a prefill, op-tuned on the
    GPU in reduce-overhead, against untuned in a fresh process."""
    import tuning_cuda

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.fresh:
        print(json.dumps(tuning_cuda.measure_fresh_cuda(args.models, Path(args.fresh), args.rounds)))
        return 0
    names = args.models.split(",") if args.models != parser_default_models() else list(tuning_cuda.TOKENS)
    output = (
        args.output if args.output != "benchmarks/results/tuning_cpu.json" else "benchmarks/results/tuning_cuda.json"
    )
    out: dict[str, Any] = {
        **environment(torch.device("cuda")),
        "mode": "reduce-overhead",
        "settings": {"rounds": args.rounds, "budget_s": args.budget},
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="airgraph-tuning-cuda-") as work:
        for name in names:
            print(f"== {name}", file=sys.stderr, flush=True)
            result = tuning_cuda.bench_cuda_model(__file__, name, args.rounds, args.budget, Path(work))
            out["models"].append(result)
            print(f"{name}: {json.dumps(result['checks'])}", flush=True)
            write_json(out, output)
    return 0


def parser_default_models() -> str:
    return "mlp,gelu-mlp-384,gelu-mlp-640,gelu-mlp-896,llama-decode,llama-prefill,cnn"


def issue36(args) -> int:
    section = {
        **environment(torch.device("cpu")),
        "threads": args.threads,
        "settings": {"rounds": args.rounds, "budget_s": args.budget, "reps": args.reps},
        "load_note": "a shared machine: other workers' processes ran beside these (load averages: 1, 5, 15 min)",
    }
    with tempfile.TemporaryDirectory(prefix="airgraph-tuning-36-") as folder:
        work = Path(folder)
        if args.mode == "concurrent":
            result = bench_concurrent(args.pair.split(","), args, work)
            print(json.dumps(result["checks"], indent=1), flush=True)
            update_section(args.output, "concurrent", {**section, **result}, run=args.run)
            return 0
        section["models"] = []
        for name in args.models.split(","):
            print(f"== all-hit {name}", file=sys.stderr, flush=True)
            section["models"].append(bench_all_hit(name, args, work))
            found = section["models"][-1]
            print(
                f"{name}: all-hit / plain {found['second_over_plain']:.2f} (with the bank / plain "
                f"{found['with_bank_over_plain']:.2f}); shared cache: second / first "
                f"{found['shared_cache_second_over_first']:.2f}",
                flush=True,
            )
            update_section(args.output, "all_hit", section, run=args.run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
