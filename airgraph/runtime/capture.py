"""reduce-overhead: capture the executor's run in a CUDA graph and replay it, one graph per shape key.

States of one shape key (``CaptureState``): WARMUP (the first ``warmup_iters`` calls run the executor
uncaptured, so Triton kernels compile and autotune and cuBLAS picks its algorithms), then CAPTURED
(recorded once, replayed on every later call), or UNCAPTURED (the key runs the executor directly: the
graph holds an op that cannot be captured, capture failed, or the capture limit was reached).

Inputs, per position:

- static inputs (parameters and buffers, from AOTAutograd's ``static_input_indices``) are used in place;
  their addresses are part of the recording, so a moved one (``model.to``, ``load_state_dict(assign=True)``)
  makes the key re-capture. A recording keeps their addresses, not the tensors (``BORROWED``, as a CUDA graph and
  CUDAGraph Trees keep them): HF ``generate`` makes a static cache (its tensors marked static) per call and drops
  it when the call returns, and the caching allocator gives the next call's cache the same memory, where the
  recording replays as it is instead of recording again (unless an output of the graph is a view of the cache:
  the recording keeps its outputs, and so that memory, and the next cache moves);
- every other tensor is copied into a static buffer before each replay, all of one dtype in one device op
  (``torch._foreach_copy_``, as CUDAGraph Trees copy theirs: one launch, not one per input); a mutated one (in-place
  update in the graph) is copied back after the replay. The buffers are
  made by the call that records, holding its inputs as it got them (as CUDAGraph Trees record): a recording
  reads nothing, but the simulator runs the function there, on values that keep an index in range.

Memory: all keys of all graphs of one backend share one CUDA graph memory pool, as CUDAGraph Trees and
TorchAir do, which is safe because a key's outputs never stay in the pool: see below. The pool lives as long as
the backend: :class:`MemoryPool` holds an empty graph captured into it (as CUDAGraph Trees do), so the caching
allocator's use count of the pool never drops to zero when a key's graph is dropped (a re-recording): a capture
into a pool whose count reached zero fails inside the allocator. A key's static buffers are freed after the last
replay's stream is done with them (``record_stream``), whether the key records again or gives up.

cuBLAS keeps one workspace per (thread, stream), allocated by the first GEMM there and kept until
``torch._C._cuda_clearCublasWorkspaces`` (which CUDAGraph Trees call around their own warm-ups and recordings, so
any ``torch.compile(mode="reduce-overhead")`` in the process does) or, in torch 2.13 (not 2.11), the destruction of a
graph captured on that stream frees it. A recording keeps the pointer of the workspace it found; had the warm-up
allocated it from the ordinary allocator, a replay after such a free would write into memory that may belong to a
user's tensor by then. So, as CUDAGraph Trees do, the workspaces are cleared before and after each warm-up and
each recording: the recording's GEMMs allocate their workspace inside the graph's private pool, which only this
backend's graphs use, one replay at a time.

Outputs (the documented policy): **outputs stay correct**, and are copied only when that needs it. A replay of
an inference graph hands its outputs to the caller without a copy: new tensors (``detach``) on the graph's own
memory (a training graph's outputs are copied out: autograd saves them for the backward in ways that cannot be
moved). Before the
next replay of any graph of the pool (which may overwrite that memory), ``MemoryPool.settle`` looks at each
storage handed out (storage use counts, as CUDAGraph Trees read them): nobody holds it any more (a decode loop
that took the next token and dropped the logits) -> nothing to do; only the handed tensors themselves hold it (a
loop that keeps ``out`` until the next call returns) -> each is moved to one copy of the storage
(``Tensor.set_``, offsets kept), then the replay runs. Held any other way (a view of an output, autograd's
saved tensors), it cannot be moved: that call runs uncaptured, on fresh memory, and from then on every replay of
the pool copies its outputs out (one device-to-device copy per output storage, on the replay's stream) before
returning them. So a tensor kept from step N is never overwritten by step N+1, nor by another key's replay.
Copies keep each output's storage offset, and outputs that share a storage share the copy, so AOTAutograd's
regeneration of views (``as_strided`` on the returned tensor's metadata under dynamic shapes) gives the eager
result. An output that is a view of an input is a view of the caller's tensor (a parameter used in place, or
the caller's own input rather than its static buffer), never a copy.

Replays run on the caller's current stream; when it differs from the previous replay's stream on that
device (any graph of the backend: they share the pool), the new stream first waits for the old one.

Inputs whose strides are 0 in some dimension (``expand``-ed masks) keep those strides in their buffer and
are copied over one element along each expanded dimension.

The device work goes through a runtime (runtime/device.py): CUDA's own, or the simulator that replays the
same logic on the CPU for the tests of a machine without a GPU.

Host work (ops that host placement put on the CPU, passes/host_placement.py) cannot be captured: a CUDA
graph records device work only, and a host value read by a kernel would be frozen at its recording value.
The graph is therefore cut in three (lowering/host_split.py, run by ``runtime.host.HostSplit``), each piece
lowered on its own:

- **static host work** depends on the shape key alone (SymInt inputs, sizes, constants; never on the data
  of a CPU input, never random). It runs once per key, when the key is recorded; its results are kept with
  the key, and the host-to-device copies of them are made once, into device tensors the CUDA graph reads as
  constants. Static SymInts and 0-dim CPU scalars that device ops read directly are baked into the recording,
  which is right because they are the same for every call of the key;
- **per-call host work** depends on the data of CPU inputs (or is random). It runs before every replay (the
  host prologue), and each of its values that the device reads is copied into a static device buffer that
  the CUDA graph reads: ``buffer.copy_(value, non_blocking=...)`` on the replay's stream, ordered before the
  replay. Host placement's own copies come from pinned memory and are asynchronous; a copy that was in the
  user's graph keeps its own ``non_blocking`` (a user's CPU tensor may be reused as soon as the call returns);
- **the device part** reads the graph inputs plus those buffers and constants, and is what is captured.

Outputs that are host values are returned from the prologue (static ones cloned, as the caller may write to
them). Results therefore equal the uncaptured run, which equals eager. (In reduce-overhead, host placement
also sends per-call CPU scalars that kernels read, such as the floats Dynamo passes as inputs with
``dynamic=True``, through such a copy.) A graph whose device work reads a per-call host value any other way
(a SymInt or Python number computed from input data, a CPU tensor a kernel reads directly) is refused by
:func:`airgraph.lowering.capture_plan.find_uncapturable` and runs uncaptured.

(Over 400 lines because reduce-overhead's whole policy is documented here, beside the one class that carries
it out; the output copy policy's code is outputs.py, the host work's host.py.)
"""

