"""Timing a call's kernels on CUDA as a replayed CUDA graph runs them: the tuner's clock in reduce-overhead.

``CudaRuntime.time`` puts CUDA events around each call: from the call's enqueue to its last kernel, the host
launching its kernels included. A replayed graph launches nothing from the host: its kernels run back to back.
:func:`device_time` times that:

- **launches hidden**: before each call the stream spins (``torch.cuda._sleep``) for twice as long as the host
  takes to enqueue one call, so the call's start event, kernels and end event are all queued when the device
  reaches them;
- **L2 flushed** where asked (``flush_l2``): a buffer twice the L2 cache is overwritten before each call, as a
  decode step's layer finds its weights in HBM once the other layers' weights passed through L2 (the tuner asks
  where the graph's inputs outgrow L2: tuning/measure.py ``DeviceClock``).

Each call starts from an idle device (synchronized), as ``CudaRuntime.time``'s do.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["device_time", "l2_bytes"]

SPIN_MARGIN_S = 20e-6  # spun beyond twice the host's enqueue time


def l2_bytes(index: int) -> int:
    """The L2 cache of CUDA device ``index``, in bytes (64 MiB where torch does not say)."""
    return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 64 << 20)


@functools.cache
def _flush_buffer(index: int) -> torch.Tensor:
    return torch.empty(2 * l2_bytes(index), dtype=torch.uint8, device=torch.device("cuda", index))


@functools.cache
def _spin_cycles_per_second(index: int) -> float:
    """How many cycles ``torch.cuda._sleep`` spins per second on device ``index`` (measured once)."""
    with torch.cuda.device(index):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / max(start.elapsed_time(end) / 1e3, 1e-9)


def device_time(fn: Callable[[list], Any], args: list, iters: int, *, flush_l2: bool = False) -> float:
    """Median seconds of ``fn(list(args))``'s kernels over ``iters`` calls after a warm-up call, the host's
    launching hidden (module docstring); ``flush_l2``: each call finds the L2 cache overwritten."""
    index = torch.cuda.current_device()
    fn(list(args))  # warm-up
    torch.cuda.synchronize(index)
    start = time.perf_counter()
    fn(list(args))  # how long the host takes to enqueue one call (it returns before the device is done)
    enqueue_s = time.perf_counter() - start
    torch.cuda.synchronize(index)
    spin = int(_spin_cycles_per_second(index) * (2 * enqueue_s + SPIN_MARGIN_S))
    flush = _flush_buffer(index) if flush_l2 else None
    stream = torch.cuda.current_stream(index)
    times = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()
        torch.cuda._sleep(spin)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        fn(list(args))
        end.record(stream)
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)
