"""reduce-overhead: capture the executor's run in a CUDA graph and replay it, one graph per shape key.

:class:`GraphCapture` is the boxed callable the backend returns. Per call it finds the key's state
(runtime/keys.py) and then warms up (WARMUP), records (runtime/recording.py, which makes a frozen
``RecordedGraph``), replays (runtime/replay.py) or runs uncaptured (UNCAPTURED). A recorded key whose static
inputs moved records again, or gives up, by runtime/recapture.py's policy. All graphs of a backend share one
:class:`~airgraph.runtime.pool.MemoryPool`.

Invariants: a call's side effects happen exactly once (a recording executes nothing); warm-ups and recordings
run on the pool's capture stream, with cuBLAS workspaces cleared around them; a key holds at most one recording,
dropped by one assignment after its owned buffers are handed to the last replay's stream; at most
``capture_limit`` keys are ever captured. docs/design/capture.md has the whole policy (inputs, memory, outputs,
streams, host work); this module re-exports the names other packages use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.log import log, warn_once
from airgraph.runtime.host import HostSplit
from airgraph.runtime.keys import MISS, CaptureState, KeyState, ObservedRun, ShapeKeyObserver, input_key
from airgraph.runtime.pool import MemoryPool
from airgraph.runtime.recapture import MAX_RECAPTURES, PAID_REPLAYS, RecapturePolicy, static_moved
from airgraph.runtime.recording import CaptureReport, Recorder
from airgraph.runtime.replay import Replayer

__all__ = [
    "MAX_RECAPTURES",
    "PAID_REPLAYS",
    "CaptureReport",
    "CaptureState",
    "GraphCapture",
    "KeyState",
    "MemoryPool",
    "ObservedRun",
    "ShapeKeyObserver",
    "input_key",
]

_data_ptr = torch.Tensor.data_ptr


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
        unread_indices: Sequence[int] = (),
    ) -> None:
        """``input_views``: graph output position -> input position for outputs that are views of inputs (of the
        graph ``run`` executes: with ``host_split``, its device part's). ``host_split``: ``run`` is this HostSplit,
        whose host work runs around the replay. ``observer(key, args)`` is told of each new shape key, once, with
        the first call's arguments (before they are used: static kernels record shapes there). ``hand_out``: outputs
        may go to the caller without a copy (inference graphs; a training step's outputs are saved for its backward,
        which holds them in ways that cannot be moved, so they are copied out). ``in_graph_copies``: the graphs fill
        their input buffers themselves where the runtime can (``config.reduce_overhead.input_copies``).
        ``unread_indices``: static inputs the graph does not read (frozen parameters, held as constants): used in
        place like the others, but their addresses are not checked before a replay."""
        boxed(self)  # AOTAutograd passes the inputs as one list
        self._run = run
        self._observer = observer
        self.device = device
        self._pool = pool
        self._limit = capture_limit
        self._warmup_iters = warmup_iters
        self._report = report
        self._runtime = pool.runtime
        static = sorted(set(static_indices) | set(unread_indices))
        self._static_set = frozenset(static)
        mutated = sorted(set(mutated_indices) - self._static_set)
        self._policy = RecapturePolicy(pool, static, mutated)
        feed = in_graph_copies and self._runtime.can_feed
        if in_graph_copies and not feed and self._runtime.can_capture:
            warn_once(
                "in-graph-copies-unavailable",
                "airgraph: reduce_overhead.input_copies='in-graph' needs NVIDIA's cuda.bindings with a working CUDA "
                "runtime (torch's Linux CUDA wheels install it; pip install cuda-bindings); inputs are copied with a "
                "launch before each replay",
                to_log=True,
            )
        self._recorder = Recorder(
            run,
            device=device,
            pool=pool,
            policy=self._policy,
            report=report,
            split=host_split,
            mutated=mutated,
            input_views=input_views or {},
            hand_out=hand_out,
            feed=feed,
            unread=unread_indices,
        )
        self._replay = Replayer(
            device=device,
            pool=pool,
            split=host_split,
            hand_out=hand_out,
            graph_id=report.id,
            warmup=self._warmup,
            unfeed=self._unfeed,
        ).replay
        self.keys: dict[tuple, KeyState] = {}
        self._dynamic: list[int] | None = None
        self._uncapturable = uncapturable or self._runtime.capture_refusal(device)
        if self._uncapturable:
            report.uncaptured_reason = self._uncapturable
            log.warning("airgraph: graph %d runs uncaptured in reduce-overhead: %s", report.id, self._uncapturable)

    _static_moved = staticmethod(static_moved)

    # -- keys --------------------------------------------------------------------------------------------
    def key_of(self, args: list) -> tuple:
        """The shape key of a call's arguments (runtime/keys.py's input_key of the non-static ones)."""
        if self._dynamic is None:
            self._dynamic = [i for i in range(len(args)) if i not in self._static_set]
        return input_key(args, self._dynamic)

    def _key_state(self, args: list) -> KeyState:
        """The state of the key of ``args``, made (and told to the observer) on its first call."""
        key = self.key_of(args)
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = self._new_key()
            if self._observer is not None:
                self._observer(key, args)
        return state

    def _new_key(self) -> KeyState:
        captured = sum(1 for k in self.keys.values() if k.state is not CaptureState.UNCAPTURED)
        if captured < self._limit:
            return KeyState(CaptureState.WARMUP)
        warn_once(
            ("capture-limit", self._report.id),
            "airgraph: graph %d reached its capture limit of %d shape keys; new shapes run uncaptured "
            "(raise config.reduce_overhead.capture_limit, or mark dims dynamic to need fewer keys)",
            self._report.id,
            self._limit,
            to_log=True,
        )
        return KeyState(CaptureState.UNCAPTURED)

    # -- calls -------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> Any:
        if self._uncapturable:
            return self._run(args)
        key = self._key_state(args)
        if key.state is CaptureState.CAPTURED:
            if not self._static_moved(args, key.recorded):
                return self._replay(key, args)
            self._moved(key, args)
        if key.state is CaptureState.UNCAPTURED:
            return self._run(args)
        # WARMUP: run for real (this call's results), then record if warm enough. Recording executes nothing, so
        # the call's side effects happen exactly once. The recording's input buffers hold this call's inputs,
        # copied before the warm-up can mutate them (Recorder.input_buffers).
        keep = list(args)
        recording = key.warmups + 1 >= self._warmup_iters
        buffers = self._recorder.input_buffers(keep) if recording else None
        outputs = self._warmup(args)
        key.warmups += 1
        if buffers is not None:
            self._record(key, keep, *buffers)
        return outputs

    def fast_replayer(self, args: list, per_call: set[int]) -> Callable[[list], Any] | None:
        """For the fast path (runtime/fastpath.py), once the key of ``args`` is recorded (else None): the call
        that replays it for the calls of one signature, or returns :data:`MISS` (left to ``torch.compile``, whose
        guards recompile for a new dtype or device) when the key is not recorded any more or a static input moved.
        The static inputs are the same tensors every call (kept with the replayer) unless one is at a position
        ``per_call`` (an argument of the call that views a parameter's memory): then they are read from each call's
        arguments. ``.key`` of the replayer is the recording it was made for (tests and benchmarks read it)."""
        if self._uncapturable:
            return None
        key = self.keys.get(self.key_of(args))
        if key is None or key.state is not CaptureState.CAPTURED:
            return None
        captured, replay, recorded = CaptureState.CAPTURED, self._replay, key.recorded
        if per_call & set(recorded.static_checked):

            def fast_replay(args: list) -> Any:
                if key.state is not captured or static_moved(args, key.recorded):
                    return MISS
                return replay(key, args)

        else:  # the same tensors every call, kept here: cheaper than static_moved (docs/design/fastpath.md)
            statics = tuple(args[i] for i in recorded.static_checked)

            def fast_replay(args: list) -> Any:
                if key.state is not captured or tuple(map(_data_ptr, statics)) != key.recorded.checked_ptrs:
                    return MISS
                return replay(key, args)

        fast_replay.key = recorded  # type: ignore[attr-defined]
        return fast_replay

    # -- recording ---------------------------------------------------------------------------------------
    def _record(self, key: KeyState, args: list, static: set[int], buffers: list[Any]) -> None:
        recorded = self._recorder.record(args, static, buffers)
        if isinstance(recorded, str):  # the capture failed: the key runs uncaptured
            key.state = CaptureState.UNCAPTURED
            self._report.uncaptured_reason = recorded
            log.warning("airgraph: graph %d runs uncaptured: %s", self._report.id, recorded)
            return
        key.recorded, key.state, key.replays_at_record = recorded, CaptureState.CAPTURED, key.replays
        self._report.captured = True
        if key.recaptures:
            self._report.recaptures += 1  # recorded again (a parameter moved, or its input copies failed)
        else:
            self._report.capture_keys += 1

    def _moved(self, key: KeyState, args: list) -> None:
        """A static input of ``key``'s recording moved: record again at the next call, or give up for good."""
        log.info("airgraph: graph %d: a parameter or buffer moved; re-capturing", self._report.id)
        reason = self._policy.moved(key, args)
        self._record_again(key)
        if reason is not None:  # they move every call: recording would cost every call
            key.state = CaptureState.UNCAPTURED
            self._report.uncaptured_reason = reason
            log.warning("airgraph: graph %d: %s", self._report.id, reason)

    def _unfeed(self, key: KeyState) -> None:
        """The key's graph could not be fed: no in-graph input copies from now on; the key records again."""
        self._recorder.feed = False
        self._record_again(key)

    def _record_again(self, key: KeyState) -> None:
        """Drop the key's recording; its next call records it again (a re-recording, counted in ``recaptures``).
        The buffers GraphCapture allocated for it are freed once the last replay's stream is done with them: that
        stream may differ from the one that allocated them, and the caching allocator gives a freed block to that
        stream's next allocation at once."""
        key.recaptures += 1
        last = self._pool.last_stream.get(self.device)
        if last is not None:
            for buffer in key.recorded.owned:
                self._runtime.record_stream(buffer, last)
        key.recorded = None
        key.state, key.warmups = CaptureState.WARMUP, self._warmup_iters - 1

    def _warmup(self, args: list) -> Any:
        """Run uncaptured on the capture stream, ordered after and before the caller's stream; cuBLAS workspaces
        cleared before and after (docs/design/capture.md, "cuBLAS workspaces")."""
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