from __future__ import annotations

import enum
import logging
import operator
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from airgraph.runtime.device import BORROWED, CUDA, FOREACH_COPY_DTYPES, CaptureError, DeviceRuntime
from airgraph.runtime.fastpath import MISS
from airgraph.runtime.feeding import FeedError
from airgraph.runtime.host import HostSplit, refill
from airgraph.runtime.outputs import (
    Handed,
    copy_out,
    expanded_dims,
    hand,
    hand_out,
    handed_records,
    memory_copier,
    output_plan,
    storage,
)

log = logging.getLogger("airgraph")
_warned = {"unfed": False}  # warnings given once per process

# Static inputs that move often: a recording that served fewer than PAID_REPLAYS replays before its static inputs
# moved did not pay for itself; after MAX_RECAPTURES such recordings in a row the key runs uncaptured for good (they
# move every call or every other call: recording would cost every call). A recording that served more resets the
# count: HF ``generate`` makes a new static cache (addresses marked static) per call and replays it once per new
# token after the first, so one re-recording per generate call, however few its tokens, is what its users want
# (CUDAGraph Trees re-record such inputs too).
MAX_RECAPTURES = 3
PAID_REPLAYS = 2

# all(tensors[i].data_ptr() == ptrs[i] for i in indices), in C++; bound in CUDA builds of PyTorch only.
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_data_ptr = torch.Tensor.data_ptr


class CaptureState(enum.Enum):
    WARMUP = "warmup"
    CAPTURED = "captured"
    UNCAPTURED = "uncaptured"


