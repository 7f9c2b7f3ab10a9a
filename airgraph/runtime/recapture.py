"""When a recorded key records again: its static inputs moved (a parameter or buffer at a new address).

A recording holds the addresses of the inputs it uses in place, so a moved one makes the key record again.
Static inputs that move often do not pay for it: a recording that served fewer than :data:`PAID_REPLAYS`
replays before they moved counts as a quick move; after :data:`MAX_RECAPTURES` quick moves in a row the key runs
uncaptured for good. Inputs that are views of a static input's memory are guessed static too
(:meth:`RecapturePolicy.views_of_static`); a guess whose address moves once is dropped for good, so it costs at
most one re-capture, never a result. docs/design/capture.md ("Static inputs that move") says why.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from airgraph.runtime.keys import KeyState
from airgraph.runtime.outputs import storage
from airgraph.runtime.pool import MemoryPool
from airgraph.runtime.recorded import RecordedGraph

__all__ = ["MAX_RECAPTURES", "PAID_REPLAYS", "RecapturePolicy", "static_moved"]

MAX_RECAPTURES = 3
PAID_REPLAYS = 2

# all(tensors[i].data_ptr() == ptrs[i] for i in indices), in C++; bound in CUDA builds of PyTorch only.
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_data_ptr = torch.Tensor.data_ptr


def static_moved(args: list, recorded: RecordedGraph) -> bool:
    """Whether a static input's address differs from the recording's (a parameter or buffer moved)."""
    if _PTRS_EQUAL is not None:  # CUDA builds: the check CUDAGraph Trees use, in C++ (it costs what Python's does)
        return not _PTRS_EQUAL(args, recorded.static_ptrs, recorded.static_checked)
    return tuple(map(_data_ptr, recorded.static_getter(args))) != recorded.checked_ptrs


class RecapturePolicy:
    """The static inputs of one GraphCapture (given, and guessed), and whether a key whose static inputs moved
    records again or gives up."""

    def __init__(self, pool: MemoryPool, static: Sequence[int], mutated: Sequence[int]) -> None:
        self._pool = pool
        self.static = frozenset(static)
        self._mutated = frozenset(mutated)
        self.moved_guesses: set[int] = set()  # inputs guessed static (views of parameters) whose address changed

    def moved(self, key: KeyState, args: list) -> str | None:
        """The recording of ``key`` saw its static inputs move in this call: remember the guesses that moved and
        count the move. The reason the key gives up (runs uncaptured for good), or None: it records again."""
        recorded = key.recorded
        assert recorded is not None
        ptrs, guesses = recorded.static_ptrs, (i for i in recorded.static_checked if i not in self.static)
        self.moved_guesses |= {i for i in guesses if args[i].data_ptr() != ptrs[i]}
        paid = key.replays - key.replays_at_record >= PAID_REPLAYS
        key.quick_moves = 0 if paid else key.quick_moves + 1
        if key.quick_moves <= MAX_RECAPTURES:
            return None
        return (
            f"parameters or buffers moved {key.quick_moves} times in a row, each before its recording "
            f"served {PAID_REPLAYS} replays (new tensors assigned between calls?); this shape key runs "
            "uncaptured: update them in place (copy_) to keep replaying"
        )

    def used_in_place(self, args: list) -> set[int]:
        """The inputs a recording of ``args`` uses in place: the static ones and the views of static memory."""
        return self.static | self.views_of_static(args)

    def views_of_static(self, args: list) -> set[int]:
        """Inputs (not mutated) whose memory is a static input's of a graph recorded in this pool: used in place,
        their addresses checked like the static inputs'. A guess is dropped for good once its address moves
        (a view at a changing offset), so it costs at most one re-capture, never a result."""
        storages, skip = self._pool.static_storages, self._mutated | self.moved_guesses
        found = set()
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or i in skip or i in self.static or not a.untyped_storage().nbytes():
                continue
            owner = storages.get(storage(a))
            owner = owner() if owner is not None else None
            if owner is not None and storage(owner) == storage(a):  # still that parameter's memory
                found.add(i)
        return found
