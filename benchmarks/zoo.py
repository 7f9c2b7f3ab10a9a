"""Zoo benchmark (issue #14): per-call latency of eager, torch.compile and airgraph on tiny transformers models.

Models: the test zoo's GPT-2, LLaMA, BERT, ViT and ResNet (tests/zoo/hf_models.py: random weights from tiny
configs, batch 2, 8 tokens or 16x16 / 32x32 images). Candidates: eager, ``torch.compile`` (Inductor, default
mode), airgraph default (Inductor kernels) and airgraph aten (direct ATen calls). Phases:

- inference: ``model(**inputs)`` under ``torch.no_grad()``, eval mode;
- train: one training step without the optimizer: gradients set to None, forward, the model's loss,
  backward. (The optimizer step is eager code, the same for every candidate; leaving it out keeps the
  ratios about what the compilers produce.)

Each (model, phase, candidate) is compiled on a fresh model copy, and all stay compiled in one process. Its
first call is timed alone with cold Inductor caches (a fresh cache folder and Inductor's in-memory caches
cleared, after an untimed compile that starts Inductor's compile workers), so no candidate reuses kernels
another compiled; the second call is timed too (transformers recompiles ViT and ResNet there: their loss sets
``config.problem_type`` on the first call). Every candidate's outputs (logits; loss and gradients) are checked
against eager before timing.

Timing: a sample is the mean of ``reps`` back-to-back calls (``reps`` chosen per model and phase so that an
eager sample takes about ``--sample-ms``); rounds interleave every model, phase and candidate, so machine
noise hits them alike (each round takes the candidates of one model and phase back to back, in a shuffled
order); the result is the median over rounds. Ratios are to torch.compile: of the medians, and the median of
the per-round ratios (paired samples, which a change of the machine's load between rounds does not move).

    python benchmarks/zoo.py [--rounds 7] [--threads 1] [--models gpt2,llama,bert,vit,resnet] [--output PATH]
"""

from __future__ import annotations

import argparse
import datetime
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.bench.results import environment, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the zoo's models live with its tests
from tests.zoo.compare import tensors
from tests.zoo.registry import SPECS
from tests.zoo.spec import Spec

MODELS = ("gpt2", "llama", "bert", "vit", "resnet")
CANDIDATES = ("eager", "torch.compile", "airgraph default", "airgraph aten")
PHASES = ("inference", "train")
REFERENCE = "torch.compile"


@dataclass
class Case:
    """One (model, phase, candidate): the callable timed, and what its compilation did."""

    model: str
    phase: str
    candidate: str
    step: Callable[[], Any]
    first_call_s: float = 0.0
    second_call_s: float = 0.0
    backend: AirgraphBackend | None = None
    output: Any = None  # the first call's result, checked against eager's
    graphs_before_timing: int | None = None  # airgraph: Dynamo graphs compiled before the timed rounds
    max_rel_diff: float = 0.0
    samples_us: list[float] = field(default_factory=list)


def _backend(candidate: str) -> Any:
    if candidate == "torch.compile":
        return "inductor"
    config = airgraph.CompilerConfig()
    if candidate == "airgraph aten":
        config.kernel_backend = "aten"
    return AirgraphBackend(config)


