"""The device runtime: the streams, events and graph captures that the executor and GraphCapture use.

The executor (multi-stream graphs) and :class:`~airgraph.runtime.capture.GraphCapture` (reduce-overhead) call
the device through one small object instead of ``torch.cuda`` directly. Every runtime implements
:class:`DeviceRuntime` (a typed Protocol): :data:`CUDA` (:class:`CudaRuntime`, here), :data:`CPU` (no device
streams and no graphs: runtime/cpu.py) and :class:`airgraph.runtime.simulated.SimulatedCuda`, which simulates
streams, events and graphs on the CPU so the CUDA-only logic runs and is checked without a GPU.

Recording a graph follows one protocol, :func:`record`, whatever the runtime: CUDA's and the simulator's graphs
expose the same steps (:class:`Recording`), so the simulator's tests of a capture that fails at each step test the
clean-up CUDA runs.

Invariants: a failed capture leaves the device as it was (the stream out of capture mode, the caching allocator
no longer allocating into the pool and the pool's use count what it was, the default generator out of capture
mode); a capture on the default stream is refused before anything starts; a pool whose capture failed after the
allocators began is reported spent (:attr:`CaptureError.pool_spent`), never recorded into again.
docs/design/capture.md ("The device runtime") says why each holds, as seen on an H100 with torch 2.11.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from airgraph import config, ops
from airgraph.ops import cuda_index
from airgraph.runtime import feeding
from airgraph.runtime.cpu import CPU, CpuRuntime

__all__ = [
    "CPU",
    "CUDA",
    "UNCACHED_ALLOCATOR",
    "CaptureError",
    "CpuRuntime",
    "CudaRuntime",
    "DeviceRuntime",
    "Recording",
    "record",
    "runtime_for",
]

UNCACHED_ALLOCATOR = (
    "the CUDA caching allocator is disabled (PYTORCH_NO_CUDA_MEMORY_CACHING=1 or "
    "torch.cuda.caching_allocator_enable(False)): a CUDA graph's allocations must come from its pool"
)


class _Borrowed:
    def __repr__(self) -> str:
        return "BORROWED"

    def __reduce__(self) -> str:  # a copy (copy.deepcopy, pickle) is the one BORROWED, which `is` compares with
        return "BORROWED"


# In a recorded graph's argument list: a caller's tensor the graph reads or writes in place (a parameter, a buffer,
# a static cache), which the recording does not keep alive (a CUDA graph holds addresses, not tensors): each replay
# runs on the call's own tensor at that position, found at the recorded address (GraphCapture checks it first).
BORROWED = _Borrowed()


# The dtypes CUDA's torch._foreach_copy_ copies in one launch (its kernel's dispatch list, the same in torch 2.11 to
# 2.15); it refuses the others (uint16/32/64, complex32, float8_e8m0fnu, float4, bits: "not implemented"), which
# copy_many is not given (the CPU's foreach copies any dtype, one tensor at a time).
FOREACH_COPY_DTYPES = frozenset(
    getattr(torch, name)
    for name in (
        "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
        "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    )
    if hasattr(torch, name)
)  # fmt: skip


@runtime_checkable
class DeviceRuntime(Protocol):
    """What the executor, GraphCapture, the host split and the tuner ask of a device."""

    has_streams: bool  # side streams are real (segments split at stream changes, the executor forks and joins)
    can_capture: bool  # reduce-overhead records graphs and replays them
    can_feed: bool  # a graph can fill its own input buffers (capture's ``fed``, feed)

    # -- streams and events: streams have wait_stream(other) and wait_event(event); events record(stream)
    def current_stream(self, device: torch.device | None = None) -> Any: ...
    def stream_reader(self, device: torch.device) -> Callable[[], Hashable]:
        """A callable returning an identity of ``device``'s current stream, equal for the same stream, cheaper than
        :meth:`current_stream` (a replay asks it every call; CUDA's stream objects are Python objects made per ask)."""

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

    def capture(
        self,
        fn: Callable[[list], Any],
        args: list,
        *,
        pool: Any,
        stream: Any,
        device: torch.device,
        fed: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> tuple:
        """Record ``fn(args)`` on ``stream`` into a new graph allocating from ``pool``: ``(graph, outputs)``
        (through :func:`record`: on failure the device is left as it was, and the error raised). ``fed`` (only where
        ``can_feed``): (position, source) pairs whose buffer ``args[position]`` the graph fills itself, a copy of
        the bytes of the source :meth:`feed` gives before each replay (recorded from ``source``: runtime/feeding.py)."""

    def feed(self, graph: Any, sources: Sequence[torch.Tensor]) -> None:
        """The sources of ``graph``'s fed buffers (``capture``'s ``fed``, in order) for its next replays: read when a
        replay runs, as a copy launched on the same stream just before it would read them."""

    def replay(self, graph: Any, recorded: list, args: list) -> None:
        """Replay ``graph``, recorded on ``recorded`` (the :data:`BORROWED` ones being ``args``'s now, at the same
        addresses)."""

    def capture_refusal(self, device: torch.device) -> str | None:
        """Why no graph can be captured on ``device`` now (PyTorch would refuse it too), or None."""

    def clear_blas_workspaces(self) -> None:
        """Free cuBLAS's cached per-stream workspaces (the next GEMM on a stream allocates a new one)."""

    # -- host memory and copies: the simulator records what each call reads and writes; the real runtimes do it
    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a value the graph computed) in pinned memory, for an asynchronous host-to-device copy."""

    def pinned_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A new pinned copy of ``t`` (a caller's tensor, which may be written to once the call returns)."""

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]: ...
    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None: ...
    def copy_many(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        """Each of ``srcs`` into its ``dsts`` (same device, dtype and layout; nothing expanded; dtypes of
        :data:`FOREACH_COPY_DTYPES` only): one device op for them all (``torch._foreach_copy_``: on CUDA one kernel
        launch where the dtypes agree, as CUDAGraph Trees copy their inputs), not one per tensor."""

    def run_op(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One device op outside any segment (a host value's copy to the device, in the host split)."""

    def reading(self, values: Any) -> None: ...

    # -- measuring a candidate (tuning)
    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """Median seconds of one ``fn(list(args))`` call over ``iters`` calls, after one warm-up call."""


class CaptureError(RuntimeError):
    """A recording failed (its ``__cause__`` says why) and was cleaned up (:func:`record`). ``pool_spent``: the capture
    got as far as the allocators, so the pinned host allocator still allocates into the pool
    (docs/design/capture.md, "The device runtime"): no graph can be captured into that pool again."""

    def __init__(self, cause: BaseException, *, pool_spent: bool) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.pool_spent = pool_spent


class Recording(Protocol):
    """One graph being recorded, step by step (CUDA's in :class:`_CudaRecording`, the simulator's SimGraph)."""

    def refusal(self) -> str | None:
        """Why ``capture_begin`` would fail on the current stream (the default stream), or None: checked before it
        runs, since PyTorch refuses it only after it flagged the generator."""

    def capture_begin(self) -> None: ...
    def capture_end(self) -> None: ...
    def end_allocate_to_pool(self) -> None:
        """End the allocator's capture into the pool; raises when it is not capturing into it."""

    def release_pool(self) -> None:
        """Give back the use of the pool that ``capture_begin`` took (a graph gives it back when destroyed, once
        its capture ended)."""

    def reset_generator(self) -> None:
        """Take the default generator out of capture mode (on a stream of its own: never the default stream)."""


def record(recording: Recording, fn: Callable[[list], Any], args: list) -> Any:
    """``fn(args)`` recorded into ``recording`` (on the current stream); ``fn``'s outputs.

    A capture PyTorch would refuse at once (:meth:`Recording.refusal`) is not started: :class:`CaptureError`. Every
    other failure, in ``capture_begin`` as much as in ``fn`` or ``capture_end``, is cleaned up and raised as a
    :class:`CaptureError` from it: a stream capture still open is ended; if the allocator still captures into the
    pool, ``capture_begin`` took a use of the pool that no graph will give back (only a graph whose capture ended
    does), so it is ended and given back, and the pool is spent (docs/design/capture.md); the default generator is taken
    out of capture mode. Each clean-up step that finds nothing to do (refused) is skipped."""
    refusal = recording.refusal()
    if refusal is not None:
        raise CaptureError(RuntimeError(refusal), pool_spent=False)
    try:
        recording.capture_begin()
        outputs = fn(args)
        recording.capture_end()
    except BaseException as exc:
        spent = False
        with contextlib.suppress(Exception):
            recording.capture_end()
        try:
            recording.end_allocate_to_pool()
        except Exception:
            pass  # capture_begin failed before the allocator captured into the pool, or capture_end ended it
        else:
            spent = True
            with contextlib.suppress(Exception):
                recording.release_pool()
        with contextlib.suppress(Exception):
            recording.reset_generator()
        if not isinstance(exc, Exception):  # KeyboardInterrupt: cleaned up, and raised as it is
            raise
        raise CaptureError(exc, pool_spent=spent) from exc
    return outputs


class _CudaRecording:
    """A ``torch.cuda.CUDAGraph`` recorded into ``pool`` on device ``index`` (see :class:`Recording`)."""

    def __init__(self, index: int, pool: Any, keep_graph: bool = False) -> None:
        self.index, self.pool = index, pool
        self.graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)

    def refusal(self) -> str | None:
        if torch.cuda.current_stream(self.index) == torch.cuda.default_stream(self.index):
            return "CUDA graphs must be captured on a non-default stream (airgraph refused it before capture_begin)"
        return None

    def capture_begin(self) -> None:
        # thread_local errors (as CUDAGraph Trees use): CUDA calls of other threads (a DataLoader's pinning thread)
        # are not affected by the capture
        self.graph.capture_begin(self.pool, capture_error_mode="thread_local")

    def capture_end(self) -> None:
        self.graph.capture_end()

    def end_allocate_to_pool(self) -> None:
        torch._C._cuda_endAllocateToPool(self.index, self.pool)

    def release_pool(self) -> None:
        torch._C._cuda_releasePool(self.index, self.pool)

    def reset_generator(self) -> None:
        """A capture that draws one random number runs the default generator's capture prologue and epilogue on
        its shared state (torch 2.11 registers the generator in ``capture_begin``; later versions when a random
        op runs), without moving the offset eager random ops use or replacing the state other graphs hold. On a new
        stream: the current one may be the default stream, where ``capture_begin`` is refused."""
        device = torch.device("cuda", self.index)
        with warnings.catch_warnings(), torch.cuda.stream(torch.cuda.Stream(device)):
            warnings.simplefilter("ignore")
            reset = torch.cuda.CUDAGraph()
            reset.capture_begin(capture_error_mode="thread_local")
            try:
                torch.empty(1, device=device).uniform_()
            finally:
                reset.capture_end()


class CudaRuntime:
    """CUDA itself (see :class:`DeviceRuntime`)."""

    has_streams = True
    can_capture = True

    def current_stream(self, device: torch.device | None = None) -> torch.cuda.Stream:
        return torch.cuda.current_stream(cuda_index(device))

    def stream_reader(self, device: torch.device) -> Callable[[], Hashable]:
        """(stream id, device index, device type), what ``torch.cuda.current_stream`` builds its Stream from."""
        return functools.partial(torch._C._cuda_getCurrentStream, cuda_index(device))

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

    @property
    def can_feed(self) -> bool:
        return feeding.bindings() is not None

    def capture(
        self,
        fn: Callable[[list], Any],
        args: list,
        *,
        pool: Any,
        stream: torch.cuda.Stream,
        device: torch.device,
        fed: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> tuple[torch.cuda.CUDAGraph | feeding.FedGraph, Any]:
        """Record ``fn(args)`` on ``stream`` into a new CUDA graph allocating from ``pool`` (:func:`record`). As
        ``torch.cuda.graph`` does, the device is synchronized first; the caller's stream is restored on every path.
        With ``fed``, a :class:`~airgraph.runtime.feeding.FedGraph` whose memcpy nodes come first."""
        index = cuda_index(device)
        torch.cuda.synchronize(index)
        if fed:
            feeding.started_on(index)
        recording = _CudaRecording(index, pool, keep_graph=bool(fed))
        buffers, sources = [args[position] for position, _ in fed], [source for _, source in fed]
        run = feeding.copies_first(fn, list(zip(buffers, sources, strict=True))) if fed else fn
        with torch.cuda.stream(stream):
            outputs = record(recording, run, args)
        if not fed:
            return recording.graph, outputs
        return feeding.FedGraph(recording.graph, buffers, sources, index), outputs

    # (the graph's own method, called as runtime.feed(graph, sources): no frame of the runtime's in a replay)
    feed = staticmethod(feeding.FedGraph.feed)

    def replay(self, graph: torch.cuda.CUDAGraph, recorded: list, args: list) -> None:
        graph.replay()  # the recorded addresses: nothing to bind

    def capture_refusal(self, device: torch.device) -> str | None:
        """PyTorch's caching allocator bypassed: a capture's allocations would not come from the graph's pool (torch
        2.13's CUDAGraph Trees refuse it too; torch 2.11 has no switch to ask, only the environment variable)."""
        enabled = getattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled", None)
        if config.torch_cuda_caching_disabled() or (enabled is not None and not enabled()):
            return UNCACHED_ALLOCATOR
        return None

    def clear_blas_workspaces(self) -> None:
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """A pinned view is copied too: it may be a view of a caller's pinned tensor, which the caller may write to
        as soon as the call returns."""
        if not t.is_pinned():
            return t.pin_memory()
        return t if t._base is None else self.pinned_copy(t)

    def pinned_copy(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, pin_memory=True).copy_(t)

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]:
        return fn

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None:
        dst.copy_(src, non_blocking=non_blocking)

    # torch's own foreach copy, called as runtime.copy_many(dsts, srcs): no frame of the runtime's in a replay
    copy_many = staticmethod(torch._foreach_copy_)

    def run_op(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    def reading(self, values: Any) -> None:
        """``values`` are about to be read on the current stream (the simulator checks; nothing to do here)."""

    def device_time(self, fn: Callable[[list], Any], args: list, iters: int, *, flush_l2: bool = False) -> float:
        """The call's kernels timed as a replayed CUDA graph runs them: the host's launching hidden, the L2 cache
        overwritten first where asked (runtime/cuda_timing.py)."""
        from airgraph.runtime.cuda_timing import device_time

        return device_time(fn, args, iters, flush_l2=flush_l2)

    def l2_bytes(self, device: torch.device) -> int:
        from airgraph.runtime.cuda_timing import l2_bytes

        return l2_bytes(cuda_index(device))

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """CUDA events around each call on the current stream: device time, not the host's (the host launching
        the call's kernels included: :meth:`device_time` hides it)."""
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


CUDA = CudaRuntime()


def runtime_for(device: torch.device, override: DeviceRuntime | None = None) -> DeviceRuntime:
    """The runtime a graph on ``device`` runs with: ``override`` (the simulator, in tests) for CPU and CUDA graphs,
    else CUDA's on CUDA and the CPU's elsewhere."""
    if override is not None and device.type in ("cpu", "cuda"):
        return override
    return CUDA if device.type == "cuda" else CPU
