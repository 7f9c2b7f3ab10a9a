"""Stream scopes: ``with airgraph.scope.stream_switch("1"):`` runs the ops inside on the stream tagged "1".

Same tag, same stream; nested scopes: the innermost wins; ops outside run on the caller's current stream.
Inside a compiled graph the scope becomes a pair of marker ops (airgraph/ops.py) that the streams pass turns
into per-node stream assignments. In eager code on CUDA it switches ``torch.cuda.stream`` for real (the
side stream first waits for the current one, so the scope sees everything issued before it); on the CPU it
does nothing.

Ordering differs between the two, on purpose. Compiled, the executor orders streams by data: a value read
on another stream than the one that made it is waited for, and the caller's stream joins every side stream
before the graph returns, so results never depend on timing. Eager code gets exactly what it wrote, as with
``torch.cuda.stream``: after a scope, the caller's stream does not wait for the side stream; use tagged
events (``tagged_event_record`` / ``tagged_event_wait``), as TorchAir's multi-stream example does, or
``torch.cuda.current_stream().wait_stream(...)`` before reading a side stream's results.
"""

from __future__ import annotations

from typing import Any

import torch

from airgraph import ops

__all__ = ["stream_switch"]


class stream_switch:
    def __init__(self, stream_tag: str, stream_priority: int = 0) -> None:
        ops._check_tag(stream_tag, "stream_switch")
        if not isinstance(stream_priority, int) or isinstance(stream_priority, bool):
            raise TypeError(f"stream_switch: stream_priority must be an int, got {stream_priority!r}")
        self.stream_tag = stream_tag
        self.stream_priority = stream_priority
        self._eager: Any = None

    def __enter__(self) -> stream_switch:
        if ops._eager_cuda():
            stream = ops.stream_for(self.stream_tag, priority=self.stream_priority)
            stream.wait_stream(torch.cuda.current_stream())
            self._eager = torch.cuda.stream(stream)
            self._eager.__enter__()
        else:
            torch.ops.airgraph.stream_enter(self.stream_tag, self.stream_priority)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._eager is not None:
            eager, self._eager = self._eager, None
            eager.__exit__(*exc)
        else:
            torch.ops.airgraph.stream_exit(self.stream_tag)
