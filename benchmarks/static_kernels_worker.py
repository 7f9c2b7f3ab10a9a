"""One measurement of benchmarks/static_kernels.py, in a fresh process (the driver runs this file per measurement).

    python benchmarks/static_kernels_worker.py WHAT --build-dir DIR [--batches 2,3,4] ...

WHAT:
- ``build``: airgraph with static kernels on: the decode step at each batch size, every kernel built, packaged
  and installed (the first run of a model);
- ``airgraph``: airgraph with static kernels on and building off: the library has the kernels (warm) or not
  (cold: dynamic kernels, compiled);
- ``inductor``: airgraph without static kernels (dynamic kernels by Inductor); with the cache of an earlier
  process, its ``compile_fx_inner`` loads Inductor's cached output code and compiled objects;
- ``torch.compile``: torch.compile's own default (Inductor), with its caches (TORCHINDUCTOR_CACHE_DIR, set by the
  driver) empty (cold) or filled by an earlier process (warm);
- ``latency``: in this one process, the decode step with static kernels (the library) and with dynamic kernels
  (static kernels off), per batch size, steps interleaved.

Prints one JSON line: seconds from the start of this script (before ``import torch``) to the first output, from
the first call to the first output, and to the first output of every batch size; the graphs Inductor lowered
(``GraphLowering``: dynamic kernels and static builds alike), the seconds of each ``compile_fx_inner`` (with a warm
cache: loading Inductor's cached output code), of each static kernel load, and the largest difference from eager.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
from torch._inductor.graph import GraphLowering  # noqa: E402

IMPORTED = time.perf_counter()
LOWERED: list[float] = []  # seconds of each compile_fx_inner: Inductor compiling one graph, or loading it cached
_original = compile_fx.compile_fx_inner


def _timed(*args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    try:
        return _original(*args, **kwargs)
    finally:
        LOWERED.append(time.perf_counter() - start)


compile_fx.compile_fx_inner = _timed
LOWERINGS: list[int] = []  # graphs Inductor lowered (GraphLowering made): dynamic kernels and static builds alike
_lowering_init = GraphLowering.__init__


def _counted(self: Any, *args: Any, **kwargs: Any) -> None:
    LOWERINGS.append(1)
    _lowering_init(self, *args, **kwargs)


GraphLowering.__init__ = _counted
LOADED: list[float] = []  # seconds of each static kernel loaded from the library (digests checked, package loaded)


def _time_loads() -> None:
    from airgraph.kernels.static import StaticKernels

    load = StaticKernels.load

    def timed(self: Any, *args: Any) -> Any:
        start = time.perf_counter()
        kernel = load(self, *args)
        if kernel is not None and kernel.kid not in self._timed:
            self._timed.add(kernel.kid)
            LOADED.append(time.perf_counter() - start)
        return kernel

    StaticKernels._timed = set()
    StaticKernels.load = timed


def model_and_inputs(preset: str, batches: list[int]) -> tuple[Any, Any, dict[int, tuple]]:
    from airgraph.models import build_tiny_llama, decode_inputs

    model = build_tiny_llama(preset, max_batch_size=max(batches))
    reference = build_tiny_llama(preset, max_batch_size=max(batches))
    calls = {b: decode_inputs(model.config, b, 8, seed=b) for b in batches}
    return model, reference, calls


def config(args: argparse.Namespace, *, build: bool, enabled: bool = True) -> Any:
    from airgraph.config import CompilerConfig

    cfg = CompilerConfig()
    cfg.static_kernels.enabled = enabled
    cfg.static_kernels.build_dir = args.build_dir
    cfg.static_kernels.build = build
    if args.library:
        cfg.static_kernels.library_dir = args.library
    return cfg


def first_outputs(compiled: Any, reference: Any, calls: dict[int, tuple]) -> dict[str, Any]:
    """Seconds from the first call to each batch size's first output, and the largest difference from eager."""
    first = time.perf_counter()
    seconds, diffs = {}, []
    with torch.no_grad():
        for batch, inputs in calls.items():
            out = compiled(*inputs)
            seconds[str(batch)] = time.perf_counter() - first
            diffs.append((out - reference(*inputs)).abs().max().item())
    return {
        "from_start_s": first - START + seconds[next(iter(seconds))],
        "import_s": IMPORTED - START,
        "first_output_s": seconds[next(iter(seconds))],
        "all_batches_s": seconds,
        "max_abs_diff": max(diffs),
    }


def latency(args: argparse.Namespace, batches: list[int]) -> dict[str, Any]:
    from airgraph.backend import get_backend

    model, reference, calls = model_and_inputs(args.preset, batches)
    modes = {
        "static": torch.compile(model, backend=get_backend(config(args, build=False)), dynamic=True),
        "dynamic": torch.compile(model, backend=get_backend(config(args, build=False, enabled=False)), dynamic=True),
    }
    samples: dict[str, dict[int, list[float]]] = {m: {b: [] for b in batches} for m in modes}
    with torch.no_grad():
        for fn in modes.values():  # compile and warm up
            for inputs in calls.values():
                for _ in range(3):
                    fn(*inputs)
        for _ in range(args.rounds):
            for batch, inputs in calls.items():
                for mode, fn in modes.items():
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        fn(*inputs)
                    samples[mode][batch].append((time.perf_counter() - start) / args.steps * 1e3)
        diffs = {m: max((fn(*c) - reference(*c)).abs().max().item() for c in calls.values()) for m, fn in modes.items()}
    median = {m: {str(b): round(statistics.median(v), 4) for b, v in s.items()} for m, s in samples.items()}
    return {"per_step_ms": median, "max_abs_diff": diffs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["build", "airgraph", "inductor", "torch.compile", "latency"])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--library", default=None)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batches", default="2,3,4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)  # the driver's other measurements run beside nothing, but a 2-core machine is shared
    if args.what == "latency":
        result = latency(args, batches)
    else:
        model, reference, calls = model_and_inputs(args.preset, batches)
        if args.what == "torch.compile":
            compiled = torch.compile(model, dynamic=True)
            backend = None
        else:
            from airgraph.backend import get_backend

            _time_loads()
            backend = get_backend(config(args, build=args.what == "build", enabled=args.what != "inductor"))
            compiled = torch.compile(model, backend=backend, dynamic=True)
        result = first_outputs(compiled, reference, calls)
        if backend is not None and backend.reports:
            segments = [s for r in backend.reports for s in r.segments]
            result["static_keys"] = sorted({k for s in segments for k in s.source.get("static_keys", [])})
            result["dynamic_keys"] = sorted({k for s in segments for k in s.source.get("dynamic_keys", [])})
            if args.what == "build":
                result["package"] = str(backend.static_kernels.recorder.package_path())
    result["static_kernel_load_s"] = [round(s, 4) for s in LOADED]
    result["inductor_lowerings"] = len(LOWERINGS)
    result["compile_fx_inner_s"] = [round(s, 3) for s in LOWERED]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
