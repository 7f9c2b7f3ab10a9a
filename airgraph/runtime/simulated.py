"""CUDA streams, events and graphs simulated on the CPU, with a happens-before race checker and a model of the
GPU state a capture touches.

:class:`SimulatedCuda` is a device runtime (runtime/device.py) for CPU tensors. Given to
``AirgraphBackend(runtime=...)``, it makes a CPU graph run the CUDA paths: stream scopes split segments,
the executor forks, waits and joins as it would on a GPU, and reduce-overhead captures and replays graphs.
With tensors placed on its device (:meth:`SimulatedCuda.to_device`; runtime/simulated_device.py), the graph is
traced as a CUDA graph whose CPU tensors stand for CUDA ones, so host placement, the capture plan's CUDA checks
and the host split around a replay run too. Work runs at once, in program order, on the CPU: results are the
eager results whenever the CUDA logic is right, and the checker finds where it is not:

- **ordering**: each stream keeps a vector clock; ``wait_stream`` / ``wait_event`` merge clocks as CUDA's
  waits order work. Each segment call is an access on the current stream: it reads its input tensors and
  writes its outputs and the inputs it mutates (an input whose version counter moved without the
  executor's analysis knowing is reported too). Two accesses to one storage from different streams, at
  least one a write, must be ordered by the clocks, or it is a race (a read of memory another stream
  may not have written yet, or a write over memory another stream may still read);
- **lifetimes**: a storage written on one stream and read on another must not be freed, inside a call
  (see :meth:`SimulatedCuda.call`), before the producing stream is ordered after every read: the CUDA caching
  allocator gives a freed block to the next allocation on the stream that allocated it at once;
- **joins**: after a call, the caller's stream must be ordered after all work of every other stream
  (:meth:`SimulatedCuda.call` checks).

A device synchronize (every capture begins with one) completes all work so far: accesses before it race with
nothing after it, and memory it read may be freed.

Graphs: ``capture`` follows device.py's :func:`~airgraph.runtime.device.record` with a
:class:`~airgraph.runtime.simulated_state.SimGraph`, which models the allocator's pool use counts, the default
generator's capture flag, the stream's capture and cuBLAS's per-(thread, stream) workspaces (simulated_state.py
says how each fails); ops that synchronise with the host raise inside a recording. The recording runs the
function once on the static buffers (as recording would allocate them) and puts back every tensor argument it
mutated and the random state (a recording executes nothing); ``replay`` runs it again on the same buffers and
writes its results into the recorded outputs, so kept outputs, buffers and pool memory behave as a replayed CUDA
graph's do. The recording runs on the call's inputs (GraphCapture copies them into its static buffers), so an
index computed from them is in range; what it writes into its outputs is then overwritten (NaN, or every bit
flipped), as a CUDA recording leaves them unwritten: results read from a recording rather than a replay are wrong
here as on a GPU. Static input buffers start zeroed (CUDA's are uninitialized); they are allocations the lifetime
checker follows.

Problems are collected in :attr:`SimulatedCuda.problems`; ``check()`` raises :class:`StreamRaceError` with
all of them.

(Over 400 lines because the checker's rules and the GPU state it models are documented here in full, beside the
one class that implements them; the state itself lives in simulated_state.py, the simulated device in
simulated_device.py.)
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from airgraph.boxed import boxed
from airgraph.runtime.device import BORROWED, FOREACH_COPY_DTYPES, UNCACHED_ALLOCATOR, record
from airgraph.runtime.outputs import expanded_dims, memory_copier, one_per_expanded, storage
from airgraph.runtime.simulated_device import DeviceFunctions, DeviceOps, Placement, device_to_host
from airgraph.runtime.simulated_state import (
    BREAK_POINTS,
    Allocator,
    Generator,
    SimGraph,
    SimulatedCudaError,
    Workspaces,
)

__all__ = ["SimEvent", "SimGraph", "SimStream", "SimulatedCuda", "SimulatedCudaError", "StreamRaceError"]


class StreamRaceError(AssertionError):
    """The simulated run found unordered accesses, early frees or unjoined streams."""


class SimStream:
    """A stream: a name and a vector clock (stream id -> the last of its operations this stream is after)."""

    _ids = itertools.count()

    def __init__(self, name: str) -> None:
        self.id, self.name = next(self._ids), name
        self.clock: dict[int, int] = {self.id: 0}

    def __repr__(self) -> str:
        return f"SimStream({self.name!r})"

    def tick(self) -> tuple[int, int]:
        self.clock[self.id] += 1
        return self.id, self.clock[self.id]

    def after(self, stamp: tuple[int, int]) -> bool:
        """Whether the operation ``stamp`` (stream id, count) is ordered before this stream's next one."""
        return self.clock.get(stamp[0], 0) >= stamp[1]

    def _merge(self, clock: dict[int, int]) -> None:
        for sid, count in clock.items():
            if count > self.clock.get(sid, 0):
                self.clock[sid] = count

    def wait_stream(self, other: SimStream) -> None:
        self._merge(other.clock)

    def wait_event(self, event: SimEvent) -> None:
        self._merge(event.clock)