@dataclass
class _Key:
    state: CaptureState
    warmups: int = 0
    graph: Any = None  # the runtime's graph (a torch.cuda.CUDAGraph on CUDA)
    static_args: list[Any] = field(default_factory=list)
    static_outputs: Sequence[Any] = ()
    static_ptrs: list[int | None] = field(default_factory=list)  # GraphCapture._static_ptrs
    static_checked: list[int] = field(default_factory=list)  # positions of static tensor inputs
    static_getter: Callable[[list], Sequence[Any]] = tuple  # the static tensor inputs of an argument list
    checked_ptrs: list[int] = field(default_factory=list)  # their addresses at the recording
    copy_indices: tuple[int, ...] = ()
    # HostSplit only: the key's static host values, and (static buffer, transfer) pairs refilled per call.
    statics: list[Any] = field(default_factory=list)
    refill: list[tuple[torch.Tensor, Any]] = field(default_factory=list)
    # Inputs copied into their buffers before a replay: per device and dtype, (the buffers, the getter of the
    # inputs), one runtime.copy_many each; expanded inputs (stride 0) and dtypes copy_many is not given one by one,
    # (input, buffer, copier).
    batches: list[tuple[list[Any], Callable[[list], Sequence[Any]]]] = field(default_factory=list)
    copies: list[tuple[int, Any, Callable[[Any, Any], Any]]] = field(default_factory=list)
    copy_back: tuple[int, ...] = ()  # mutated inputs copied back from their buffers after a replay
    # Inputs whose buffers the graph fills itself (in-graph input copies: GraphCapture._fed), and their getter: given
    # to runtime.feed before each replay, never copied by copy_many
    fed: tuple[int, ...] = ()
    fed_getter: Callable[[list], Sequence[Any]] = tuple
    recaptures: int = 0  # times its graph was dropped and recorded again (static inputs moved, or fed copies failed)
    quick_moves: int = 0  # of those in a row, the moves that came before the recording paid (PAID_REPLAYS)
    replays_at_record: int = 0  # ``replays`` when the current graph was recorded
    outputs: list[tuple] = field(default_factory=list)  # runtime.outputs.output_plan
    handed: list[Any] = field(default_factory=list)  # runtime.outputs.handed_records, per output
    handed_storages: list[Handed] = field(default_factory=list)  # the records of the pool-memory storages
    owned: list[torch.Tensor] = field(default_factory=list)  # the buffers GraphCapture allocated for the graph
    replays: int = 0
    # (output, its Handed record) per output where every output is in the graph's memory and the capture hands
    # outputs out, the inputs are copied in batches only, none back, and there is no host work (a decode step); None
    # elsewhere. _replay takes that case while the pool hands outputs out (not copy_outputs).
    lean: list[tuple[Any, Handed]] | None = None


class MemoryPool:
    """Per device: one CUDA graph memory pool and one capture stream, shared by every graph and key of a backend.

    Warm-up runs and recordings both happen on the capture stream (as CUDAGraph Trees do), so whatever a
    first run sets up per stream (Triton autotuning) is set up for the stream recorded. The pool also remembers
    the stream of the last replay on each device: every graph's replay is ordered after it (graphs of the pool
    share its memory). An empty graph captured into the pool keeps it alive (module docstring). A pool that a failed
    capture left spent (runtime/device.py: the pinned host allocator still allocates into it) is retired: later
    captures take a fresh pool, and the graphs recorded into the old one keep it alive as long as they live.
    """

    def __init__(self, runtime: DeviceRuntime = CUDA) -> None:
        self.runtime = runtime
        self._handles: dict[Any, Any] = {}
        self._keepers: dict[Any, Any] = {}  # device -> the empty graph holding a use of its pool
        self._streams: dict[Any, Any] = {}
        self.last_stream: dict[Any, Any] = {}
        self.last_stream_id: dict[Any, Any] = {}  # of last_stream, by the runtime's stream_reader
        # Storages of the static inputs (parameters, buffers) of every graph recorded in this pool: a backward
        # graph's input that is a view of one (a weight saved for backward) is used in place too.
        self.static_storages: dict[int, weakref.ref] = {}  # storage address -> a tensor using it
        # Outputs handed to callers without a copy (module docstring: Outputs), settled before the next replay;
        # copy_outputs: set for good once one was held in a way that cannot be moved (then every replay copies).
        self.handed: list[Handed] = []
        self.copy_outputs = False
        self.held_warned = False

    def handle(self, device: torch.device) -> Any:
        if device not in self._handles:
            handle = self.runtime.pool_handle()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
                keeper, _ = self.runtime.capture(_nothing, [], pool=handle, stream=self.stream(device), device=device)
            self._handles[device], self._keepers[device] = handle, keeper
        return self._handles[device]

    def retire(self, device: torch.device) -> None:
        """No later capture on ``device`` goes into its current pool (a failed capture spent it)."""
        self._handles.pop(device, None)
        self._keepers.pop(device, None)

    def settle(self) -> bool:
        """Before a replay: every output handed without a copy is free to overwrite (dropped, or moved to a copy
        of its own). False while one is held by something that cannot be moved (a view of it): the replay must
        not run; from then on replays copy their outputs (``copy_outputs``)."""
        handed = self.handed
        if len(handed) == 1 and handed[0].dropped():  # a replay's outputs in one storage (a decode step's logits)
            self.handed = []
            return True
        reading = self.runtime.reading
        held = [h for h in handed if not h.settle(reading)]
        self.handed = held
        if held:
            self.copy_outputs = True
        return not held

    def stream(self, device: torch.device) -> Any:
        if device not in self._streams:
            self._streams[device] = self.runtime.new_stream(device)
        return self._streams[device]


def _nothing(args: list) -> list:
    return []


ShapeKeyObserver = Callable[[tuple, list], None]  # (the new key, the arguments of its first call)


