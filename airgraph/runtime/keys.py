"""Shape keys: what tells one recorded graph of a GraphCapture from another, and the mutable state of each.

A key is :func:`input_key` of a call's non-static inputs: dtype, sizes, strides and device of every tensor, the
value of everything else. Its :class:`KeyState` is a few counters, a :class:`CaptureState` and a reference to its
:class:`~airgraph.runtime.recorded.RecordedGraph` (None unless CAPTURED): dropping a recording is one assignment.

States (``CaptureState``): WARMUP (the first ``warmup_iters`` calls run uncaptured), then CAPTURED (recorded once,
replayed on every later call), or UNCAPTURED (the key runs its executor directly for good).

:data:`MISS` is what a fast path's route or a GraphCapture's fast replayer returns for a call it leaves to
``torch.compile``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.runtime.recorded import RecordedGraph

__all__ = ["MISS", "CaptureState", "KeyState", "ObservedRun", "ShapeKeyObserver", "input_key"]

MISS = object()

ShapeKeyObserver = Callable[[tuple, list], None]  # (the new key, the arguments of its first call)


class CaptureState(enum.Enum):
    WARMUP = "warmup"
    CAPTURED = "captured"
    UNCAPTURED = "uncaptured"


@dataclass(slots=True, eq=False)
class KeyState:
    """One shape key of a GraphCapture: its state, its counters and its recording (None unless CAPTURED)."""

    state: CaptureState
    warmups: int = 0
    replays: int = 0
    recaptures: int = 0  # times its recording was dropped and made again (static inputs moved, or feeding failed)
    quick_moves: int = 0  # of those in a row, the moves that came before the recording paid (recapture.py)
    replays_at_record: int = 0  # ``replays`` when the current recording was made
    recorded: RecordedGraph | None = None


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
        boxed(self)
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
