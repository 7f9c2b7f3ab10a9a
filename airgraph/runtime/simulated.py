"""CUDA streams, events and graphs simulated on the CPU: the device runtime CPU-only machines test CUDA logic with.

:class:`SimulatedCuda` is a device runtime (runtime/device.py) for CPU tensors. Given to
``AirgraphBackend(runtime=...)``, it makes a CPU graph run the CUDA paths: stream scopes split segments, the
executor forks, waits and joins as on a GPU, and reduce-overhead captures and replays graphs. With tensors placed
on its device (:meth:`SimulatedCuda.to_device`; simulated_device.py) the graph is traced as a CUDA graph, so host
placement, the capture plan's CUDA checks and the host split run too.

Invariants: work runs at once, in program order, on the CPU, so results equal eager's whenever the CUDA logic is
right; the checker (simulated_checker.py) finds where it is not, in ``problems`` (``check()`` raises
:class:`StreamRaceError`). A capture follows device.py's :func:`record` with a ``SimGraph`` (simulated_state.py):
the recording runs the function once on the static buffers, then puts back the arguments it mutated and the
random state, and leaves its outputs unwritten (NaN, or every bit flipped); a replay runs it again on the same
buffers. docs/design/simulator.md has the whole model.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.runtime.device import BORROWED, FOREACH_COPY_DTYPES, UNCACHED_ALLOCATOR, record
from airgraph.runtime.outputs import expanded_dims, one_per_expanded, storage
from airgraph.runtime.simulated_checker import RaceChecker, SimEvent, SimStream, StreamRaceError
from airgraph.runtime.simulated_device import CostModel, DeviceFunctions, DeviceOps, Placement, device_to_host
from airgraph.runtime.simulated_state import (
    BREAK_POINTS,
    Allocator,
    Generator,
    SimGraph,
    SimulatedCudaError,
    Workspaces,
    copy_memory,
    did_nothing,
    fed_sources,
    unwritten,
)

__all__ = ["SimEvent", "SimGraph", "SimStream", "SimulatedCuda", "SimulatedCudaError", "StreamRaceError"]


class SimulatedCuda(RaceChecker):
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
        super().__init__()
        self._local = threading.local()
        self._side: dict[tuple[str, Any], SimStream] = {}
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

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """A cost model, not a clock: every ATen op one call dispatches costs a launch plus the bytes it reads and
        writes at the model's bandwidth. Deterministic, so what a tuner decides on it is repeatable in tests.
        (Code that calls compiled kernels directly, Inductor's C++ on the CPU, dispatches only its extern ops.)"""
        with CostModel(self.LAUNCH_SECONDS, self.BYTES_PER_SECOND) as cost:
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
            graph.fed = fed_sources(fed)
            if did_nothing(graph.outputs, saved, versions):
                self.problems.append(
                    "a graph was recorded that does no device work (its outputs are views of its arguments, which "
                    "it left as they were): CUDA warns 'The CUDA Graph is empty' and a replay only costs a launch; "
                    "run such a graph uncaptured"
                )
        finally:
            torch.set_rng_state(rng)
            with torch.no_grad():
                unwritten(graph.outputs, args)
                for tensor, before in saved:
                    copy_memory(tensor, before)
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
        graph.fed = fed_sources(zip([position for position, *_ in graph.fed], sources, strict=True))

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
            copy_memory(dst, src)

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
