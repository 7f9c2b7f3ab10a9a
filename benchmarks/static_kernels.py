"""Static kernels (issue #12): warm start, static vs dynamic kernels, build cost, on the tiny LLaMA decode step.

Every measurement runs in a fresh process (benchmarks/static_kernels_worker.py), with its own Inductor cache folder
(``TORCHINDUCTOR_CACHE_DIR``), on the decode step at batch sizes 2, 3 and 4 (``dynamic=True``: one graph, three
shape keys):

1. build: airgraph with static kernels records the three keys and builds, packages and installs their kernels
   (seconds per kernel, package size);
2. warm start, side by side in each round (medians over ``--rounds``):
   - airgraph cold: static kernels on, empty library, building off: the dynamic kernels compile (cold cache);
   - airgraph warm: the same with the library of step 1 installed (and an empty Inductor cache);
   - torch.compile cold: ``torch.compile(model, dynamic=True)``, empty cache;
   - torch.compile warm: the same, a new process reusing the cold run's cache;
   measured from the start of the process (before ``import torch``) to the first output, and from the first call
   to the first output (the compile a user waits for); goal: airgraph warm / cold <= 0.15, and below
   torch.compile's warm / cold;
3. loading compiled code: each static kernel's AOTInductor package, beside Inductor's own output code and
   compiled objects loaded from its cache (a cache hit of the same graph's dynamic compile);
4. per-step latency with static kernels / with dynamic kernels (static kernels off), same process, interleaved
   (goal <= 0.9).

    python benchmarks/static_kernels.py [--rounds 2] [--output benchmarks/results/static_kernels_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from airgraph.bench.results import environment, write_json

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "static_kernels_worker.py"


def run(what: str, work: Path, cache: str, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(work / cache)}
    done = subprocess.run(
        [sys.executable, str(WORKER), what, *extra], capture_output=True, text=True, env=env, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {what} {' '.join(extra)}: {json.dumps({k: v for k, v in result.items() if k.endswith('_s')})}")
    return result


def median(results: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in results), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batches", default="2,3,4")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "static_kernels_cpu.json"))
    parser.add_argument("--workdir", default=None, help="keep the builds and caches here (default: a temp folder)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="airgraph-static-kernels-"))
    common = ["--preset", args.preset, "--batches", args.batches]

    load_before = os.getloadavg()
    print("1. build")
    build = run("build", work, "cache-build", "--build-dir", str(work / "build"), *common)
    library = str(work / "build" / "static_kernel_library")
    package = Path(build["package"])
    with zipfile.ZipFile(package) as archive:
        manifest = json.loads(archive.read("manifest.json"))

    print("2. warm start")
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in ("airgraph cold", "airgraph warm", "tc cold", "tc warm")}
    for r in range(args.rounds):
        cold = run("airgraph", work, f"cache-cold-{r}", "--build-dir", str(work / f"c{r}"), *common)
        rows["airgraph cold"].append(cold)
        rows["airgraph warm"].append(
            run("airgraph", work, f"cache-warm-{r}", "--build-dir", str(work / f"w{r}"), "--library", library, *common)
        )
        rows["tc cold"].append(run("torch.compile", work, f"cache-tc-{r}", "--build-dir", str(work), *common))
        rows["tc warm"].append(run("torch.compile", work, f"cache-tc-{r}", "--build-dir", str(work), *common))

    print("3. loading compiled code: an AOTInductor package vs Inductor's cached output code (the same graph)")
    cached = run("inductor", work, "cache-cold-0", "--build-dir", str(work / "inductor"), *common)

    print("4. per-step latency")
    latency = run("latency", work, "cache-latency", "--build-dir", str(work / "lat"), "--library", library, *common)

    warm_start = {}
    for name, results in rows.items():
        warm_start[name] = {
            "first_output_s": median(results, "first_output_s"),
            "from_start_s": median(results, "from_start_s"),
            "all_batches_s": round(statistics.median(list(r["all_batches_s"].values())[-1] for r in results), 3),
            "import_s": median(results, "import_s"),
            "inductor_lowerings": [r["inductor_lowerings"] for r in results],
            "compile_fx_inner_s": [r["compile_fx_inner_s"] for r in results],
            "static_kernel_load_s": [r.get("static_kernel_load_s", []) for r in results],
            "static_keys": results[-1].get("static_keys"),
            "max_abs_diff": max(r["max_abs_diff"] for r in results),
        }

    def ratio(a: str, b: str, key: str) -> float:
        return round(warm_start[a][key] / warm_start[b][key], 3)

    per_step = latency["per_step_ms"]
    data = {
        **environment(torch.device("cpu")),
        "benchmark": "static_kernels",
        "settings": {"preset": args.preset, "batches": args.batches, "rounds": args.rounds, "threads": 1},
        # The machine is shared: its load average (1, 5, 15 min) before and after the run, for context.
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "build": {
            "kernels": len(manifest["kernels"]),
            "seconds_per_kernel": [k["build_seconds"] for k in manifest["kernels"]],
            "package_bytes": package.stat().st_size,
            "build_process_first_output_s": build["first_output_s"],
            "build_process_all_batches_s": build["all_batches_s"],
        },
        "warm_start": warm_start,
        "ratios": {
            "airgraph_warm_over_cold_first_output": ratio("airgraph warm", "airgraph cold", "first_output_s"),
            "airgraph_warm_over_cold_from_start": ratio("airgraph warm", "airgraph cold", "from_start_s"),
            "airgraph_warm_over_cold_all_batches": ratio("airgraph warm", "airgraph cold", "all_batches_s"),
            "torch_compile_warm_over_cold_first_output": ratio("tc warm", "tc cold", "first_output_s"),
            "torch_compile_warm_over_cold_from_start": ratio("tc warm", "tc cold", "from_start_s"),
            "torch_compile_warm_over_cold_all_batches": ratio("tc warm", "tc cold", "all_batches_s"),
            "static_over_dynamic_per_step": {
                b: round(per_step["static"][b] / per_step["dynamic"][b], 3) for b in per_step["static"]
            },
        },
        "latency": latency,
        "artifact_load_s": {
            "aoti_package_per_kernel": [s for r in rows["airgraph warm"] for s in r["static_kernel_load_s"]],
            "inductor_cached_output_code_per_graph": cached["compile_fx_inner_s"],
            "note": "AOTInductor packages through torch's package loader (digests checked first); Inductor's output "
            "code and compiled objects from its FX graph cache (compile_fx_inner on a cache hit), same graph",
        },
        "targets": {
            "warm_start": "airgraph warm / cold <= 0.15, below torch.compile's warm / cold",
            "static_over_dynamic": "per-step latency static / dynamic <= 0.9 on the CPU",
        },
    }
    path = write_json(data, args.output)
    print(json.dumps(data["ratios"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
