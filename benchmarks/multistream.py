"""Multi-stream benchmark (issue #3): two independent branches, on side streams vs on one stream.

Targets (GPU, reduce-overhead): small branches (each well under half the SMs): one-stream / two-stream
latency >= 1.3x (aim 1.4x); branches that saturate the GPU: two streams at most 3% slower. On the CPU there
are no device streams; both variants run the same ordered executor (recorded for completeness).

    python benchmarks/multistream.py [--device auto] [--mode reduce-overhead] [--output PATH]
"""

from __future__ import annotations

import argparse

from rich.console import Console

from airgraph.bench.results import write_json
from airgraph.bench.streams import CASES, multistream_table, run_multistream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--mode", default="reduce-overhead", choices=["max-autotune", "reduce-overhead"])
    parser.add_argument("--kernel-backend", default="inductor", choices=["inductor", "aten"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--cases", default=None, help="comma list of: " + ", ".join(CASES))
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    result = run_multistream(
        device=args.device,
        mode=args.mode,
        kernel_backend=args.kernel_backend,
        steps=args.steps,
        cases=args.cases.split(",") if args.cases else None,
    )
    Console().print(multistream_table(result))
    output = args.output or f"benchmarks/results/multistream_{result['settings']['device_type']}.json"
    write_json(result, output)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
