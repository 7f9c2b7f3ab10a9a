"""The CPU's device runtime: one implicit stream, no graphs.

:class:`CpuRuntime` implements runtime/device.py's ``DeviceRuntime`` for CPU graphs. Work is ordered by program
order, so waits and events do nothing; reduce-overhead runs the executor uncaptured (``capture_refusal`` says
why); ``time`` is ``perf_counter`` around each call.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

__all__ = ["CPU", "CpuRuntime"]


class _NoStream:
    """The CPU's one stream: work is ordered by program order, so there is nothing to wait for."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


class _NoEvent:
    def record(self, stream: Any = None) -> None:
        pass


class CpuRuntime:
    """The CPU: one implicit stream, no graphs (reduce-overhead runs the executor uncaptured)."""

    has_streams = False
    can_capture = False
    can_feed = False
    _stream = _NoStream()

    def current_stream(self, device: torch.device | None = None) -> _NoStream:
        return self._stream

    def stream_reader(self, device: torch.device) -> Callable[[], Hashable]:
        return self.current_stream

    def side_stream(self, tag: str, device: torch.device | None = None, priority: int = 0) -> _NoStream:
        return self._stream

    def new_stream(self, device: torch.device | None = None) -> _NoStream:
        return self._stream

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def new_event(self) -> _NoEvent:
        return _NoEvent()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        pass

    def pool_handle(self) -> None:
        return None

    def static_buffer(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    def capture(
        self,
        fn: Callable[[list], Any],
        args: list,
        *,
        pool: Any,
        stream: Any,
        device: torch.device,
        fed: Sequence[tuple[int, torch.Tensor]] = (),
    ) -> tuple:
        raise RuntimeError("the CPU records no graphs: reduce-overhead runs the executor uncaptured")

    def feed(self, graph: Any, sources: Sequence[torch.Tensor]) -> None:
        raise RuntimeError("the CPU records no graphs: reduce-overhead runs the executor uncaptured")

    def replay(self, graph: Any, recorded: list, args: list) -> None:
        raise RuntimeError("the CPU records no graphs: reduce-overhead runs the executor uncaptured")

    def capture_refusal(self, device: torch.device) -> str | None:
        return f"reduce-overhead captures CUDA graphs; this graph runs on {device.type}"

    def clear_blas_workspaces(self) -> None:
        pass

    def pinned(self, t: torch.Tensor) -> torch.Tensor:  # nothing is copied to a device
        return t

    def pinned_copy(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def wrap_segment(self, segment: Any, fn: Callable[[list], Any]) -> Callable[[list], Any]:
        return fn

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None:
        dst.copy_(src)

    def copy_many(self, dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
        torch._foreach_copy_(dsts, srcs)

    def run_op(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    def reading(self, values: Any) -> None:
        pass

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        """``perf_counter`` around each call (the CPU runs it synchronously)."""
        fn(list(args))
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn(list(args))
            times.append(time.perf_counter() - start)
        return statistics.median(times)


CPU = CpuRuntime()
