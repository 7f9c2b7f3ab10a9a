"""Offline export benchmark (issue #5): tiny LLaMA prefill, torch eager on the CPU vs onnxruntime on the export.

Exports the model twice with ``airgraph.dynamo_export`` (static shapes, and ``dynamic=True``), reports each
export's time (capture, convert, write), then times one prefill call (tokens [B, S], input_pos [S], from
empty KV caches) in torch eager and in onnxruntime (CPU provider) on both exports, interleaved over rounds,
with the same number of threads for both. Target: eager / onnxruntime >= 1.0. Outputs are checked against
eager first.

    python benchmarks/export_llama.py [--preset tiny] [--batch 2] [--seq-len 8] [--threads 1] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import airgraph
from airgraph.bench.results import environment, write_json
from airgraph.models import build_tiny_llama, prefill_inputs


def per_call_ms(fn: Callable[[], object], reps: int) -> float:
    """Mean time of ``reps`` back-to-back calls, in milliseconds."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch and onnxruntime intra-op threads")
    parser.add_argument("--reps", type=int, default=200, help="calls per timing sample")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds over all candidates")
    parser.add_argument("--output", default="benchmarks/results/export_llama_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_tiny_llama(args.preset, max_batch_size=max(args.batch, 2))
    tokens, pos = prefill_inputs(model.config, args.batch, args.seq_len)
    feeds = {"tokens": tokens.numpy(), "input_pos": pos.numpy()}

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    exports, sessions = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("static", "dynamic"):
            result = airgraph.dynamo_export(
                tokens, pos, model=model, export_path=Path(tmp) / kind, dynamic=kind == "dynamic"
            )
            meta = result.metadata
            exports[kind] = {
                "export_s": meta["timings_s"],
                "model_bytes": result.model_path.stat().st_size,
                "inputs": meta["inputs"],
                "dynamic_dims": meta["dynamic_dims"],
                "opset": meta["opset"],
            }
            sessions[f"onnxruntime ({kind} export)"] = ort.InferenceSession(
                str(result.model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )

    with torch.no_grad():
        model.reset_caches()
        expected = model(tokens, pos).numpy()
        candidates: dict[str, Callable[[], object]] = {"torch eager": lambda: model(tokens, pos)}
        for name, session in sessions.items():
            got = session.run(None, feeds)[0]
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
            candidates[name] = lambda s=session: s.run(None, feeds)
        for fn in candidates.values():  # warm-up
            for _ in range(max(10, args.reps // 10)):
                fn()
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, fn in candidates.items():
                samples[name].append(per_call_ms(fn, args.reps))
    medians = {name: statistics.median(v) for name, v in samples.items()}
    eager = medians["torch eager"]
    ratios = {f"eager / {name}": eager / ms for name, ms in medians.items() if name != "torch eager"}
    report = {
        **environment(torch.device("cpu")),
        "benchmark": "export_llama",
        "settings": {
            "preset": args.preset,
            "phase": "prefill from empty KV caches",
            "batch": args.batch,
            "seq_len": args.seq_len,
            "threads": args.threads,
            "reps": args.reps,
            "rounds": args.rounds,
            "onnxruntime": ort.__version__,
        },
        "exports": exports,
        "per_call_ms": medians,
        "ratios": ratios,
        "targets": {f"eager / {name}": 1.0 for name in sessions},
    }
    for kind, info in exports.items():
        t = info["export_s"]
        print(
            f"{kind:8s} export {t['total']:6.2f} s (capture {t['capture']:.2f}, convert {t['convert']:.2f}, "
            f"write {t['write']:.3f}), model {info['model_bytes'] / 2**20:.2f} MiB"
        )
    for name, ms in medians.items():
        print(f"{name:32s} {ms:8.3f} ms/prefill")
    for name, value in ratios.items():
        print(f"{name:50s} {value:.2f}")
    path = write_json(report, args.output)
    print(f"wrote {path}")
    return 0 if all(v >= 1.0 for v in ratios.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
