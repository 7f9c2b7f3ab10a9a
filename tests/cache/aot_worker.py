"""One process of ``airgraph.cache_compile``'s tests: a small mixer (or its CUDA copy) run once through
cache_compile, compared with eager.

    python tests/cache/aot_worker.py [--seed 0] [--device cpu]

The compile cache is the one ``AIRGRAPH_CACHE_DIR`` names (the tests set it). Prints one JSON line: how the call
was served (``stats``), whether Dynamo's frame conversion, Inductor's compiler or ``torch.export`` were imported,
the largest difference from eager.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import airgraph
    from airgraph.models.mixer import MlpMixer

    model = MlpMixer(blocks=1, tokens=8, channels=16, token_hidden=16, channel_hidden=32, seed=args.seed)
    model = model.eval().to(args.device)
    x = model.example_input(2).to(args.device)
    fast = airgraph.cache_compile(model)
    with torch.no_grad():
        out = fast(x)
        expected = model(x)
    imported = {name: name in sys.modules for name in ("torch._dynamo.convert_frame", "torch._inductor.compile_fx")}
    imported["torch.export._trace"] = "torch.export._trace" in sys.modules
    print(json.dumps({"stats": fast.stats, "imported": imported, "max_abs_diff": (out - expected).abs().max().item()}))


if __name__ == "__main__":
    main()
