"""Replaying a recorded key: the lean path (a decode step), the full path, and the two ways a replay falls back
to an uncaptured run (an earlier output still held through a view; a fed graph that cannot be pointed at the
call's inputs).

Invariants: a replay runs on the caller's current stream, ordered after the pool's last replay on that device;
every output handed out earlier is settled before the graph may overwrite it (MemoryPool.settle); a fed graph is
pointed at the call's inputs after settling and before any other per-call work; mutated inputs that had a buffer
are copied back after the replay; ``args`` is cleared before the outputs are returned (the boxed convention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.log import log, warn_once
from airgraph.runtime.feeding import FeedError
from airgraph.runtime.host import HostSplit, refill
from airgraph.runtime.keys import KeyState
from airgraph.runtime.outputs import copy_out, hand, hand_out
from airgraph.runtime.pool import MemoryPool

__all__ = ["Replayer"]


class Replayer:
    """The replays of one GraphCapture's keys. ``warmup(args)`` runs a call uncaptured; ``unfeed(key)`` turns the
    capture's in-graph input copies off and makes ``key`` record again (its graph could not be fed)."""

    def __init__(
        self,
        *,
        device: torch.device,
        pool: MemoryPool,
        split: HostSplit | None,
        hand_out: bool,
        graph_id: int,
        warmup: Callable[[list], Any],
        unfeed: Callable[[KeyState], None],
    ) -> None:
        self.device, self._pool, self._runtime = device, pool, pool.runtime
        self._split, self._hand_out, self._graph_id = split, hand_out, graph_id
        self._warmup, self._unfeed = warmup, unfeed
        self._stream_id = self._runtime.stream_reader(device)

    def replay(self, key: KeyState, args: list) -> list[Any]:
        """Replay ``key``'s recording (it is CAPTURED and its static inputs are where they were) for ``args``."""
        pool, recorded = self._pool, key.recorded
        stream_id = self._stream_id()
        if pool.last_stream_id.get(self.device) != stream_id:  # before settling: its copy reads the last replay's
            self._follow(stream_id)
        if pool.handed and not pool.settle():
            return self._held(args)
        runtime = self._runtime
        if recorded.fed:  # after settling (which may move a handed output an input is), before any per-call work
            try:
                runtime.feed(recorded.graph, recorded.fed_getter(args))
            except FeedError as exc:
                return self._unfed(key, args, exc)
        if recorded.lean is not None and not pool.copy_outputs:  # a decode step's case (RecordedGraph.lean)
            for buffers, inputs in recorded.batches:
                runtime.copy_many(buffers, inputs(args))
            runtime.replay(recorded.graph, recorded.static_args, args)
            key.replays += 1
            args.clear()
            pool.handed = recorded.handed_storages
            return [hand(out, record) for out, record in recorded.lean]
        return self._full(key, args)

    def _full(self, key: KeyState, args: list) -> list[Any]:
        """Every case but the lean one: host work around the replay, one-by-one copies, copy-back, outputs copied
        out or handed by the output plan."""
        pool, runtime, recorded = self._pool, self._runtime, key.recorded
        static_args = recorded.static_args
        split, values = self._split, None
        if split is not None:  # the host prologue, then its values into the graph's buffers
            values = [*args, *recorded.statics, *split.run_per_call(args, recorded.statics)]
            for buffer, transfer in recorded.refill:
                refill(transfer, buffer, values[transfer.source], runtime)
        for buffers, inputs in recorded.batches:
            runtime.copy_many(buffers, inputs(args))
        for i, buffer, copy in recorded.copies:  # copy_, or over the memory of expanded dims
            copy(buffer, args[i])
        runtime.replay(recorded.graph, static_args, args)
        key.replays += 1
        for i in recorded.copy_back:  # mutated inputs that had a buffer (CPU inputs were mutated in place)
            if static_args[i].data_ptr() != args[i].data_ptr():
                runtime.copy_(args[i], static_args[i])
        runtime.reading(recorded.static_outputs)
        if pool.copy_outputs or not self._hand_out:
            outputs = copy_out(recorded.static_outputs, recorded.outputs, static_args, args)
        else:  # pool.handed is empty: settled above
            outputs = hand_out(recorded.static_outputs, recorded.outputs, static_args, args, recorded.handed)
            pool.handed = recorded.handed_storages
        args.clear()
        return outputs if split is None else split.assemble(outputs, values, clone_static=True)

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
        warn_once(
            ("held-output", self._graph_id),
            "airgraph: graph %d: an output of an earlier replay is still held through a view, and the next replay "
            "would overwrite it; this call runs uncaptured, and replays copy their outputs from now on (keep what "
            "you need of an output with .clone(), or drop the view before the next call)",
            self._graph_id,
            to_log=True,
        )
        return self._warmup(args)

    def _unfed(self, key: KeyState, args: list, exc: FeedError) -> Any:
        """The runtime failed to point the key's graph at this call's inputs (a CUDA error): this call runs
        uncaptured, and the key is recorded again at its next call, with copy launches (no fed graph from now on)."""
        log.warning(
            "airgraph: graph %d: pointing its input copies at the call's tensors failed (%s); it is recorded again "
            "with the copies launched before each replay",
            self._graph_id,
            exc,
        )
        self._unfeed(key)
        return self._warmup(args)