def input_key(args: list, positions: Sequence[int]) -> tuple:
    """The input-shape key: dtype, sizes, strides and device of every tensor input at ``positions`` (the
    non-static ones), the value of every other input there."""
    return tuple(
        (a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor) else a
        for a in map(args.__getitem__, positions)
    )


class ObservedRun:
    """A boxed callable telling an observer of each new input-shape key once, with that call's arguments: what
    GraphCapture does for its keys, for a graph that is not captured (max-autotune, the CPU)."""

    def __init__(self, run: Callable[[list], Any], observer: ShapeKeyObserver, static_indices: Sequence[int]) -> None:
        self._boxed_call = True  # an instance attribute, as GraphCapture's
        self._run, self._observer = run, observer
        self._static = frozenset(static_indices)
        self._positions: list[int] | None = None
        self._seen: set[tuple] = set()

    def __call__(self, args: list) -> Any:
        if self._positions is None:
            self._positions = [i for i in range(len(args)) if i not in self._static]
        key = input_key(args, self._positions)
        if key not in self._seen:
            self._seen.add(key)
            self._observer(key, args)
        return self._run(args)


class CaptureReport(Protocol):
    """What GraphCapture keeps up to date in the graph's report (report/schema.py's GraphReport)."""

    id: int
    captured: bool
    capture_keys: int
    recaptures: int
    uncaptured_reason: str | None


