"""The simulator's happens-before checker: streams as vector clocks, and the accesses, frees and joins it checks.

Each :class:`SimStream` keeps a vector clock; ``wait_stream`` / ``wait_event`` merge clocks as CUDA's waits order
work. :class:`RaceChecker` (a base of ``SimulatedCuda``) records every access to a storage and reports, in
``problems``:

- a race: two accesses to one storage from different streams, at least one a write, not ordered by the clocks;
- an early free: a storage written on one stream and read on another, freed inside a call before the producing
  stream (or a stream given to ``record_stream``) is ordered after every read;
- an unjoined stream: after a call, a stream that did work the caller's stream is not ordered after.

A device synchronize completes all work so far: accesses before it race with nothing after it, and memory it
read may be freed. docs/design/simulator.md has the rules in full.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator

import torch

from airgraph.runtime.outputs import storage

__all__ = ["RaceChecker", "SimEvent", "SimStream", "StreamRaceError"]


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


class RaceChecker:
    """The checker's state and rules; ``SimulatedCuda`` calls :meth:`_allocated` and :meth:`_access` for every
    device access it simulates and gives :meth:`call` its ``placement`` and ``current_stream``."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.default_stream = SimStream("default")
        self.streams: list[SimStream] = [self.default_stream]
        self._history: dict[int, _Accesses] = {}
        self._live: dict[int, int] = {}  # storage -> live tensor objects the checker follows
        self._completed: dict[int, int] = {}  # stream id -> its operations completed by a device synchronize
        self._in_call = False

    def record_stream(self, tensor: torch.Tensor, stream: SimStream) -> None:
        """Like ``Tensor.record_stream``: the storage's free is ordered after ``stream``'s work up to the free."""
        history = self._history.get(storage(tensor))
        if history is not None:
            history.recorded[stream.id] = stream

    def synchronize(self) -> None:
        """The host waits for every stream: all work so far is complete."""
        self._completed = {stream.id: stream.clock[stream.id] for stream in self.streams}

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
