"""One process of the compile cache's tests: a small mixer compiled by airgraph, run once, compared with eager.

    python tests/cache/worker.py [--blocks 2] [--activation gelu] [--seed 0] [--batch 2] [--mode max-autotune]
                                 [--backend aten] [--barrier DIR] [--device cpu]

The compile cache is the one ``AIRGRAPH_CACHE_DIR`` names (the tests set it). Prints one JSON line: AOTAutograd's
traces, the graphs Inductor lowered (``GraphLowering`` made) and its FX graph cache hits, each compiled graph's
``compile_cache`` report, the backend's cache counts, the largest difference from eager and the output's sum.
``--barrier DIR``: before writing its entry the process waits until two processes have reached that point (two
writers of one entry at once).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

LOWERINGS: list[int] = []


def _count_lowerings() -> None:
    from torch._inductor.graph import GraphLowering

    init = GraphLowering.__init__

    def counted(self, *args, **kwargs) -> None:
        LOWERINGS.append(1)
        init(self, *args, **kwargs)

    GraphLowering.__init__ = counted


def _barrier(folder: Path) -> None:
    from airgraph.cache.folder import CacheFolder

    write = CacheFolder.write

    def waiting(self, *args, **kwargs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(folder.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return write(self, *args, **kwargs)

    CacheFolder.write = waiting


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--activation", default="gelu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--mode", default="max-autotune")
    parser.add_argument("--backend", default="aten")
    parser.add_argument("--barrier", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.backend == "inductor":
        _count_lowerings()
    if args.barrier:
        _barrier(Path(args.barrier))
    import airgraph
    from airgraph.models.mixer import MlpMixer

    sizes = {"tokens": 8, "channels": 16, "token_hidden": 16, "channel_hidden": 32}
    model = MlpMixer(blocks=args.blocks, seed=args.seed, activation=args.activation, **sizes).eval().to(args.device)
    config = airgraph.CompilerConfig()
    config.mode, config.kernel_backend = args.mode, args.backend
    backend = airgraph.get_backend(config)
    compiled = torch.compile(model, backend=backend)
    x = model.example_input(args.batch).to(args.device)
    with torch.no_grad():
        out = compiled(x)
        for _ in range(2):  # reduce-overhead: warmed up, then captured and replayed
            out = compiled(x)
        diff = (out - model(x)).abs().max().item()
    from torch._dynamo.utils import counters

    print(
        json.dumps(
            {
                "aot_traces": counters["aot_autograd"]["total"],
                "lowerings": len(LOWERINGS),
                "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
                "reports": [r.compile_cache for r in backend.reports],
                "frozen": [len(r.frozen_parameters) for r in backend.reports],
                "captured": [r.captured for r in backend.reports],
                "counts": dict(backend.compile_cache.counts),
                "max_abs_diff": diff,
                "sum": out.sum().item(),
            }
        )
    )


if __name__ == "__main__":
    main()
