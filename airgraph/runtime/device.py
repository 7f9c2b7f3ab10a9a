"""The device runtime: the streams, events and graph captures that the executor and GraphCapture use.

The executor (multi-stream graphs) and :class:`~airgraph.runtime.capture.GraphCapture` (reduce-overhead) call
the device through one small object instead of ``torch.cuda`` directly. :data:`CUDA` is the real one. The
other is :class:`airgraph.runtime.simulated.SimulatedCuda`: streams, events and graphs simulated on the CPU
with a happens-before checker, so the CUDA-only logic (forks, joins, waits, lifetimes, capture and replay)
runs and is checked for races on a machine without a GPU.

A runtime has:

- ``current_stream(device)``, ``side_stream(tag, device, priority)`` (same tag and device, same stream),
  ``new_stream(device)``, ``use(stream)`` (a context manager making it current), ``new_event()``; streams
  have ``wait_stream(other)`` and ``wait_event(event)``, events ``record(stream)``;
- ``record_stream(tensor, stream)``, ``synchronize(device)``;
- ``pool_handle()``, ``static_buffer(tensor)`` (an input buffer for a captured graph) and
  ``capture(fn, args, pool=, stream=, device=)`` -> ``(graph, outputs)``; graphs have ``replay()``;
- ``wrap_segment(segment, fn)``: the callable the executor calls for a lowered segment (the real runtime
  returns ``fn`` itself; the simulator records what the segment reads and writes); ``copy_(dst, src)`` and
  ``reading(values)`` for GraphCapture's own copies around a replay (checked the same way).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from airgraph import ops
from airgraph.ops import cuda_index

__all__ = ["CUDA", "CudaRuntime"]


class CudaRuntime:
    """CUDA itself (see the module docstring for the interface)."""

    name = "cuda"

    def current_stream(self, device: torch.device | None = None) -> torch.cuda.Stream:
        return torch.cuda.current_stream(cuda_index(device))

    def side_stream(self, tag: str, device: torch.device | None = None, priority: int = 0) -> torch.cuda.Stream:
        return ops.stream_for(tag, device, priority)

    def new_stream(self, device: torch.device | None = None) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=cuda_index(device))

    def use(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        if tensor.is_cuda:
            tensor.record_stream(stream)

    def synchronize(self, device: torch.device | None = None) -> None:
        torch.cuda.synchronize(cuda_index(device))

    def pool_handle(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def static_buffer(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    def capture(
        self, fn: Callable[[list], Any], args: list, *, pool: Any, stream: torch.cuda.Stream, device: torch.device
    ) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Record ``fn(args)`` on ``stream`` into a new CUDA graph allocating from ``pool``.

        As ``torch.cuda.graph`` does, but the caller's stream is restored and the allocator's capture is
        ended on every path: when ``fn`` raises or the capture is invalidated (an op that cannot be captured),
        ``torch.cuda.graph`` would leave the thread on the capture stream and the pool open. Errors are
        ``thread_local`` (as CUDAGraph Trees use): CUDA calls of other threads (a DataLoader's pinning
        thread) are not affected by the capture.
        """
        index = cuda_index(device)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(index)
        with torch.cuda.stream(stream):
            graph.capture_begin(pool, capture_error_mode="thread_local")
            try:
                outputs = fn(args)
            except BaseException:
                with contextlib.suppress(Exception):  # end the capture; fn's error is the one to raise
                    _end_capture(graph, index, pool)
                raise
            _end_capture(graph, index, pool)
        return graph, outputs

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]:
        return fn

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def reading(self, values: Any) -> None:
        """``values`` are about to be read on the current stream (the simulator checks; nothing to do here)."""


def _end_capture(graph: torch.cuda.CUDAGraph, index: int, pool: Any) -> None:
    """``graph.capture_end()``. When it fails (an invalidated capture), it has skipped its own clean-up, which
    is done here: the allocator's capture into ``pool`` is ended, and the default generator's shared state
    is taken out of capture mode (in torch 2.11 ``capture_begin`` sets a flag on it that only a successful
    ``capture_end`` clears; left set, every later random op and every replay of another graph using random
    numbers fails). An empty capture on the same stream runs that begin/end pair on the same state, without
    moving its offset or replacing the state object other graphs hold."""
    try:
        graph.capture_end()
    except BaseException:
        with contextlib.suppress(Exception):  # not open any more: nothing to end
            torch._C._cuda_endAllocateToPool(index, pool)
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the CUDA graph is empty"
            reset = torch.cuda.CUDAGraph()
            reset.capture_begin(capture_error_mode="thread_local")
            reset.capture_end()
        raise


CUDA = CudaRuntime()