def _fresh_cache(folder: str) -> Any:
    """Cold Inductor caches: a new cache folder, in-memory caches cleared (torch._inductor.utils)."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache  # renamed in torch 2.8
    return fresh(dir=folder, delete=False)


def _caller(model: torch.nn.Module, label: str) -> Callable[..., Any]:
    """``model(**kwargs)`` through a code object of its own, named ``label``.

    Dynamo keeps compiled code per code object, and its shape history per code name and line: every
    transformers model enters through one shared decorator frame (``transformers/utils/generic.py``), so
    without this every case's call would first walk past the cache entries of all the cases compiled after
    it, and the shapes of other models would make a later case compile for dynamic shapes.
    """

    def call(**kwargs: Any) -> Any:
        return model(**kwargs)

    call.__code__ = call.__code__.replace(co_name=re.sub(r"\W", "_", label))
    return call


def build_case(spec: Spec, phase: str, candidate: str, cache_root: str) -> Case:
    model = spec.build().train(phase == "train")
    backend = None if candidate == "eager" else _backend(candidate)
    caller = _caller(model, f"{spec.name}_{phase}_{candidate}")
    fn = caller if backend is None else torch.compile(caller, backend=backend)
    if phase == "inference":
        inputs = spec.inputs(0, 0)

        def step() -> Any:
            with torch.no_grad():
                return fn(**inputs)
    else:
        inputs = spec.train_inputs(0)

        def step() -> Any:
            for p in model.parameters():
                p.grad = None
            loss = spec.loss(fn(**inputs))
            loss.backward()
            return [loss.detach(), *(p.grad for p in model.parameters())]

    case = Case(spec.name, phase, candidate, step, backend=backend if isinstance(backend, AirgraphBackend) else None)
    with _fresh_cache(cache_root):
        start = time.perf_counter()
        case.output = step()
        case.first_call_s = time.perf_counter() - start
        start = time.perf_counter()
        step()
        case.second_call_s = time.perf_counter() - start
    return case


def check(case: Case, reference: Case) -> float:
    """The largest difference from eager, scaled by eager's largest magnitude (raises past 1e-3)."""
    worst = 0.0
    for got, want in zip(tensors(case.output), tensors(reference.output), strict=True):
        scale = max(1.0, want.abs().max().item())
        worst = max(worst, (got - want).abs().max().item() / scale)
    if worst > 1e-3:
        raise AssertionError(f"{case.model} {case.phase} {case.candidate}: differs from eager by {worst:.3g}")
    return worst


