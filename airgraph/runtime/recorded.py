"""What a recording of one shape key produced (:class:`RecordedGraph`): one immutable value, made by
runtime/recording.py, read by the replay paths (runtime/replay.py) and the re-capture policy (recapture.py).

Invariants: a RecordedGraph is never changed after it is made; a key drops it by one assignment (after its
``owned`` buffers are handed to the last replay's stream, ``record_stream``). Positions index the graph's
argument list; tensors used in place (the caller's: parameters, a static cache) are :data:`BORROWED` in
``static_args``, kept by address only, as a CUDA graph keeps them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from airgraph.runtime.outputs import Handed, OutputHow

__all__ = ["RecordedGraph", "getter"]

Getter = Callable[[list], Sequence[Any]]


@dataclass(frozen=True, slots=True, eq=False)
class RecordedGraph:
    """One recording of a shape key: the graph, its arguments and outputs, and how each replay feeds and reads it."""

    graph: Any  # the runtime's graph (a torch.cuda.CUDAGraph, a FedGraph, a SimGraph)
    static_args: tuple[Any, ...]  # the recording's arguments: static buffers, and BORROWED where used in place
    static_outputs: Sequence[Any]
    # Per position, the address of a static input (None elsewhere); the positions of the static tensor inputs; their
    # addresses at the recording, and their getter. Lists: the C++ check (recapture.static_moved) takes lists.
    static_ptrs: list[int | None]
    static_checked: list[int]
    checked_ptrs: tuple[int, ...]
    static_getter: Getter
    copy_indices: tuple[int, ...]  # inputs with a static buffer of their own
    # Inputs copied into their buffers before a replay: per device and dtype, (the buffers, the getter of the
    # inputs), one runtime.copy_many each; one by one (input, buffer, copier) the expanded ones (stride 0) and
    # the dtypes copy_many is not given.
    batches: tuple[tuple[list[Any], Getter], ...]
    copies: tuple[tuple[int, Any, Callable[[Any, Any], Any]], ...]
    copy_back: tuple[int, ...]  # mutated inputs copied back from their buffers after a replay
    # Inputs whose buffers the graph fills itself (in-graph input copies), and their getter: given to runtime.feed
    # before each replay, never copied by copy_many.
    fed: tuple[int, ...]
    fed_getter: Getter
    outputs: tuple[OutputHow, ...]  # runtime.outputs.output_plan
    handed: tuple[Handed | None, ...]  # runtime.outputs.handed_records, per output
    handed_storages: tuple[Handed, ...]  # the records of the pool-memory storages
    owned: tuple[torch.Tensor, ...]  # the buffers GraphCapture allocated for the graph
    # (output, its Handed record) per output where every output is in the graph's memory and the capture hands
    # outputs out, the inputs are copied in batches only, none back, and there is no host work (a decode step);
    # None elsewhere. The replay takes that case while the pool hands outputs out (not copy_outputs).
    lean: tuple[tuple[Any, Handed], ...] | None
    # HostSplit only: the key's static host values, and (static buffer, transfer) pairs refilled per call.
    statics: tuple[Any, ...] = ()
    refill: tuple[tuple[torch.Tensor, Any], ...] = ()


def getter(positions: Sequence[int]) -> Getter:
    """``lambda args: [args[i] for i in positions]``, as fast as Python gets it."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        return lambda args, i=positions[0]: (args[i],)
    return operator.itemgetter(*positions)
