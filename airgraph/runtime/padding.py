"""Capture sizes at run time: a call's batch padded up to the next capture size, its outputs sliced back.

:class:`PaddedRun` wraps a boxed callable (a GraphCapture: one CUDA graph per shape key) with the padding plan
that lowering/padding.py made for its graph. A call of batch ``b`` runs as a call of the smallest capture size
``S >= b``: every padded input is copied into a buffer of ``S`` rows kept per (input, size), its rows past ``b``
filled with the input's pad value; SymInt inputs equal to the batch become ``S``. A batch of exactly ``S`` goes
through the buffers too, so the graph of a size always reads the same memory and the capture may use the buffers
in place. Outputs are narrowed back to ``b`` rows (views, no copy), and the real rows of a padded input that the
graph wrote are copied back to the caller's tensor. A batch above the largest size runs unpadded (its own key),
warned once. ``record_sizes`` records every size, largest first, at start-up.

Invariants: a real row's values are the unpadded run's (the plan guarantees no op mixes rows); the caller's
tensors are read and written in their first ``b`` rows only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from airgraph.boxed import boxed
from airgraph.log import warn_once

__all__ = ["PadReport", "PadShape", "PaddedRun"]


class PadShape(Protocol):
    """What a padding plan says (lowering/padding.py's PadPlan): the runtime needs only these fields."""

    symints: tuple[int, ...]
    padded: tuple[tuple[int, int, int], ...]
    sliced: tuple[tuple[int, int, int], ...]
    scalars: tuple[tuple[int, Any], ...]

    def batch(self, args: list) -> int: ...


class PadReport(Protocol):
    """The fields of the graph's report that PaddedRun keeps up to date (report/schema.py's GraphReport)."""

    id: int
    capture_sizes: list[int]
    padded_calls: int
    padded_rows: int


@dataclass(frozen=True)
class _Input:
    position: int
    dim: int
    k: int  # the dim is k * batch
    fill: float
    mutated: bool


class PaddedRun:
    """A boxed callable running each call at the next capture size (module docstring)."""

    def __init__(
        self,
        run: Callable[[list], Any],
        plan: PadShape,
        sizes: Sequence[int],
        report: PadReport,
        *,
        mutated_indices: Sequence[int] = (),
        fills: dict[int, float] | None = None,
        symbol_value: Callable[[Any, int], int] | None = None,
        record_calls: int = 0,
    ) -> None:
        """``fills``: input position -> the value of its padded rows (0 elsewhere). ``record_calls``: at the first
        call, record every size with that many runs each (``record_sizes``), unless the graph writes an input that
        is not padded (a warm-up run would write it)."""
        boxed(self)
        self._run, self._plan, self._report = run, plan, report
        self.sizes = sorted(set(sizes))
        mutated, fills = set(mutated_indices), fills or {}
        self._inputs = [_Input(i, d, k, fills.get(i, 0), i in mutated) for i, d, k in plan.padded]
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        self._evaluate = symbol_value or _evaluate
        padded = {i.position for i in self._inputs}
        self._record_calls = record_calls if mutated <= padded else 0
        report.capture_sizes = list(self.sizes)

    def size_for(self, batch: int) -> int | None:
        """The capture size a batch runs at, or None above the largest."""
        index = bisect.bisect_left(self.sizes, batch)
        return self.sizes[index] if index < len(self.sizes) else None

    def __call__(self, args: list) -> Any:
        if self._record_calls:
            calls, self._record_calls = self._record_calls, 0
            self.record_sizes(list(args), calls)
        batch = self._plan.batch(args)
        size = self.size_for(batch)
        if size is None:
            warn_once(
                ("capture_sizes-above", self._report.id),
                "airgraph: graph %d was called with batch %d, above its largest capture size %d: such batches run "
                "unpadded, one CUDA graph per size (add the size to config.reduce_overhead.capture_sizes)",
                self._report.id,
                batch,
                self.sizes[-1],
                to_log=True,
            )
            return self._run(args)
        callers = {i.position: args[i.position] for i in self._inputs}
        padded = self.pad(args, batch, size)
        outputs = self._run(padded)
        if size > batch:
            self._report.padded_calls += 1
            self._report.padded_rows += size - batch
        for i in self._inputs:
            if i.mutated:
                callers[i.position].copy_(self._buffers[i.position, size].narrow(i.dim, 0, i.k * batch))
        return self.unpad(outputs, batch)

    def pad(self, args: list, batch: int, size: int) -> list:
        """``args`` with every padded input in its buffer for ``size`` (real rows first, then the fill)."""
        padded = list(args)
        args.clear()
        for i in self._plan.symints:
            padded[i] = size
        for i in self._inputs:
            value = padded[i.position]
            buffer = self._buffer(i, value, size)
            rows = i.k * batch
            buffer.narrow(i.dim, 0, rows).copy_(value)
            buffer.narrow(i.dim, rows, i.k * size - rows).fill_(i.fill)
            padded[i.position] = buffer
        return padded

    def unpad(self, outputs: Any, batch: int) -> Any:
        outputs = list(outputs)
        for index, dim, k in self._plan.sliced:
            outputs[index] = outputs[index].narrow(dim, 0, k * batch)
        for index, expr in self._plan.scalars:
            outputs[index] = self._evaluate(expr, batch)
        return outputs

    def _buffer(self, i: _Input, value: torch.Tensor, size: int) -> torch.Tensor:
        key = (i.position, size)
        buffer = self._buffers.get(key)
        shape = list(value.shape)
        shape[i.dim] = i.k * size
        if (
            buffer is None
            or buffer.dtype != value.dtype
            or buffer.device != value.device
            or list(buffer.shape) != shape
        ):
            buffer = self._buffers[key] = value.new_empty(shape)
        return buffer

    def record_sizes(self, args: list, calls: int) -> None:
        """Record every capture size, largest first (the smaller ones reuse the shared pool's memory), by ``calls``
        runs each of ``args`` padded, or cut, to that size. Only for graphs that write no input of the caller's: a
        warm-up run executes."""
        batch = self._plan.batch(args)
        for size in reversed(self.sizes):
            rows = min(batch, size)
            for _ in range(calls):
                call = list(args)
                for i in self._inputs:
                    call[i.position] = args[i.position].narrow(i.dim, 0, i.k * rows)
                self._run(self.pad(call, rows, size))


def _evaluate(expr: Any, batch: int) -> int:
    (symbol,) = expr.free_symbols
    return int(expr.subs(symbol, batch))
