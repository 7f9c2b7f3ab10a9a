"""The GPU state a CUDA graph capture touches, as the simulator (runtime/simulated.py) models it.

Each piece fails a simulated run the way the mistake it stands for fails on a GPU:

- :class:`Allocator`: the caching allocator's graph pools (use counts, captures allocating into them); the
  pinned host allocator is a second one, which only a ``capture_end`` that succeeds ends;
- :class:`Generator`: the default CUDA generator's capture flag, as torch 2.11 keeps it;
- :class:`Workspaces`: cuBLAS's workspaces, one per (thread, stream), and where each was allocated from;
- :class:`SimGraph`: one graph, recorded step by step in torch 2.11's order, with the failure points a test can
  break (:data:`BREAK_POINTS`);
- :func:`host_sync`: the ops that synchronise with the host, which CUDA refuses inside a capture.

Also the recording's helpers: outputs left unwritten, the check for a recording that did no device work, and
fed sources kept by address. docs/design/simulator.md says how each piece fails, and why.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from airgraph.runtime.outputs import memory_copier, storage

__all__ = [
    "BREAK_POINTS",
    "Allocator",
    "Generator",
    "SimGraph",
    "SimulatedCudaError",
    "Workspaces",
    "copy_memory",
    "did_nothing",
    "fed_sources",
    "host_sync",
    "unwritten",
]

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
    """The caching allocator's graph pools: use counts and the captures allocating into them (simulator.md)."""

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
    """The default CUDA generator's capture flag (torch 2.11; docs/design/simulator.md)."""

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
    """cuBLAS workspaces per (thread, stream) (docs/design/simulator.md)."""

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


def unwritten(outputs: Any, args: list) -> None:
    """The memory of a recording's outputs as a CUDA recording leaves it: never written. The recording ran on the
    call's inputs, so its outputs hold that call's results, which a real one does not compute: each output storage
    that is not an argument's is overwritten, floating point with NaN and other types with every bit flipped (a
    value that differs from the result), so that whoever reads them before a replay gets wrong results, as on a GPU.
    (An argument's memory is put back by :meth:`SimulatedCuda.capture`.)"""
    taken = {storage(a) for a in args if isinstance(a, torch.Tensor)}
    for out in outputs if isinstance(outputs, (list, tuple)) else ():
        if not isinstance(out, torch.Tensor) or not out.untyped_storage().nbytes() or storage(out) in taken:
            continue
        taken.add(storage(out))
        memory = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())  # all of it, once
        if memory.is_floating_point() or memory.is_complex():
            memory.fill_(float("nan"))
        else:
            memory.bitwise_not_()


def did_nothing(outputs: Any, saved: list[tuple[torch.Tensor, torch.Tensor]], versions: list[int]) -> bool:
    """Whether a recording did no device work, as far as its memory tells: every output is a view of an argument
    (nothing allocated and written), and no argument was written: its version counter is where it was (``versions``;
    an in-place op writing the values already there counts as work, as its kernel does) and it holds what it held
    before (``saved``: each with its copy; a compiled kernel writes without bumping a version; NaN counts as
    written). A recording that only allocates counts as work: a CUDA graph of one is as empty. One without outputs
    is not looked at: a compiled graph has some; the memory pool's keeper (capture.py) has none."""
    taken = {storage(a) for a, _ in saved}
    outs = [out for out in tree_leaves(outputs) if isinstance(out, torch.Tensor)]
    if not outs or any(storage(out) not in taken for out in outs):
        return False
    unchanged = zip(saved, versions, strict=True)
    return all(a._version == version and torch.equal(a, before) for (a, before), version in unchanged)


def copy_memory(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src`` into ``dst`` (same layout), an expanded one (stride 0) over the memory it really has, once."""
    memory_copier(torch.Tensor.copy_, dst)(dst, src)


def fed_sources(fed: Iterable[tuple[int, torch.Tensor]]) -> list[tuple[int, weakref.ref, int]]:
    """A SimGraph's fed sources, kept as CUDA keeps them: by address (with a weak reference to tell a freed one)."""
    return [(position, weakref.ref(source), source.data_ptr()) for position, source in fed]