def sample_us(fn: Callable[[], Any], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def _warm_workers(cache_root: str) -> None:
    """Start Inductor's compile workers and imports before any timed first call."""
    with _fresh_cache(cache_root):
        torch.compile(lambda x: (x * 2).sin())(torch.randn(8))
    torch._dynamo.reset()


def describe(case: Case) -> dict[str, Any] | None:
    """What airgraph compiled: Dynamo graphs, ATen graphs (kind, segments per backend), for the diagnosis."""
    if case.backend is None:
        return None
    return {
        "dynamo_graphs": case.backend.dynamo_graphs,
        "recompiled_while_timed": case.backend.dynamo_graphs != case.graphs_before_timing,
        "graphs": [
            {"kind": r.kind, "segments": len(r.segments), "backends": sorted({s.backend for s in r.segments})}
            for r in case.backend.reports
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds over all cases")
    parser.add_argument("--sample-ms", type=float, default=40.0, help="about how long an eager sample takes")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--output", default=None, help="default: benchmarks/results/zoo-<date>.json")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - {s.name for s in SPECS})
    if unknown:
        parser.error(f"--models: unknown {unknown}; the zoo has {sorted(s.name for s in SPECS)}")
    torch.set_num_threads(args.threads)
    # Every case stays compiled in this process (no torch._dynamo.reset() between them, which would make
    # the earlier ones recompile); each has its own code object (_caller), but frames after a graph break
    # inside transformers are shared by the candidates of a model: past Dynamo's default limit of 8 cache
    # entries a frame would silently run eagerly.
    torch._dynamo.config.recompile_limit = 64
    console = Console()
    specs = {s.name: s for s in SPECS}
    cases: list[Case] = []
    reps: dict[tuple[str, str], int] = {}
    # transformers registers each model class it builds in a global (output_capturing._CAN_RECORD_REGISTRY)
    # whose length compiled code guards: build every model once before compiling anything, or each new model
    # class would make every case compiled before it recompile.
    for name in names:
        specs[name].build()
    with tempfile.TemporaryDirectory(prefix="airgraph-zoo-bench-") as cache_root:
        _warm_workers(cache_root)
        build_order = random.Random(1)
        for name in names:
            for phase in PHASES:
                # Built in a shuffled order per model and phase: where a case's memory and code land depends on
                # what was built before it (identical torch.compile copies differ by 1-2%), so no candidate is
                # always built first.
                built: dict[str, Case] = {}
                for candidate in build_order.sample(CANDIDATES, len(CANDIDATES)):
                    console.print(f"compiling {name} {phase} {candidate}")
                    built[candidate] = build_case(specs[name], phase, candidate, cache_root)
                group = [built[c] for c in CANDIDATES]  # eager first: the reference
                for case in group[1:]:
                    case.max_rel_diff = check(case, group[0])
                eager_us = sample_us(group[0].step, 5)
                reps[(name, phase)] = max(3, int(args.sample_ms * 1e3 / eager_us))
                cases.extend(group)
        for case in cases:  # one warm sample each: the allocator and caches settle
            sample_us(case.step, reps[(case.model, case.phase)])
            case.graphs_before_timing = case.backend.dynamo_graphs if case.backend else None
        order = random.Random(0)
        groups = [[c for c in cases if (c.model, c.phase) == key] for key in reps]
        for i in range(args.rounds):
            console.print(f"round {i + 1}/{args.rounds}")
            for group in groups:  # the candidates of one model and phase back to back, in a shuffled order
                for case in order.sample(group, len(group)):
                    case.samples_us.append(sample_us(case.step, reps[(case.model, case.phase)]))
    results = summarize(cases, reps)
    report = {
        **environment(torch.device("cpu")),
        "benchmark": "zoo",
        "settings": {
            "models": names,
            "batch": 2,
            "phases": list(PHASES),
            "candidates": list(CANDIDATES),
            "rounds": args.rounds,
            "sample_ms": args.sample_ms,
            "threads": args.threads,
            "train_step": "grads to None, forward, loss, backward (no optimizer step)",
            "build_order": "shuffled per model and phase (seeded)",
            "first_call": "cold Inductor caches (fresh folder, in-memory caches cleared)",
        },
        "results": results,
    }
    console.print(table(results))
    output = args.output or f"benchmarks/results/zoo-{datetime.date.today().isoformat()}.json"
    write_json(report, output)
    console.print(f"wrote {output}")
    return 0


def summarize(cases: list[Case], reps: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Per case: the median, p10 and p90 of its samples; the ratio of its median to torch.compile's, and the
    median of the per-round ratios (each round's sample over torch.compile's sample of the same round: the
    two were taken seconds apart, so a change of the machine's load between rounds cancels)."""
    medians = {(c.model, c.phase, c.candidate): statistics.median(c.samples_us) for c in cases}
    samples = {(c.model, c.phase, c.candidate): c.samples_us for c in cases}
    rows = []
    for case in cases:
        median = medians[(case.model, case.phase, case.candidate)]
        reference = samples[(case.model, case.phase, REFERENCE)]
        paired = statistics.median(a / b for a, b in zip(case.samples_us, reference, strict=True))
        deciles = statistics.quantiles(case.samples_us, n=10) if len(case.samples_us) > 1 else [median] * 9
        rows.append(
            {
                "model": case.model,
                "phase": case.phase,
                "candidate": case.candidate,
                "median_us": round(median, 2),
                "p10_us": round(deciles[0], 2),
                "p90_us": round(deciles[-1], 2),
                "samples_us": [round(s, 2) for s in case.samples_us],
                "reps": reps[(case.model, case.phase)],
                "ratio_to_torch_compile": round(median / medians[(case.model, case.phase, REFERENCE)], 4),
                "paired_ratio_to_torch_compile": round(paired, 4),
                "first_call_s": round(case.first_call_s, 3),
                "second_call_s": round(case.second_call_s, 3),
                "max_rel_diff_vs_eager": case.max_rel_diff,
                "compiled": describe(case),
            }
        )
    return rows


def table(results: list[dict[str, Any]]) -> Table:
    out = Table(
        title="zoo: per-call latency (median us), x per-round ratio to torch.compile (median), first call (s, cold)"
    )
    for column in ("model", "phase", *CANDIDATES):
        out.add_column(column, justify="left" if column in ("model", "phase") else "right")
    keys = dict.fromkeys((r["model"], r["phase"]) for r in results)
    for model, phase in keys:
        row = {r["candidate"]: r for r in results if (r["model"], r["phase"]) == (model, phase)}
        cells = []
        for candidate in CANDIDATES:
            r = row[candidate]
            ratio = "" if candidate == REFERENCE else f" x{r['paired_ratio_to_torch_compile']:.2f}"
            first = "" if candidate == "eager" else f" | {r['first_call_s']:.1f}s"
            cells.append(f"{r['median_us']:.0f}{ratio}{first}")
        out.add_row(model, phase, *cells)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
