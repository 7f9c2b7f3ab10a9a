"""The device runtime: the streams, events and graph captures that the executor and GraphCapture use.

The executor (multi-stream graphs) and :class:`~airgraph.runtime.capture.GraphCapture` (reduce-overhead) call
the device through one small object instead of ``torch.cuda`` directly. :data:`CUDA` is the real one. The
other is :class:`airgraph.runtime.simulated.SimulatedCuda`: streams, events and graphs simulated on the CPU
with a happens-before checker, so the CUDA-only logic (forks, joins, waits, lifetimes, capture and replay)
runs and is checked for races on a machine without a GPU.

Every runtime implements :class:`DeviceRuntime` (a typed Protocol): :data:`CUDA`, :data:`CPU` (no device
streams and no graphs: the executor runs segments in order; ``time`` is ``perf_counter``) and the simulator.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from airgraph import ops
from airgraph.ops import cuda_index

__all__ = ["CPU", "CUDA", "CpuRuntime", "CudaRuntime", "DeviceRuntime", "runtime_for"]


@runtime_checkable
class DeviceRuntime(Protocol):
    """What the executor, GraphCapture and the tuner ask of a device."""

    has_streams: bool  # side streams are real (segments split at stream changes, the executor forks and joins)
    can_capture: bool  # reduce-overhead records graphs and replays them

    # -- streams and events: streams have wait_stream(other) and wait_event(event); events record(stream)
    def current_stream(self, device: torch.device | None = None) -> Any: ...
    def side_stream(self, tag: str, device: torch.device | None = None, priority: int = 0) -> Any:
        """Same tag and device, same stream."""

    def new_stream(self, device: torch.device | None = None) -> Any: ...
    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        """Make ``stream`` current for the duration."""

    def new_event(self) -> Any: ...
    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None: ...

    # -- graphs and their memory pool: graphs have replay()
    def pool_handle(self) -> Any: ...
    def static_buffer(self, t: torch.Tensor) -> torch.Tensor:
        """An input buffer for a captured graph, laid out like ``t``."""

    def capture(self, fn: Callable[[list], Any], args: list, *, pool: Any, stream: Any, device: torch.device) -> tuple:
        """Record ``fn(args)`` into a new graph allocating from ``pool``: ``(graph, outputs)``."""

    # -- checked work: the simulator records what each call reads and writes; the real runtimes just do it
    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]: ...
    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    def reading(self, values: Any) -> None: ...

    # -- measuring a candidate (tuning)
    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """Median seconds of one ``fn(list(args))`` call over ``iters`` calls, after one warm-up call."""


class CudaRuntime:
    """CUDA itself (see :class:`DeviceRuntime`)."""

    has_streams = True
    can_capture = True

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

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """CUDA events around each call on the current stream: device time, not the host's."""
        fn(list(args))
        times = []
        stream = torch.cuda.current_stream()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn(list(args))
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)


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


class _NoStream:
    """The CPU's one stream: work is ordered by program order, so there is nothing to wait for."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


class _NoEvent:
    def record(self, stream: Any = None) -> None:
        pass


class CpuRuntime:
    """The CPU: one implicit stream, no graphs (reduce-overhead runs the executor uncaptured)."""

    has_streams = False
    can_capture = False
    _stream = _NoStream()

    def current_stream(self, device: torch.device | None = None) -> _NoStream:
        return self._stream

    def side_stream(self, tag: str, device: torch.device | None = None, priority: int = 0) -> _NoStream:
        return self._stream

    def new_stream(self, device: torch.device | None = None) -> _NoStream:
        return self._stream

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def new_event(self) -> _NoEvent:
        return _NoEvent()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        pass

    def pool_handle(self) -> None:
        return None

    def static_buffer(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    def capture(self, fn: Callable[[list], Any], args: list, *, pool: Any, stream: Any, device: torch.device) -> tuple:
        raise RuntimeError("the CPU records no graphs: reduce-overhead runs the executor uncaptured there")

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]:
        return fn

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def reading(self, values: Any) -> None:
        pass

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """``perf_counter`` around each call (the CPU runs it synchronously)."""
        fn(list(args))
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn(list(args))
            times.append(time.perf_counter() - start)
        return statistics.median(times)


CUDA = CudaRuntime()
CPU = CpuRuntime()


def runtime_for(device: torch.device, override: DeviceRuntime | None = None) -> DeviceRuntime:
    """The runtime a graph on ``device`` runs with: ``override`` (the simulator, in tests) for CPU and CUDA graphs,
    else CUDA's on CUDA and the CPU's elsewhere."""
    if override is not None and device.type in ("cpu", "cuda"):
        return override
    return CUDA if device.type == "cuda" else CPU