class SimEvent:
    def __init__(self) -> None:
        self.clock: dict[int, int] = {}

    def record(self, stream: SimStream) -> None:
        self.clock = dict(stream.clock)


class _Accesses:
    """One storage's history since it was allocated: the last write and the reads after it, per stream."""

    __slots__ = ("producer", "reads", "recorded", "write")

    def __init__(self, producer: SimStream | None) -> None:
        self.producer = producer  # the stream that allocated it (None: not allocated by a segment)
        # streams given to record_stream, by id: at the free the allocator records an event on each and reuses
        # the block once they have all passed it (their work then, and all work it waited for, is done)
        self.recorded: dict[int, SimStream] = {}
        self.write: tuple[SimStream, tuple[int, int], str] | None = None
        self.reads: dict[int, tuple[SimStream, tuple[int, int], str]] = {}


class SimulatedCuda:
    """The simulated device runtime; see the module docstring."""

    has_streams = True
    can_capture = True
    can_feed = True
    # time()'s cost model: a kernel launch, and memory bandwidth (roughly an H100's).
    LAUNCH_SECONDS = 5e-6
    BYTES_PER_SECOND = 2e12

    def __init__(self, *, reset_clears_stream_workspaces: bool = True, caching_allocator: bool = True) -> None:
        """``reset_clears_stream_workspaces``: destroying a graph frees the cuBLAS workspaces of its capture stream
        (torch 2.13 does, 2.11 does not; False: torch 2.11). ``caching_allocator``: False stands for
        ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``."""
        self.problems: list[str] = []
        self.default_stream = SimStream("default")
        self._local = threading.local()
        self._side: dict[tuple[str, Any], SimStream] = {}
        self._history: dict[int, _Accesses] = {}
        self._live: dict[int, int] = {}  # storage -> live tensor objects the checker follows
        self._completed: dict[int, int] = {}  # stream id -> its operations completed by a device synchronize
        self._in_call = False
        self.streams: list[SimStream] = [self.default_stream]
        # The GPU state a capture touches (simulated_state.py).
        self.allocator, self.generator, self.workspaces = Allocator(), Generator(), Workspaces()
        self.host_allocator = Allocator()  # the pinned host allocator's graph pools: no call ends its capture
        self.capturing: dict[int, SimGraph] = {}  # stream id -> the graph capturing on it
        self.recording: SimGraph | None = None  # the graph whose recording is running its function
        self.replaying = False
        self.break_capture_at: str | None = None  # one of BREAK_POINTS: the next capture fails there, once
        self.reset_clears_stream_workspaces = reset_clears_stream_workspaces
        self.caching_allocator = caching_allocator
        self.placement = Placement()
        self._device_ops = DeviceOps(self)

    # -- streams and events ------------------------------------------------------------------------------
    def current_stream(self, device: Any = None) -> SimStream:
        return getattr(self._local, "stream", None) or self.default_stream

    def stream_reader(self, device: Any) -> Callable[[], Hashable]:
        return self.current_stream

    def side_stream(self, tag: str, device: Any = None, priority: int = 0) -> SimStream:
        if (tag, str(device)) not in self._side:
            self._side[(tag, str(device))] = self.new_stream(device, name=f"{tag} (priority {priority})")
        return self._side[(tag, str(device))]

    def new_stream(self, device: Any = None, *, name: str = "stream") -> SimStream:
        stream = SimStream(name)
        self.streams.append(stream)
        return stream

    @contextlib.contextmanager
    def use(self, stream: SimStream) -> Iterator[None]:
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = previous

    def new_event(self) -> SimEvent:
        return SimEvent()

    def record_stream(self, tensor: torch.Tensor, stream: SimStream) -> None:
        """Like ``Tensor.record_stream``: the storage's free is ordered after ``stream``'s work up to the free."""
        history = self._history.get(storage(tensor))
        if history is not None:
            history.recorded[stream.id] = stream

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """A cost model, not a clock: every ATen op one call dispatches costs a launch plus the bytes it reads and
        writes at the model's bandwidth. Deterministic, so what a tuner decides on it is repeatable in tests.
        (Code that calls compiled kernels directly, Inductor's C++ on the CPU, dispatches only its extern ops.)"""
        with _CostModel(self.LAUNCH_SECONDS, self.BYTES_PER_SECOND) as cost:
            fn(list(args))
        return cost.seconds

    # -- the simulated device's memory ----------------------------------------------------------------------
    def to_device(self, *values: Any) -> Any:
        """Place tensors (a module: its parameters and buffers) on the simulated device: compiled functions called
        under :meth:`call` trace them as CUDA tensors (runtime/simulated_device.py). Returns the value (or values)."""
        for value in values:
            self.placement.place(value)
        return values[0] if len(values) == 1 else values

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """Stands for pinned memory: a copy (which a later write to ``t`` does not reach), like ``pin_memory()``."""
        return self.pinned_copy(t)

    def pinned_copy(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def synchronize(self) -> None:
        """The host waits for every stream: all work so far is complete."""
        self._completed = {stream.id: stream.clock[stream.id] for stream in self.streams}

    # -- graphs ------------------------------------------------------------------------------------------
    def pool_handle(self) -> object:
        return object()

    def static_buffer(self, t: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        one_per_expanded(buffer, expanded_dims(buffer)).zero_()
        stream = self.current_stream()
        self._allocated(buffer, stream, stream.tick(), "a static input buffer")
        return buffer

    def capture(
        self,
        fn: Callable[[list], Any],
        args: list,
        *,
        pool: Any,
        stream: SimStream,
        device: Any,
        fed: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> tuple:
        """Record ``fn(args)`` into a SimGraph (device.py's :func:`record`, as CUDA's capture). The device is
        synchronized first; the arguments ``fn`` mutated and the random state are put back after. ``fed``: the
        buffers the graph fills itself before each replay, from the sources :meth:`feed` gave (as CUDA's memcpy
        nodes: runtime/feeding.py), kept as CUDA keeps them, by address only (weak references)."""
        self.synchronize()
        saved = [(a, a.clone()) for a in args if isinstance(a, torch.Tensor)]
        versions = [a._version for a, _ in saved]  # an in-place op bumps its argument's, whatever it wrote
        rng = torch.get_rng_state()  # nor does it draw random numbers
        graph = SimGraph(self, pool, fn)

        def recorded(values: list) -> Any:
            self.recording = graph  # a recording executes nothing: its accesses are not checked
            try:
                outputs = fn(values)
                if self.break_capture_at == "recording":
                    graph.invalidated = "the recording failed (break_capture_at)"
                self.breaks("recording")
            finally:
                self.recording = None
            return outputs

        try:
            with self.use(stream):
                graph.outputs = record(graph, recorded, list(args))
            graph.hold(args)
            graph.fed = _fed_sources(fed)
            if _did_nothing(graph.outputs, saved, versions):
                self.problems.append(
                    "a graph was recorded that does no device work (its outputs are views of its arguments, which "
                    "it left as they were): CUDA warns 'The CUDA Graph is empty' and a replay only costs a launch; "
                    "run such a graph uncaptured"
                )
        finally:
            torch.set_rng_state(rng)
            with torch.no_grad():
                _unwritten(graph.outputs, args)
                for tensor, before in saved:
                    _copy_memory(tensor, before)
        return graph, graph.outputs

    @contextlib.contextmanager
    def _ops(self) -> Iterator[None]:
        """The simulated device runs the ops inside (runtime/simulated_device.py)."""
        with DeviceFunctions(), self._device_ops:
            yield

    def breaks(self, point: str) -> None:
        """The capture step ``point`` fails here if a test asked it to (once)."""
        assert point in BREAK_POINTS, point
        if self.break_capture_at == point:
            self.break_capture_at = None
            raise SimulatedCudaError(f"capture broken at '{point}' (SimulatedCuda.break_capture_at)")

    def feed(self, graph: SimGraph, sources: Sequence[torch.Tensor]) -> None:
        if len(sources) != len(graph.fed):
            raise SimulatedCudaError(f"feed: {len(sources)} sources for {len(graph.fed)} fed buffers")
        graph.fed = _fed_sources(zip([position for position, *_ in graph.fed], sources, strict=True))

    def replay(self, graph: SimGraph, recorded: list, args: list) -> None:
        """The fed buffers' copies first (the graph's first nodes: copies of the sources' bytes), then the graph."""
        for position, source, address in graph.fed:
            tensor, buffer = source(), recorded[position]
            if tensor is None:  # CUDA would copy whatever that memory holds now
                self.problems.append(
                    f"a replay's in-graph input copy into buffer {position} reads a tensor freed since it was fed "
                    "(feed the replay's own inputs before each replay)"
                )
                continue
            if tensor.data_ptr() != address:  # (set_: CUDA copies from the address it was given, not the tensor)
                self.problems.append(
                    f"a replay's in-graph input copy into buffer {position} reads the address it was fed, where the "
                    "tensor fed is no longer (its memory moved since: feed after whatever moves an input)"
                )
            fed_as = (tuple(tensor.shape), tensor.stride(), tensor.dtype)
            buffer_as = (tuple(buffer.shape), buffer.stride(), buffer.dtype)
            if fed_as != buffer_as or not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
                self.problems.append(
                    f"a replay's in-graph input copy into buffer {position} is fed a tensor whose bytes are not its "
                    f"value laid out as the buffer's ({fed_as}, conjugate {tensor.is_conj()}, negative "
                    f"{tensor.is_neg()}; the buffer: {buffer_as}): CUDA's memcpy node copies the bytes as they are"
                )
            self.copy_(buffer, tensor)
        graph.replay([args[i] if a is BORROWED else a for i, a in enumerate(recorded)])

    def capture_refusal(self, device: Any) -> str | None:
        return None if self.caching_allocator else UNCACHED_ALLOCATOR

    def clear_blas_workspaces(self) -> None:
        self.workspaces.clear()

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None:
        stream = self.current_stream()
        stamp = stream.tick()
        self._access(src, stream, stamp, "a copy", write=False)
        self._access(dst, stream, stamp, "a copy", write=True)
        with self._ops():
            _copy_memory(dst, src)

    def copy_many(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        """One op (``torch._foreach_copy_``, which refuses what CUDA's does: lists of unequal length, an expanded
        destination, a dtype outside FOREACH_COPY_DTYPES) reading every source and writing every destination."""
        refused = sorted(map(str, {d.dtype for d in dsts} - FOREACH_COPY_DTYPES))
        if refused:  # the CPU's foreach copies them one by one; CUDA's kernel has no case for them
            raise NotImplementedError(f'"foreach_tensor_copy" not implemented for {", ".join(refused)} on CUDA')
        stream = self.current_stream()
        stamp = stream.tick()
        for dst, src in zip(dsts, srcs, strict=True):
            self._access(src, stream, stamp, "a copy", write=False)
            self._access(dst, stream, stamp, "a copy", write=True)
        with self._ops():
            torch._foreach_copy_(dsts, srcs)

    def run_op(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A device op outside any segment (the host split's copies to the device): a new device value."""
        stream = self.current_stream()
        stamp = stream.tick()
        with self._ops():
            out = op(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self._allocated(out, stream, stamp, f"{op}")
        return out

    def reading(self, values: Any) -> None:
        stream = self.current_stream()
        stamp = stream.tick()
        for value in values:
            if isinstance(value, torch.Tensor):
                self._access(value, stream, stamp, "the copy of a replay's outputs", write=False)

    # -- the checker -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around one call of a compiled function: frees inside are checked, and at the end every stream's
        work must be joined into the caller's stream. Tensors placed on the simulated device are traced as CUDA
        tensors when the call compiles (:meth:`to_device`)."""
        before = {stream.id: stream.clock[stream.id] for stream in self.streams}
        self._in_call = True
        try:
            with self.placement.tracing():
                yield
        finally:
            self._in_call = False
        caller = self.current_stream()
        for stream in self.streams:  # the streams that did work in this call
            if stream.clock[stream.id] == before.get(stream.id, 0) or stream is caller:
                continue
            if not caller.after((stream.id, stream.clock[stream.id])):
                self.problems.append(f"{stream} is not joined into {caller} when the call returns")

    def check(self) -> None:
        if self.problems:
            raise StreamRaceError("\n".join(dict.fromkeys(self.problems)))

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]:
        written = segment.written
        label = (
            f"segment {segment.id} ({', '.join(n.name for n in segment.nodes[:3])}{', ...' * (len(segment.nodes) > 3)})"
        )
        to_host = next((n for n in segment.nodes if device_to_host(n)), None)

        def run(args: list) -> Any:
            if self.recording is not None:
                if to_host is not None:  # a copy to pageable host memory waits for the device
                    self.recording.invalidated = f"{to_host.name} = {to_host.target} copies a device value to the host"
                    raise SimulatedCudaError(f"operation not permitted when stream is capturing: {to_host.name}")
                with self._ops():
                    return fn(args)
            stream = self.current_stream()
            stamp = stream.tick()
            inputs = list(args)
            for i, value in enumerate(inputs):
                if isinstance(value, torch.Tensor):
                    self._access(value, stream, stamp, label, write=i in written)
            versions = [v._version if isinstance(v, torch.Tensor) else None for v in inputs]
            with self._ops():
                outputs = fn(args)
            for i, (value, version) in enumerate(zip(inputs, versions, strict=True)):
                if version is not None and value._version != version and i not in written:
                    # a write the executor's analysis (written_inputs) did not see: it ordered nothing for it
                    self.problems.append(f"{label} writes its input {i} in place, unknown to the executor")
                    self._access(value, stream, stamp, label, write=True)
            storages_in = {storage(v) for v in inputs if isinstance(v, torch.Tensor)}
            for value in outputs if isinstance(outputs, (list, tuple)) else ():
                if isinstance(value, torch.Tensor) and storage(value) not in storages_in:
                    self._allocated(value, stream, stamp, label)
            return outputs

        return boxed(run)

    def _allocated(self, tensor: torch.Tensor, stream: SimStream, stamp: tuple[int, int], label: str) -> None:
        if not tensor.untyped_storage().nbytes():
            return
        key = storage(tensor)
        if key not in self._history or self._live.get(key, 0) == 0:
            self._history[key] = _Accesses(stream)
            self._history[key].write = (stream, stamp, label)
        self._live[key] = self._live.get(key, 0) + 1
        weakref.finalize(tensor, self._freed, key)

    def _access(self, tensor: torch.Tensor, stream: SimStream, stamp: tuple[int, int], label: str, *, write: bool):
        if not tensor.untyped_storage().nbytes():
            return
        history = self._history.setdefault(storage(tensor), _Accesses(None))
        what = "writes" if write else "reads"
        earlier = [history.write] if history.write else []
        if write:
            earlier += list(history.reads.values())
        for other, at, by in earlier:
            if other is not stream and not stream.after(at) and not self._complete(at):
                self.problems.append(f"race: {label} on {stream} {what} memory that {by} on {other} uses, unordered")
        if write:
            history.write, history.reads = (stream, stamp, label), {}
        else:
            history.reads[stream.id] = (stream, stamp, label)

    def _freed(self, key: int) -> None:
        self._live[key] -= 1
        if self._live[key] or not self._in_call:
            return
        history = self._history.get(key)
        if history is None or history.producer is None:
            return
        for other, at, by in history.reads.values():
            if other is history.producer or other.id in history.recorded or self._complete(at):
                continue
            # a recorded stream that has waited for the read orders the reuse after it, as the producer would
            if not history.producer.after(at) and not any(r.after(at) for r in history.recorded.values()):
                self.problems.append(
                    f"early free: memory {history.producer} allocated is freed while {by} on {other} may still "
                    "read it (keep it until the streams join, or record_tagged_stream)"
                )

    def _complete(self, stamp: tuple[int, int]) -> bool:
        """Whether the operation ``stamp`` was complete at the last device synchronize."""
        return self._completed.get(stamp[0], 0) >= stamp[1]


def _unwritten(outputs: Any, args: list) -> None:
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


def _did_nothing(outputs: Any, saved: list[tuple[torch.Tensor, torch.Tensor]], versions: list[int]) -> bool:
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


def _copy_memory(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src`` into ``dst`` (same layout), an expanded one (stride 0) over the memory it really has, once."""
    memory_copier(torch.Tensor.copy_, dst)(dst, src)


class _CostModel(TorchDispatchMode):
    """Sums the modelled cost of the ATen ops dispatched inside (views and metadata ops are free)."""

    def __init__(self, launch: float, bandwidth: float) -> None:
        super().__init__()
        self.launch, self.bandwidth, self.seconds = launch, bandwidth, 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.seconds += self.launch + sum(t.numel() * t.element_size() for t in tensors) / self.bandwidth
        return out


def _fed_sources(fed: Iterable[tuple[int, torch.Tensor]]) -> list[tuple[int, weakref.ref, int]]:
    """A SimGraph's fed sources, kept as CUDA keeps them: by address (with a weak reference to tell a freed one)."""
    return [(position, weakref.ref(source), source.data_ptr()) for position, source in fed]
