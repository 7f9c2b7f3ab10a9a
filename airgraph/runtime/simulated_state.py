"""The GPU state a CUDA graph capture touches, as the simulator (runtime/simulated.py) models it.

Each piece is modelled so that the mistake it stands for fails a simulated run the way it fails on a GPU:

- :class:`Allocator`: the caching allocator's graph pools. A capture into a pool takes a use of it, and a graph
  whose capture ended gives it back when destroyed; at zero the allocator releases the pool, and a later capture
  into the same handle fails (``TORCH_INTERNAL_ASSERT(use_count > 0)`` in ``create_or_incref_pool``). It also
  knows which pools are being captured into: beginning a second capture into one fails, and so does ending one
  that is not. The pinned host allocator is a second one (``SimulatedCuda.host_allocator``): ``capture_begin``
  begins it right after the device's, and only a ``capture_end`` that succeeds ends it, for PyTorch binds no call
  that does (torch 2.11 on an H100: a capture into a pool after a failed one raised "beginAllocateToPool: already
  recording to mempool_id" though the device allocator's capture had been ended).
- :class:`Generator`: the default CUDA generator's capture flag as torch 2.11 keeps it: ``capture_begin`` sets it
  before anything else can fail (the default stream is refused after it), only a ``capture_end`` that succeeds
  clears it, and a random op outside a capture while it is set raises "Offset increment outside graph capture
  encountered unexpectedly."
- :class:`Workspaces`: cuBLAS's workspaces, one per (thread, stream): the first GEMM there allocates one, from the
  graph pool when it runs inside a capture, else from the ordinary allocator; a recording keeps the one it found.
  ``clear`` frees them all (``torch._C._cuda_clearCublasWorkspaces``, which CUDAGraph Trees call), or one stream's
  (torch 2.13, not 2.11, does that when a graph captured on the stream is destroyed). A replay whose workspace went back
  to the ordinary allocator writes memory a user's tensor may own by then: the simulator reports it.
- :class:`SimGraph`: one graph, recorded step by step as ``torch.cuda.CUDAGraph`` is, in torch 2.11's order
  (generator, then the allocators, then the stream capture), with the failure points a test can break
  (``SimulatedCuda.break_capture_at``): ``BREAK_POINTS``. (``capture_end`` can also fail between the allocator's
  end and the generator's epilogue, on a graph CUDA returns null or a sticky CUDA error; such a failure leaks a use
  of the pool on torch 2.11-2.13, which nothing outside PyTorch can tell apart, so it is not offered.)
- :func:`host_sync`: the ops that synchronise with the host, which CUDA refuses inside a capture (the recording
  raises and the capture is invalidated: its ``capture_end`` fails too).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BREAK_POINTS", "Allocator", "Generator", "SimGraph", "SimulatedCudaError", "Workspaces", "host_sync"]

aten = torch.ops.aten

# Where a test can make a capture fail (SimulatedCuda.break_capture_at), in the order a capture reaches them.
BREAK_POINTS = ("begin: generator", "begin: allocator", "begin: stream", "recording", "end: stream")

# Ops that use a cuBLAS workspace (by overload packet).
GEMMS = frozenset(
    getattr(aten, name)
    for name in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation")
)
_BOOL_INDEXED = frozenset(
    {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._unsafe_index_put.default}
)


class SimulatedCudaError(RuntimeError):
    """What CUDA (or PyTorch's CUDA code) would raise at this point."""


class Allocator:
    """The caching allocator's graph pools: use counts and the captures allocating into them (module docstring)."""

    def __init__(self) -> None:
        self.use_counts: dict[Any, int] = {}
        self.recording: dict[Any, Any] = {}  # pool -> the stream whose capture allocates into it

    def begin_allocate_to_pool(self, pool: Any, stream: Any) -> None:
        count = self.use_counts.get(pool)
        if count == 0:
            raise SimulatedCudaError(
                "INTERNAL ASSERT FAILED in create_or_incref_pool: use_count > 0 (a capture into a graph pool whose "
                "use count dropped to zero: the caching allocator released it when its last graph was destroyed)"
            )
        self.use_counts[pool] = (count or 0) + 1
        if pool in self.recording:
            raise SimulatedCudaError("beginAllocateToPool: already recording to mempool_id")
        self.recording[pool] = stream

    def end_allocate_to_pool(self, pool: Any) -> None:
        if pool not in self.recording:
            raise SimulatedCudaError("endAllocatePool: not currently recording to mempool_id")
        del self.recording[pool]

    def release_pool(self, pool: Any) -> None:
        if self.use_counts.get(pool, 0) <= 0:
            raise SimulatedCudaError("INTERNAL ASSERT FAILED in releasePool: uc >= 0")
        self.use_counts[pool] -= 1


class Generator:
    """The default CUDA generator's capture flag (torch 2.11; module docstring)."""

    def __init__(self) -> None:
        self.capturing = False

    def draw(self, *, recording: bool) -> None:
        """A random op runs; ``recording``: inside a capture."""
        if self.capturing and not recording:
            raise SimulatedCudaError("Offset increment outside graph capture encountered unexpectedly.")


@dataclass(eq=False)
class Workspace:
    pool: Any  # the graph pool it was allocated in; None: the caching allocator's ordinary memory
    freed: bool = False


class Workspaces:
    """cuBLAS workspaces per (thread, stream) (module docstring)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, int], Workspace] = {}

    def use(self, stream: Any, pool: Any) -> Workspace:
        """The workspace a GEMM on ``stream`` uses, allocated (in ``pool``, when capturing into one) if it has none."""
        key = (threading.get_ident(), stream.id)
        if key not in self._by_key:
            self._by_key[key] = Workspace(pool)
        return self._by_key[key]

    def clear(self, stream: Any = None) -> None:
        """Free every thread's workspaces (``stream``: only that stream's)."""
        for key in [k for k in self._by_key if stream is None or k[1] == stream.id]:
            self._by_key.pop(key).freed = True


@dataclass(eq=False)
class SimGraph:
    """One graph of the simulator: recorded as ``torch.cuda.CUDAGraph`` is (it implements device.py's Recording),
    replayed by running the recorded function again on the arguments at the recorded addresses, into the recorded
    outputs. Like a CUDA graph, it keeps no argument alive (:meth:`hold`)."""

    runtime: Any  # the SimulatedCuda
    pool: Any
    fn: Callable[[list], Any] | None = None
    args: list = field(default_factory=list)  # weak references to the tensor arguments, other arguments as they are
    addresses: list = field(default_factory=list)  # each tensor argument's data_ptr at the recording
    layouts: list = field(default_factory=list)  # and its (sizes, strides, dtype)
    outputs: Any = ()
    stream: Any = None
    ended: bool = False
    invalidated: str | None = None  # why the capture was invalidated (an op that synchronises ran)
    workspaces: set = field(default_factory=set)  # the cuBLAS workspaces its GEMMs recorded
    replays: int = 0
    fed: list = field(default_factory=list)  # (position, weak reference to its source, its address) per fed buffer

    # -- recording (device.py's Recording) ---------------------------------------------------------------
    def refusal(self) -> str | None:
        rt = self.runtime
        if rt.current_stream() is rt.default_stream:
            return "CUDA graphs must be captured on a non-default stream (refused before capture_begin)"
        return None

    def capture_begin(self) -> None:
        rt = self.runtime
        rt.generator.capturing = True  # torch 2.11: the default generator's capture prologue comes first
        rt.breaks("begin: generator")
        stream = rt.current_stream()
        if stream is rt.default_stream:
            raise SimulatedCudaError("CUDA graphs must be captured on a non-default stream.")
        rt.allocator.begin_allocate_to_pool(self.pool, stream)
        rt.breaks("begin: allocator")
        rt.host_allocator.begin_allocate_to_pool(self.pool, stream)
        if stream.id in rt.capturing:
            raise SimulatedCudaError("cudaStreamBeginCapture: the stream is already capturing")
        self.stream, rt.capturing[stream.id] = stream, self
        rt.breaks("begin: stream")

    def capture_end(self) -> None:
        rt = self.runtime
        stream = rt.current_stream()
        if rt.capturing.get(stream.id) is not self:
            raise SimulatedCudaError("cudaStreamEndCapture: the stream is not capturing (cudaErrorIllegalState)")
        del rt.capturing[stream.id]
        if self.invalidated:
            raise SimulatedCudaError(f"cudaErrorStreamCaptureInvalidated: {self.invalidated}")
        rt.breaks("end: stream")
        rt.allocator.end_allocate_to_pool(self.pool)
        rt.host_allocator.end_allocate_to_pool(self.pool)
        rt.generator.capturing = False
        self.ended = True
        weakref.finalize(self, _destroyed, rt, self.pool, stream)

    def end_allocate_to_pool(self) -> None:
        self.runtime.allocator.end_allocate_to_pool(self.pool)

    def release_pool(self) -> None:
        self.runtime.allocator.release_pool(self.pool)

    def reset_generator(self) -> None:
        """An empty capture (a private pool of its own, on a new stream) runs the generator's prologue and epilogue."""
        rt = self.runtime
        reset = SimGraph(rt, object())
        with rt.use(rt.new_stream(name="generator reset")):
            reset.capture_begin()
            reset.capture_end()

    def hold(self, args: list) -> None:
        """What a CUDA graph keeps of the arguments it was recorded on: their addresses, not the tensors (whoever
        replays it keeps the memory alive, or passes the tensors that own it now to :meth:`replay`)."""
        self.args = [weakref.ref(a) if isinstance(a, torch.Tensor) else a for a in args]
        self.addresses = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        # and how its kernels read them: sizes, strides and dtype are baked into the recorded launches
        self.layouts = [_layout(a) if isinstance(a, torch.Tensor) else None for a in args]

    # -- replay ------------------------------------------------------------------------------------------
    def replay(self, args: list | None = None) -> None:
        """Run the recorded kernels on the recorded addresses: on ``args``, the tensors there now (each checked to
        be at its recorded address), or on the recording's own arguments (each still alive)."""
        rt = self.runtime
        if not self.ended:
            raise SimulatedCudaError("Called CUDAGraph::replay without a preceding successful capture.")
        if args is None:
            args = [a() if isinstance(a, weakref.ref) else a for a in self.args]
            dead = [i for i, (a, ref) in enumerate(zip(args, self.args, strict=True)) if a is None and ref is not None]
            if dead:
                raise SimulatedCudaError(
                    f"a replay would read and write the memory of arguments {dead}, freed since the recording "
                    "(a CUDA graph keeps addresses, not tensors: keep them alive, or pass the tensors there now)"
                )
        moved = [
            i
            for i, (a, at) in enumerate(zip(args, self.addresses, strict=True))
            if at is not None and (not isinstance(a, torch.Tensor) or a.data_ptr() != at)
        ]
        if moved:
            rt.problems.append(
                f"a replay's kernels access arguments {moved} at their recorded addresses, where the tensors given "
                "are not: they read and write other memory"
            )
        relaid = [
            i
            for i, (a, layout) in enumerate(zip(args, self.layouts, strict=True))
            if layout is not None and i not in moved and _layout(a) != layout
        ]
        if relaid:
            rt.problems.append(
                f"a replay's kernels read arguments {relaid} with the sizes, strides and dtype they had at the "
                "recording, which the tensors there no longer have (changed in place: t_, as_strided_, set_, "
                ".data =): they read that memory as the old layout"
            )
        if any(w.freed and w.pool is None for w in self.workspaces):
            rt.problems.append(
                "a replay's GEMMs write the cuBLAS workspace their recording found, which has been freed to the "
                "caching allocator (a user's tensor may own that memory now): clear cuBLAS workspaces before "
                "recording, so that the recording allocates its own in the graph's pool"
            )
        self.replays += 1
        rt.replaying = True
        try:
            fresh = self.fn(list(args))
        finally:
            rt.replaying = False
        for kept, new in zip(self.outputs, fresh, strict=True):
            if isinstance(kept, torch.Tensor) and kept is not new:
                with torch.no_grad():
                    rt.copy_(kept, new)  # the recorded kernels write the recorded outputs


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype


def _destroyed(runtime: Any, pool: Any, stream: Any) -> None:
    """A graph whose capture ended is destroyed (``CUDAGraph::reset``)."""
    if runtime.reset_clears_stream_workspaces:  # torch 2.13: clearCublasWorkspacesForStream(capture stream)
        runtime.workspaces.clear(stream)
    runtime.allocator.release_pool(pool)
    runtime.host_allocator.release_pool(pool)


def host_sync(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Why ``func(*args, **kwargs)`` synchronises with the host (refused inside a CUDA graph capture), or None."""
    if not isinstance(func, torch._ops.OpOverload):
        return None
    if torch.Tag.cudagraph_unsafe in func.tags:
        return "it is tagged cudagraph_unsafe"
    if func in _BOOL_INDEXED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return "a boolean mask index calls nonzero, which reads the count on the host"
        return None
    if func.overloadpacket is aten.repeat_interleave and kwargs.get("output_size") is not None:
        return None
    if torch.Tag.dynamic_output_shape in func.tags:
        return "its output's size depends on the data, read on the host"
    if torch.Tag.data_dependent_output in func.tags or func.overloadpacket is aten.is_nonzero:
        return "it reads a device value on the host"
    return None