class GraphCapture:
    """Wraps a boxed executor (or a :class:`HostSplit`); records and replays it per input-shape key."""

    def __init__(
        self,
        run: Callable[[list], Any],
        *,
        device: torch.device,
        static_indices: Sequence[int],
        mutated_indices: Sequence[int],
        pool: MemoryPool,
        capture_limit: int,
        warmup_iters: int,
        report: CaptureReport,
        uncapturable: str | None = None,
        input_views: dict[int, int] | None = None,
        host_split: HostSplit | None = None,
        observer: ShapeKeyObserver | None = None,
        hand_out: bool = True,
        in_graph_copies: bool = False,
    ) -> None:
        """``input_views``: graph output position -> input position for outputs that are views of inputs (of the
        graph ``run`` executes: with ``host_split``, its device part's). ``host_split``: ``run`` is this HostSplit,
        whose host work runs around the replay. ``observer(key, args)`` is told of each new shape key, once, with
        the first call's arguments (before they are used: static kernels record shapes there). ``hand_out``: outputs
        may go to the caller without a copy (inference graphs; a training step's outputs are saved for its backward,
        which holds them in ways that cannot be moved, so they are copied out). ``in_graph_copies``: the graphs fill
        their input buffers themselves where the runtime can (``config.reduce_overhead.input_copies``: _fed)."""
        # AOTAutograd passes the inputs as one list. An instance attribute: AOTAutograd wraps the backward's
        # callable (torch._dynamo.disable, functools.wraps), which copies the instance's __dict__ only.
        self._boxed_call = True
        self._run = run
        self._split = host_split
        self._observer = observer
        self._hand_out = hand_out
        self.device = device
        self._feed = in_graph_copies and pool.runtime.can_feed
        if in_graph_copies and not self._feed and pool.runtime.can_capture and not _warned["unfed"]:
            _warned["unfed"] = True
            log.warning(
                "airgraph: reduce_overhead.input_copies='in-graph' needs NVIDIA's cuda.bindings with a working CUDA "
                "runtime (torch's Linux CUDA wheels install it; pip install cuda-bindings); inputs are copied with a "
                "launch before each replay"
            )
        self._static = sorted(set(static_indices))
        self._static_set = frozenset(self._static)
        self._mutated = sorted(set(mutated_indices) - self._static_set)
        self._moved: set[int] = set()  # inputs guessed static (views of parameters) whose address changed
        self._pool = pool
        self._limit = capture_limit
        self._warmup_iters = warmup_iters
        self._report = report
        self._input_views = input_views or {}
        self._keys: dict[tuple, _Key] = {}
        self._dynamic: list[int] | None = None
        self._limit_warned = False
        self._runtime = pool.runtime
        self._stream_id = self._runtime.stream_reader(device)
        uncapturable = uncapturable or self._runtime.capture_refusal(device)
        self._uncapturable = uncapturable
        if uncapturable:
            report.uncaptured_reason = uncapturable
            log.warning("airgraph: graph %d runs uncaptured in reduce-overhead: %s", report.id, uncapturable)

    # -- keys --------------------------------------------------------------------------------------------
    def _key(self, args: list) -> tuple:
        if self._dynamic is None:
            self._dynamic = [i for i in range(len(args)) if i not in self._static_set]
        return input_key(args, self._dynamic)

    def _static_ptrs(self, args: list, static: Sequence[int]) -> list[int | None]:
        """Per input position: the address of a static input (a parameter or buffer), None elsewhere."""
        ptrs: list[int | None] = [None] * len(args)
        for i in static:
            if isinstance(args[i], torch.Tensor):
                ptrs[i] = args[i].data_ptr()
        return ptrs

    def _static_moved(self, args: list, entry: _Key) -> bool:
        """Whether a static input's address differs from the recording's (a parameter or buffer moved)."""
        if _PTRS_EQUAL is not None:  # CUDA builds: the check CUDAGraph Trees use, in C++ (it costs what Python's does)
            return not _PTRS_EQUAL(args, entry.static_ptrs, entry.static_checked)
        return list(map(_data_ptr, entry.static_getter(args))) != entry.checked_ptrs

    # -- calls -------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> Any:
        if self._uncapturable:
            return self._run(args)
        key = self._key(args)
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = self._new_key()
            if self._observer is not None:
                self._observer(key, args)
        if entry.state is CaptureState.CAPTURED:
            if self._static_moved(args, entry):
                self._moved |= {i for i in entry.static_checked if i not in self._static_set and _moved(args, entry, i)}
                log.info("airgraph: graph %d: a parameter or buffer moved; re-capturing", self._report.id)
                paid = entry.replays - entry.replays_at_record >= PAID_REPLAYS
                entry.quick_moves = 0 if paid else entry.quick_moves + 1
                self._record_again(entry)
                if entry.quick_moves > MAX_RECAPTURES:  # they move every call: recording would cost every call
                    entry.state = CaptureState.UNCAPTURED
                    reason = (
                        f"parameters or buffers moved {entry.quick_moves} times in a row, each before its recording "
                        f"served {PAID_REPLAYS} replays (new tensors assigned between calls?); this shape key runs "
                        "uncaptured: update them in place (copy_) to keep replaying"
                    )
                    self._report.uncaptured_reason = reason
                    log.warning("airgraph: graph %d: %s", self._report.id, reason)
            else:
                return self._replay(entry, args)
        if entry.state is CaptureState.UNCAPTURED:
            return self._run(args)
        # WARMUP: run for real (this call's results), then record if warm enough. Recording executes
        # nothing, so the call's side effects happen exactly once. The recording's input buffers hold this call's
        # inputs, copied before the warm-up can mutate them (see _input_buffers).
        keep = list(args)
        recording = entry.warmups + 1 >= self._warmup_iters
        buffers = self._input_buffers(keep) if recording else None
        outputs = self._warmup(args)
        entry.warmups += 1
        if buffers is not None:
            self._record(entry, keep, *buffers)
        return outputs

    def fast_replayer(self, args: list, per_call: set[int]) -> Callable[[list], Any] | None:
        """For the fast path (runtime/fastpath.py), once the key of ``args`` is recorded (else None): the call
        that replays it for the calls of one signature, or returns :data:`MISS` (left to ``torch.compile``, whose
        guards recompile for a new dtype or device) when the key is not recorded any more or a static input moved.
        The static inputs are the same tensors every call (kept with the replayer) unless one is at a position
        ``per_call`` (an argument of the call that views a parameter's memory): then they are read from each call's
        arguments."""
        if self._uncapturable:
            return None
        entry = self._keys.get(self._key(args))
        if entry is None or entry.state is not CaptureState.CAPTURED:
            return None
        captured, moved, replay = CaptureState.CAPTURED, self._static_moved, self._replay
        if per_call & set(entry.static_checked):

            def fast_replay(args: list) -> Any:
                if entry.state is not captured or moved(args, entry):
                    return MISS
                return replay(entry, args)

        else:  # the same tensors every call, kept here: 0.3 us a call cheaper than _static_moved (replay_host_cost)
            statics = tuple(args[i] for i in entry.static_checked)

            def fast_replay(args: list) -> Any:
                if entry.state is not captured or list(map(_data_ptr, statics)) != entry.checked_ptrs:
                    return MISS
                return replay(entry, args)

        fast_replay.key = entry  # type: ignore[attr-defined]  # (tests and benchmarks look at it)
        return fast_replay

    def _new_key(self) -> _Key:
        captured = sum(1 for k in self._keys.values() if k.state is not CaptureState.UNCAPTURED)
        if captured >= self._limit:
            if not self._limit_warned:
                self._limit_warned = True
                log.warning(
                    "airgraph: graph %d reached its capture limit of %d shape keys; new shapes run uncaptured "
                    "(raise config.reduce_overhead.capture_limit, or mark dims dynamic to need fewer keys)",
                    self._report.id,
                    self._limit,
                )
            return _Key(CaptureState.UNCAPTURED)
        return _Key(CaptureState.WARMUP)

    def _drop(self, entry: _Key) -> None:
        """Forget a key's graph and the memory it used. The buffers GraphCapture allocated for it are freed once
        the last replay's stream is done with them: that stream may differ from the one that allocated them, and
        the caching allocator gives a freed block to that stream's next allocation at once."""
        last = self._pool.last_stream.get(self.device)
        if last is not None:
            for buffer in entry.owned:
                self._runtime.record_stream(buffer, last)
        entry.graph, entry.static_args, entry.static_outputs, entry.outputs, entry.lean = None, [], (), [], None
        entry.handed, entry.handed_storages, entry.copies, entry.batches = [], [], [], []
        entry.fed, entry.fed_getter = (), tuple
        entry.statics, entry.refill, entry.owned = [], [], []

    def _warmup(self, args: list) -> Any:
        """Run uncaptured on the capture stream, ordered after and before the caller's stream; cuBLAS workspaces
        cleared before and after (module docstring)."""
        runtime = self._runtime
        caller = runtime.current_stream(self.device)
        side = self._pool.stream(self.device)
        side.wait_stream(caller)
        runtime.clear_blas_workspaces()
        try:
            with runtime.use(side):
                outputs = self._run(args)
        finally:
            runtime.clear_blas_workspaces()
        caller.wait_stream(side)
        for out in outputs:  # allocated on the side stream, used on the caller's: don't reuse them early
            if isinstance(out, torch.Tensor):
                runtime.record_stream(out, caller)
        return outputs

    def _input_buffers(self, args: list) -> tuple[set[int], list[Any]]:
        """The inputs used in place (positions), and the recording's inputs: those, and for every other device
        input a static buffer of its own, holding the input's value. Its contents are copied in again before each
        replay; a CUDA recording reads no data, but this call's inputs (as CUDAGraph Trees record with) are the
        values a run of the recording would see, where uninitialized memory could hold an index out of range (the
        simulator runs the function while recording). Made before the warm-up, which may mutate inputs. Host work's
        inputs are read outside the graph."""
        static = self._static_set | self._views_of_static(args)
        buffers = [
            a if i in static or not _is_device_tensor(a, i, self._split) else self._runtime.static_buffer(a)
            for i, a in enumerate(args)
        ]
        for buffer, a in zip(buffers, args, strict=True):
            if buffer is not a:
                memory_copier(self._runtime.copy_, buffer)(buffer, a)
        return static, buffers

    def _record(self, entry: _Key, args: list, static: set[int], buffers: list[Any]) -> None:
        """Record the key's graph on ``buffers`` (:meth:`_input_buffers`; ``static``: the inputs used in place)."""
        split = self._split
        static_args, capture_fn = list(buffers), self._run
        if split is not None:  # host work: this call's (the warm-up just ran it), outside the recording
            statics, values = split.last_run
            split.last_run = None
            entry.statics = statics
            boundary = split.boundary(values)
            transfers = split.transfers  # the boundary holds their copies first, then the feeds
            entry.refill = [(b, t) for b, t in zip(boundary[: len(transfers)], transfers, strict=True) if not t.static]
            static_args, capture_fn = [*buffers, *boundary], split.device_fn
        fed, refused = self._fed(args, buffers), None
        while True:
            self._runtime.clear_blas_workspaces()  # the recording's GEMMs get their workspace from the pool
            try:
                graph, static_outputs = self._runtime.capture(
                    capture_fn,
                    list(static_args),
                    pool=self._pool.handle(self.device),
                    stream=self._pool.stream(self.device),
                    device=self.device,
                    fed=fed,
                )
                break
            except Exception as exc:  # with in-graph input copies: again without them; else the key runs uncaptured
                if isinstance(exc, CaptureError) and exc.pool_spent:
                    self._pool.retire(self.device)
                if fed:  # (a FeedError, or a capture or instantiation the copies may have broken)
                    refused, fed = exc, []
                    continue
                entry.state = CaptureState.UNCAPTURED
                what = str(exc) if isinstance(exc, CaptureError) else f"{type(exc).__name__}: {exc}"
                reason = f"CUDA graph capture failed: {what.splitlines()[0]}"
                self._report.uncaptured_reason = reason
                log.warning("airgraph: graph %d runs uncaptured: %s", self._report.id, reason)
                return
            finally:
                self._runtime.clear_blas_workspaces()
        if refused is not None:  # recorded without the copies: they were the trouble
            log.warning(
                "airgraph: graph %d: recording its input copies in the graph failed (%s); they are launched before "
                "each replay from now on",
                self._report.id,
                refused,
            )
            self._feed = False
        entry.graph, entry.static_args, entry.static_outputs = graph, static_args, static_outputs
        entry.owned = [a for i, a in enumerate(static_args) if i >= len(args) or a is not args[i]]
        entry.static_ptrs = self._static_ptrs(static_args, sorted(static))
        entry.static_checked = [i for i in sorted(static) if entry.static_ptrs[i] is not None]
        entry.checked_ptrs = [entry.static_ptrs[i] for i in entry.static_checked]
        entry.static_getter = _getter(entry.static_checked)
        self._pool.static_storages.update(
            (storage(args[i]), weakref.ref(args[i])) for i in self._static if isinstance(args[i], torch.Tensor)
        )
        entry.copy_indices = tuple(i for i in range(len(args)) if static_args[i] is not args[i])
        entry.fed = tuple(i for i, _ in fed)
        entry.fed_getter = _getter(list(entry.fed))
        launched = [i for i in entry.copy_indices if i not in entry.fed]
        entry.batches, entry.copies = _input_copies(static_args, launched, self._runtime)
        entry.copy_back = tuple(i for i in self._mutated if i in entry.copy_indices)
        entry.outputs = output_plan(static_outputs, static_args, len(args), entry.copy_indices, self._input_views)
        entry.handed = handed_records(static_outputs, entry.outputs)
        entry.handed_storages = list({id(h): h for h in entry.handed if h is not None}.values())
        plain = split is None and not entry.copies and not entry.copy_back and None not in entry.handed
        entry.lean = list(zip(static_outputs, entry.handed, strict=True)) if plain and self._hand_out else None
        # Tensors used in place are the caller's (parameters, a static cache): kept by addresses, not alive (as a
        # CUDA graph keeps them), so a cache freed after its last call leaves its memory to the next one
        entry.static_args = [
            BORROWED if i < len(args) and a is args[i] and _is_device_tensor(a, i, split) else a
            for i, a in enumerate(static_args)
        ]
        entry.state, entry.replays_at_record = CaptureState.CAPTURED, entry.replays
        self._report.captured = True
        if entry.recaptures:
            self._report.recaptures += 1  # recorded again (a parameter moved, or its input copies failed)
        else:
            self._report.capture_keys += 1

    def _fed(self, args: list, buffers: list) -> list[tuple[int, torch.Tensor]]:
        """With in-graph input copies, the inputs whose buffers the graph fills itself, each with the recording
        call's tensor as its recorded source (runtime/feeding.py): device tensors with a buffer of their own, laid out
        as it (the same dtype, dense, not expanded, no conjugate or negative bit: a copy of their bytes), not empty.
        The key fixes dtype, sizes and strides, and Dynamo's guards the dispatch keys: every call's tensor there is
        laid out the same. The others, and all of them where the runtime cannot feed a graph, are copied by a launch
        before each replay."""
        if not self._feed:
            return []
        return [
            (i, a)
            for i, (a, b) in enumerate(zip(args, buffers, strict=True))
            if b is not a
            and _is_device_tensor(a, i, self._split)
            and a.dtype == b.dtype
            and a.device == b.device
            and a.numel()
            and a.is_contiguous()
            and b.is_contiguous()
            and not expanded_dims(b)
            and not (a.is_conj() or a.is_neg())
        ]

    def _views_of_static(self, args: list) -> set[int]:
        """Inputs (not mutated) whose memory is a static input's of a graph recorded in this pool: used in place,
        their addresses checked like the static inputs'. A guess is dropped for good once its address moves
        (a view at a changing offset), so it costs at most one re-capture, never a result."""
        storages, skip = self._pool.static_storages, set(self._mutated) | self._moved
        found = set()
        for i, a in enumerate(args):
            if (
                not isinstance(a, torch.Tensor)
                or i in skip
                or i in self._static_set
                or not a.untyped_storage().nbytes()
            ):
                continue
            owner = storages.get(storage(a))
            owner = owner() if owner is not None else None
            if owner is not None and storage(owner) == storage(a):  # still that parameter's memory
                found.add(i)
        return found

    def _replay(self, entry: _Key, args: list) -> list[Any]:
        pool = self._pool
        stream_id = self._stream_id()
        if pool.last_stream_id.get(self.device) != stream_id:  # before settling: its copy reads the last replay's
            self._follow(stream_id)
        if pool.handed and not pool.settle():
            return self._held(args)
        runtime = self._runtime
        if entry.fed:  # after settling (which may move a handed output an input is), before any per-call work
            try:
                runtime.feed(entry.graph, entry.fed_getter(args))
            except FeedError as exc:
                return self._unfed(entry, args, exc)
        if entry.lean is not None and not pool.copy_outputs:  # a decode step's case (_Key.lean), with less to ask
            for buffers, inputs in entry.batches:
                runtime.copy_many(buffers, inputs(args))
            runtime.replay(entry.graph, entry.static_args, args)
            entry.replays += 1
            args.clear()
            pool.handed = entry.handed_storages
            return [hand(out, record) for out, record in entry.lean]
        static_args = entry.static_args
        split, values = self._split, None
        if split is not None:  # the host prologue, then its values into the graph's buffers
            values = [*args, *entry.statics, *split.run_per_call(args, entry.statics)]
            for buffer, transfer in entry.refill:
                refill(transfer, buffer, values[transfer.source], runtime)
        for buffers, inputs in entry.batches:
            runtime.copy_many(buffers, inputs(args))
        for i, buffer, copy in entry.copies:  # copy_, or over the memory of expanded dims
            copy(buffer, args[i])
        runtime.replay(entry.graph, static_args, args)
        entry.replays += 1
        for i in entry.copy_back:  # mutated inputs that had a buffer (CPU inputs were mutated in place)
            if static_args[i].data_ptr() != args[i].data_ptr():
                runtime.copy_(args[i], static_args[i])
        runtime.reading(entry.static_outputs)
        if pool.copy_outputs or not self._hand_out:
            outputs = copy_out(entry.static_outputs, entry.outputs, static_args, args)
        else:  # pool.handed is empty: settled above
            outputs = hand_out(entry.static_outputs, entry.outputs, static_args, args, entry.handed)
            pool.handed = entry.handed_storages
        args.clear()
        return outputs if split is None else split.assemble(outputs, values, clone_static=True)

    def _unfed(self, entry: _Key, args: list, exc: FeedError) -> Any:
        """The runtime failed to point the key's graph at this call's inputs (a CUDA error): this call runs
        uncaptured, and the key is recorded again at its next call, with copy launches (no fed graph from now on)."""
        log.warning(
            "airgraph: graph %d: pointing its input copies at the call's tensors failed (%s); it is recorded again "
            "with the copies launched before each replay",
            self._report.id,
            exc,
        )
        self._feed = False
        self._record_again(entry)
        return self._warmup(args)

    def _record_again(self, entry: _Key) -> None:
        """Drop the key's graph; its next call records it again (a re-recording, counted in ``recaptures``)."""
        entry.recaptures += 1
        self._drop(entry)
        entry.state, entry.warmups = CaptureState.WARMUP, self._warmup_iters - 1

    def _follow(self, stream_id: Any) -> None:
        """The caller's stream is not the last replay's on this device: it waits for that one first (graphs share
        the pool's memory), and is the last one from now on."""
        pool, stream = self._pool, self._runtime.current_stream(self.device)
        last = pool.last_stream.get(self.device)
        if last is not None and last != stream:
            stream.wait_stream(last)
        pool.last_stream[self.device], pool.last_stream_id[self.device] = stream, stream_id

    def _held(self, args: list) -> Any:
        """A replay would overwrite an earlier output that is still held through a view: run uncaptured instead
        (fresh memory), until that output is let go."""
        if not self._pool.held_warned:
            self._pool.held_warned = True
            log.warning(
                "airgraph: graph %d: an output of an earlier replay is still held through a view, and the next "
                "replay would overwrite it; this call runs uncaptured, and replays copy their outputs from now on "
                "(keep what you need of an output with .clone(), or drop the view before the next call)",
                self._report.id,
            )
        return self._warmup(args)


