"""The memory pool every graph and key of a backend records into, per device, and the outputs it hands out.

Invariants: an empty graph captured into the pool keeps the caching allocator's use count of it above zero for
the backend's lifetime (a capture into a pool whose count reached zero fails inside the allocator); a pool a
failed capture left spent is retired, never recorded into again; before a replay of any graph of the pool,
every output handed out without a copy is settled (:meth:`MemoryPool.settle`), so a kept tensor is never
overwritten. docs/design/capture.md ("Memory", "Outputs") has the whole policy.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from airgraph.runtime.device import CUDA, DeviceRuntime
from airgraph.runtime.outputs import Handed

__all__ = ["MemoryPool"]


class MemoryPool:
    """Per device: one CUDA graph memory pool and one capture stream, shared by every graph and key of a backend.

    Warm-up runs and recordings both happen on the capture stream (as CUDAGraph Trees do), so whatever a
    first run sets up per stream (Triton autotuning) is set up for the stream recorded. The pool also remembers
    the stream of the last replay on each device: every graph's replay is ordered after it (graphs of the pool
    share its memory). A pool that a failed capture left spent (runtime/device.py: the pinned host allocator still
    allocates into it) is retired: later captures take a fresh pool, and the graphs recorded into the old one keep
    it alive as long as they live.
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
        # Outputs handed to callers without a copy, settled before the next replay; copy_outputs: set for good once
        # one was held in a way that cannot be moved (then every replay copies).
        self.handed: Sequence[Handed] = ()
        self.copy_outputs = False

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
            self.handed = ()
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
