"""A second process starts fast (issue #35): fresh processes timed from their first line to their first output.

Each measurement is one fresh process (benchmarks/warm_start_worker.py), one thread, no autograd:

- cases: HF GPT-2 from a tiny config in the default mode (``gpt2``) and a two-block MLP mixer in reduce-overhead
  (``mixer``), and held-out models of the same kinds (``llama``: HF LLaMA from a tiny config, default mode;
  ``mixer3``: a three-block mixer of other sizes, reduce-overhead);
- variants: eager; torch.compile (Inductor) cold and warm; airgraph (torch.compile with its backend) cold and warm;
  ``airgraph.cache_compile`` cold and warm (a warm process loads its AOTInductor package without Dynamo). Cold: a
  fresh ``TORCHINDUCTOR_CACHE_DIR`` and airgraph cache folder (``AIRGRAPH_CACHE_DIR``) in a temporary folder; warm:
  a second process with the caches the cold one left. Every variant runs once per round, interleaved, so the load
  of the shared machine hits all alike; the table gives medians over ``--rounds``;
- the static kernels' warm start (tiny LLaMA decode at batch 2, 3 and 4, benchmarks/static_kernels_worker.py): a
  process with the built library installed over one without (both with empty Inductor caches), from process
  start;
- where the time goes: the warm airgraph process and torch.compile's warm process of each main case again under
  cProfile (seconds inside Dynamo's tracing, AOTAutograd, Inductor's passes, airgraph's steps, Inductor's cache
  lookups and its CPU instruction-set probe, the static kernels' load probe, imports) and under ``-X importtime``
  (the packages imported after ``import torch``).

    python benchmarks/warm_start.py [--rounds 2] [--cases gpt2,mixer,llama,mixer3] [--no-static] [--no-profile]
                                    [--output benchmarks/results/warm_start_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from airgraph.bench.results import environment, write_json

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "warm_start_worker.py"
STATIC_WORKER = Path(__file__).resolve().parent / "static_kernels_worker.py"
VARIANTS = (
    "eager",
    "torch.compile cold",
    "airgraph cold",
    "cache_compile cold",
    "torch.compile warm",
    "airgraph warm",
    "cache_compile warm",
)

# cProfile: (label, function name, a part of its file's path); cumulative seconds, the outermost call's.
PHASES = [
    ("dynamo_compile", "_compile", "_dynamo/convert_frame.py"),
    ("backend_call", "_call_user_compiler", "_dynamo/output_graph.py"),
    ("dynamo_guards", "build_guards", "_dynamo/"),
    ("aot_autograd", "aot_module_simplified", "_functorch/aot_autograd.py"),
    ("aot_autograd_cache_load", "try_load", "_aot_autograd/autograd_cache.py"),
    ("inductor_compile_fx", "compile_fx", "_inductor/compile_fx.py"),
    ("inductor_pre_grad_passes", "pre_grad_passes", "airgraph/lowering/inductor_passes.py"),
    ("inductor_inference_passes", "inference_passes", "airgraph/lowering/inductor_passes.py"),
    ("airgraph_compile_graph", "compile_graph", "airgraph/backend.py"),
    ("airgraph_passes", "run_pipeline", "airgraph/passes/pipeline.py"),
    ("airgraph_partition", "partition", "airgraph/lowering/partition.py"),
    ("airgraph_lowering", "lower_segments", "airgraph/lowering/lower.py"),
    ("airgraph_cache_load", "load", "airgraph/cache/"),
    ("inductor_compile_fx_inner", "compile_fx_inner", "_inductor/compile_fx.py"),
    ("fx_graph_cache_key", "prepare_key", "_inductor/codecache.py"),
    ("fx_graph_cache_load", "load_with_key", "_inductor/codecache.py"),
    ("inductor_cpu_isa_probe", "valid_vec_isa_list", "_inductor/cpu_vec_isa.py"),
    ("static_kernel_warm_start", "warm_start", "airgraph/kernels/warm.py"),
    ("static_kernel_load_probe", "check", "airgraph/kernels/probe.py"),
    ("subprocesses", "run", "subprocess.py"),
    ("imports", "_find_and_load", "importlib._bootstrap"),
]


def run_worker(args: list[str], env: dict[str, str], *, script: Path = WORKER, python: list[str] | None = None) -> Any:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [*(python or [sys.executable]), str(script), *args], capture_output=True, text=True, env=full, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done


def measure(
    case: str, variant: str, caches: Path, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "AIRGRAPH_CACHE_DIR": str(caches / "airgraph"),
        **(env or {}),
    }
    done = run_worker([case, variant.split()[0], *(extra or [])], env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shown = {k: result[k] for k in ("from_start_s", "first_call_s") if k in result}
    print(f"  {case:7s} {variant:20s} {json.dumps(shown)}", flush=True)
    return result


def phases(profile: Path) -> dict[str, float]:
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    found = {}
    for label, name, where in PHASES:
        seconds = [ct for (path, _, fn), (_, _, _, ct, _) in stats.items() if fn == name and where in path]
        found[label] = round(max(seconds, default=0.0), 3)
    found["dynamo_tracing_alone"] = round(found["dynamo_compile"] - found["backend_call"], 3)
    return found


def imported_after_torch(case: str, variant: str, caches: Path, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """``-X importtime``: the modules the process imported itself after ``import torch`` (cumulative seconds,
    the largest), and the seconds of airgraph's own modules (their self times, summed)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "AIRGRAPH_CACHE_DIR": str(caches / "airgraph")}
    env.update(extra or {})
    done = run_worker([case, variant], env, python=[sys.executable, "-X", "importtime"])
    rows = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if match:
            own, cum = int(match.group(1)) / 1e6, int(match.group(2)) / 1e6
            rows.append((own, cum, len(match.group(3)) // 2, match.group(4)))
    after = rows[next(i for i, r in enumerate(rows) if r[3] == "torch" and r[2] == 0) + 1 :]
    top = sorted(((name, cum) for _, cum, depth, name in after if depth == 0), key=lambda item: -item[1])
    return {
        "top_level_s": {name: round(cum, 3) for name, cum in top[:15]},
        "total_s": round(sum(cum for _, cum in top), 3),
        "airgraph_modules_self_s": round(sum(own for own, _, _, name in after if name.startswith("airgraph")), 3),
    }


def static_kernels(work: Path, rounds: int, profile: bool) -> dict[str, Any]:
    """The static kernels' warm start: the library built once (benchmarks/static_kernels_worker.py, batches 2, 3
    and 4), then per round a cold process (empty library: dynamic kernels compiled, empty caches) and a warm one
    (the library installed, empty caches), both from process start to the decode step's first output (batch 2)."""
    build = run_worker(
        ["build", "--build-dir", str(work / "build"), "--preset", "tiny", "--batches", "2,3,4"],
        {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-build"), "AIRGRAPH_CACHE_DIR": str(work / "ag-build")},
        script=STATIC_WORKER,
    )
    print(f"  static  build                {build.stdout.strip().splitlines()[-1][:80]}", flush=True)

    def one(tag: str, library: Path, extra: list[str] | None = None) -> dict[str, Any]:
        env = {
            "AIRGRAPH_STATIC_KERNELS": "1",
            "AIRGRAPH_STATIC_KERNELS_BUILD": "0",
            "AIRGRAPH_STATIC_KERNELS_BUILD_DIR": str(work / tag),
            "AIRGRAPH_KERNEL_LIBRARY": str(library),
        }
        return measure("decode", f"airgraph {tag}", work / f"caches-{tag}", extra, env)

    cold, warm = [], []
    for r in range(rounds):
        cold.append(one(f"cold-{r}", work / f"empty-{r}"))
        warm.append(one(f"warm-{r}", work / "build" / "static_kernel_library"))
    result: dict[str, Any] = {
        "cold_from_start_s": round(statistics.median(r["from_start_s"] for r in cold), 3),
        "warm_from_start_s": round(statistics.median(r["from_start_s"] for r in warm), 3),
        "warm_first_call_s": round(statistics.median(r["first_call_s"] for r in warm), 3),
        "warm_chosen_by": warm[-1].get("chosen_by"),
        "warm_aot_autograd_traces": [r["aot_autograd_traces"] for r in warm],
        "max_abs_diff": max(r["max_abs_diff"] for r in cold + warm),
    }
    result["warm_over_cold_from_start"] = round(result["warm_from_start_s"] / result["cold_from_start_s"], 3)
    if profile:
        path = work / "static-warm.prof"
        one("warm-prof", work / "build" / "static_kernel_library", ["--profile", str(path)])
        result["warm_profile_s"] = phases(path)
        env = {
            "AIRGRAPH_STATIC_KERNELS": "1",
            "AIRGRAPH_STATIC_KERNELS_BUILD": "0",
            "AIRGRAPH_STATIC_KERNELS_BUILD_DIR": str(work / "warm-imports"),
            "AIRGRAPH_KERNEL_LIBRARY": str(work / "build" / "static_kernel_library"),
        }
        result["warm_imports"] = imported_after_torch("decode", "airgraph", work / "caches-warm-imports", env)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", default=None, help="default: gpt2,mixer,llama,mixer3 (cpu), decode-cuda (cuda)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-static", action="store_true", help="leave out the static kernels' warm start")
    parser.add_argument("--no-profile", action="store_true", help="leave out the profiled processes")
    parser.add_argument("--output", default=None, help="default: benchmarks/results/warm_start_<device>.json")
    parser.add_argument("--keep", default=None, help="keep the caches in this folder (default: a temporary one)")
    parser.add_argument("--variants", default=None, help="a comma-separated subset of VARIANTS (eager always runs)")
    args = parser.parse_args()
    cases = (args.cases or ("decode-cuda" if args.device == "cuda" else "gpt2,mixer,llama,mixer3")).split(",")
    output = args.output or str(ROOT / "benchmarks" / "results" / f"warm_start_{args.device}.json")
    if args.device == "cuda":  # the static kernels' and the profiles' cases are the CPU's
        args.no_static = args.no_profile = True
    work = Path(args.keep or tempfile.mkdtemp(prefix="airgraph-warm-start-"))
    load_before = os.getloadavg()
    started = time.perf_counter()
    variants = VARIANTS if args.variants is None else ("eager", *(v for v in args.variants.split(",") if v != "eager"))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    orphans = [v for v in variants if v.endswith(" warm") and v.replace(" warm", " cold") not in variants]
    if orphans:
        parser.error(f"--variants: {', '.join(orphans)} need their cold variant (its process fills the caches)")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {c: {v: [] for v in variants} for c in cases}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for case in cases:
            tc, ag, cc = work / f"{case}-tc-{r}", work / f"{case}-ag-{r}", work / f"{case}-cc-{r}"
            for variant in variants:
                caches = {"eager": work / "eager", "torch.compile": tc, "airgraph": ag, "cache_compile": cc}
                caches = caches[variant.split()[0]]
                rows[case][variant].append(measure(case, variant, caches))
    table: dict[str, Any] = {}
    for case in cases:
        medians = {v: round(statistics.median(r["from_start_s"] for r in rows[case][v]), 3) for v in variants}
        eager = medians["eager"]
        table[case] = {
            "from_start_s": medians,
            "over_eager": {v: round(s / eager, 3) for v, s in medians.items() if v != "eager"},
            "first_call_s": {
                v: round(statistics.median(r["first_call_s"] for r in rows[case][v]), 3) for v in variants
            },
            "max_abs_diff": max(r["max_abs_diff"] for v in variants for r in rows[case][v]),
            **(
                {
                    "first_replay_s": {
                        v: round(statistics.median(r["first_replay_s"] for r in rows[case][v]), 3) for v in variants
                    },
                    "first_replay_over_eager_first_output": {
                        v: round(statistics.median(r["first_replay_s"] for r in rows[case][v]) / eager, 3)
                        for v in variants
                        if v != "eager"
                    },
                }
                if case.endswith("-cuda")
                else {}
            ),
            "warm_process": {
                v: rows[case][v][-1]
                for v in ("airgraph warm", "torch.compile warm", "cache_compile warm")
                if v in rows[case]
            },
        }
    profiles: dict[str, Any] = {}
    if not args.no_profile and {"airgraph warm", "torch.compile warm"} <= set(variants):
        print("where the time goes (cProfile, -X importtime)", flush=True)
        for case in [c for c in cases if c in ("gpt2", "mixer")]:
            profiles[case] = {}
            for variant, caches in (("airgraph", work / f"{case}-ag-0"), ("torch.compile", work / f"{case}-tc-0")):
                path = work / f"{case}-{variant}.prof"
                measure(case, f"{variant} warm", caches, ["--profile", str(path)])
                profiles[case][f"{variant} warm"] = {
                    "phases_s": phases(path),
                    "imports_after_torch_s": imported_after_torch(case, variant, caches),
                }
    static = None
    if not args.no_static:
        print("static kernels' warm start (tiny LLaMA decode)", flush=True)
        static = static_kernels(work / "static", args.rounds, profile=not args.no_profile)
    data = {
        **environment(torch.device(args.device)),
        "benchmark": "warm_start",
        "settings": {"rounds": args.rounds, "cases": cases, "variants": list(variants), "threads": 1, "grad": False},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "wall_s": round(time.perf_counter() - started, 1),
        "cases": table,
        "static_kernels": static,
        "profiles": profiles,
        "targets": {
            "warm_over_eager": "a warm airgraph process's first output at most 1.5x eager's (gpt2, mixer; held out: "
            "llama, mixer3): torch.compile with the airgraph backend, and airgraph.cache_compile",
            "static_kernels_warm_over_cold": "at most 0.15 from process start",
            "cuda": "the small preset's reduce-overhead decode: a warm process's first replayed step at most 2x "
            "eager's first step, from process start (first_replay_over_eager_first_output)",
        },
    }
    path = write_json(data, output)
    print(json.dumps({c: t["over_eager"] for c, t in table.items()}, indent=2))
    if static is not None:
        print("static kernels warm / cold:", static["warm_over_cold_from_start"])
    print(f"wrote {path}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
