"""Would CPU worker threads for stream segments pay off? (issue #3: "if running stream segments on worker
threads pays off on 2 cores, do it behind an option; measure either way").

The two-branch model's branches (``TwoBranch``: ``depth`` rounds of ``x @ W`` + GELU each, joined by one add)
run in eager PyTorch two ways, side by side in one process, interleaved rounds:

- ``sequential``: left branch, then right branch, on the calling thread;
- ``threaded``: the right branch on a worker thread (a one-thread pool, started once), the left branch on the
  calling thread, then a join. PyTorch's CPU ops release the GIL, so the branches can run on both cores.

``threaded`` is the upper bound of what a thread-per-stream executor could gain on the CPU: the same ops
with nothing added but the hand-off. It is measured with PyTorch's intra-op pool at 1 thread (each op on
one core, so only branch parallelism uses the second core) and at the machine's core count (ops already
parallel inside). For reference the compiled model (airgraph, Inductor kernels: on the CPU the stream
scopes do not split the graph) is timed at the machine's core count.

Each (case, variant, threads) is timed in its own process, the configurations alternating ``--repeats``
times, medians taken: timed in one process, a variant that ran OpenMP regions from a second thread leaves
that thread's OpenMP team spinning, and the variant timed after it on a 2-core machine slows down several
times over (seen here: sequential 0.9 ms -> 5.9 ms), which would measure the order, not the variants.

    python benchmarks/cpu_stream_threads.py [--round-s 0.1] [--rounds 9] [--output PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from rich.console import Console
from rich.table import Table

import airgraph
from airgraph.bench.results import environment, write_json
from airgraph.models.branches import TwoBranch, two_branch_inputs

# (batch, dim, depth): from launch-bound to compute-bound branches.
CASES = {"tiny": (8, 64, 8), "small": (16, 256, 8), "medium": (64, 512, 4), "large": (256, 1024, 4)}


def _time_us(fn: Callable[[], object], round_s: float, rounds: int) -> float:
    """Median over ``rounds`` of the mean time per call in rounds of back-to-back calls lasting about
    ``round_s`` seconds each (the call count is set from the warm-up), in microseconds."""
    start, warm = time.perf_counter(), 0
    while warm < 5 or time.perf_counter() - start < round_s:
        fn()
        warm += 1
    calls = max(3, round(warm * round_s / (time.perf_counter() - start)))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def measure(case: str, variant: str, threads: int, round_s: float, rounds: int) -> float:
    """One variant of one case at ``threads`` intra-op threads, in this process; checked against eager first."""
    batch, dim, depth = CASES[case]
    torch.set_num_threads(threads)
    model = TwoBranch(dim, depth, streams=True).eval()
    x, y = two_branch_inputs(batch, dim)
    branch = TwoBranch._branch
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="airgraph-branch")
    compiled = torch.compile(model, backend=airgraph.get_backend()) if variant == "airgraph" else None

    def sequential() -> torch.Tensor:
        return branch(x, model.left) + branch(y, model.right)

    def threaded() -> torch.Tensor:
        right = pool.submit(branch, y, model.right)
        return branch(x, model.left) + right.result()

    fns = {"sequential": sequential, "threaded": threaded, "airgraph": lambda: compiled(x, y)}
    try:
        with torch.no_grad():
            torch.testing.assert_close(fns[variant](), model(x, y), rtol=1e-4, atol=1e-4)
            return _time_us(fns[variant], round_s, rounds)
    finally:
        pool.shutdown()


def _child(case: str, variant: str, threads: int, round_s: float, rounds: int) -> float:
    """``measure`` in a fresh interpreter (see the module docstring: OpenMP teams outlive the calls)."""
    command = [sys.executable, __file__, "--child", case, variant, str(threads), "--round-s", str(round_s)]
    done = subprocess.run([*command, "--rounds", str(rounds)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def run(round_s: float, rounds: int, repeats: int) -> dict:
    cores = os.cpu_count() or 1
    configs = [(variant, threads) for threads in sorted({1, cores}) for variant in ("sequential", "threaded")]
    configs.append(("airgraph", cores))
    results: dict[str, dict] = {}
    for case, (batch, dim, depth) in CASES.items():
        samples: dict[tuple[str, int], list[float]] = {config: [] for config in configs}
        for _ in range(repeats):  # configurations alternate, one process each
            for variant, threads in configs:
                samples[(variant, threads)].append(_child(case, variant, threads, round_s, rounds))
        row: dict[str, object] = {"batch": batch, "dim": dim, "depth": depth}
        for threads in sorted({1, cores}):
            cell = {
                f"{variant}_us": round(statistics.median(values), 1)
                for (variant, t), values in samples.items()
                if t == threads
            }
            cell["sequential_over_threaded"] = round(cell["sequential_us"] / cell["threaded_us"], 3)
            row[f"intra_op_threads_{threads}"] = cell
        results[case] = row
    return {
        **environment(torch.device("cpu")),
        "benchmark": "cpu_stream_threads",
        "settings": {"round_s": round_s, "rounds": rounds, "repeats": repeats, "cases": CASES},
        "results": results,
        "pays_off": "sequential_over_threaded > 1.0 at the machine's core count (the default intra-op pool)",
    }


def table(result: dict) -> Table:
    cores = os.cpu_count() or 1
    out = Table(title=f"CPU stream segments on worker threads ({result['device']}, torch {result['torch']})")
    for column in ("case b×d×depth", "intra-op", "sequential µs", "threaded µs", "seq/thr", "airgraph µs"):
        out.add_column(column, justify="left" if column.startswith("case") else "right")
    for case, row in result["results"].items():
        for threads in sorted({1, cores}):
            cell = row[f"intra_op_threads_{threads}"]
            out.add_row(
                f"{case} {row['batch']}x{row['dim']}x{row['depth']}",
                str(threads),
                f"{cell['sequential_us']:.1f}",
                f"{cell['threaded_us']:.1f}",
                f"{cell['sequential_over_threaded']:.2f}",
                f"{cell['airgraph_us']:.1f}" if "airgraph_us" in cell else "",
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--round-s", type=float, default=0.1, help="seconds per timed round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration, alternating")
    parser.add_argument("--output", default="benchmarks/results/cpu_stream_threads_cpu.json")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "VARIANT", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        case, variant, threads = args.child
        print(measure(case, variant, int(threads), args.round_s, args.rounds))
        return 0
    result = run(args.round_s, args.rounds, args.repeats)
    Console().print(table(result))
    write_json(result, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