def _getter(positions: list[int]) -> Callable[[list], Sequence[Any]]:
    """``lambda args: [args[i] for i in positions]``, as fast as Python gets it."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        return lambda args, i=positions[0]: (args[i],)
    return operator.itemgetter(*positions)


def _input_copies(static_args: list, indices: Sequence[int], runtime: DeviceRuntime) -> tuple[list, list]:
    """How a replay copies the inputs at ``indices`` into their buffers (``static_args``): per device and dtype
    (a CPU scalar a CUDA graph reads has a CPU buffer), one ``runtime.copy_many`` of (the buffers, a getter of the
    inputs); one by one an expanded buffer (stride 0), over the memory it really has (outputs.memory_copier), and
    a dtype CUDA's foreach copy refuses."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    one_by_one = []
    for i in indices:
        buffer = static_args[i]
        if expanded_dims(buffer) or buffer.dtype not in FOREACH_COPY_DTYPES:
            one_by_one.append((i, buffer, memory_copier(runtime.copy_, buffer)))
        else:
            groups.setdefault((buffer.device, buffer.dtype), []).append(i)
    batches = [([static_args[i] for i in group], _getter(group)) for group in groups.values()]
    return batches, one_by_one


def _moved(args: list, entry: _Key, i: int) -> bool:
    return args[i].data_ptr() != entry.static_ptrs[i]


def _is_device_tensor(value: Any, position: int, split: HostSplit | None) -> bool:
    """Inputs that get a static buffer: every tensor, or with host work split off, the graph's device tensors only
    (as traced: in the simulator, CPU tensors stand for CUDA ones)."""
    if not isinstance(value, torch.Tensor):
        return False
    return split is None or position not in split.host_inputs
