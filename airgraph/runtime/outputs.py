"""How each output of a replay reaches the caller (docs/design/capture.md's policy: outputs stay correct), and
copying memory that an expanded view (stride 0) covers once per element it really has.

An output plan is one named value per output (:data:`OutputHow`): :class:`Keep`, :class:`InputView`,
:class:`Clone` or :class:`CopyStorage`. Outputs in pool memory have a :class:`Handed` record per storage, settled
before the next replay of the pool may overwrite that memory.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_use_count = torch._C._storage_Use_Count

__all__ = [
    "KEEP",
    "Clone",
    "CopyStorage",
    "Handed",
    "InputView",
    "Keep",
    "OutputHow",
    "copy_out",
    "expanded_dims",
    "hand",
    "hand_out",
    "handed_records",
    "memory_copier",
    "one_per_expanded",
    "output_plan",
    "storage",
]


def expanded_dims(t: Any) -> tuple[int, ...]:
    """Dimensions of ``t`` with stride 0 and size > 1 (an ``expand``): many elements, one memory location."""
    if not isinstance(t, torch.Tensor):
        return ()
    return tuple(d for d in range(t.dim()) if t.stride(d) == 0 and t.size(d) > 1)


def one_per_expanded(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``t`` narrowed to one element along each expanded dimension: the memory it really has, copyable."""
    for d in dims:
        t = t.narrow(d, 0, 1)
    return t


Copy = Callable[[torch.Tensor, torch.Tensor], Any]


def memory_copier(copy: Copy, dst: Any) -> Copy:
    """``copy(dst, src)`` for ``dst`` (or a tensor of its layout) and a ``src`` of the same layout, over the memory
    they really have: one element along each expanded dimension (:func:`expanded_dims`: a copy into all of an
    expanded view's elements is refused, they overlap). ``copy`` itself where there are none, so that a caller that
    makes its copier once pays nothing per copy (GraphCapture's replays)."""
    dims = expanded_dims(dst)
    if not dims:
        return copy

    def copy_expanded(dst: torch.Tensor, src: torch.Tensor) -> Any:
        return copy(one_per_expanded(dst, dims), one_per_expanded(src, dims))

    return copy_expanded


@dataclass(frozen=True, slots=True)
class Keep:
    """A non-tensor, or a view of an input used in place (parameters, buffers, CPU inputs of host work): that
    memory is theirs, not the pool's; returned as it is."""


@dataclass(frozen=True, slots=True)
class InputView:
    """A view of input ``source`` (from the FX graph), which has a static buffer: the same view of the caller's
    tensor. Only graph-level views: an output that merely occupies an input's buffer (an input Inductor was allowed
    to overwrite) is pool data like any other."""

    source: int


@dataclass(frozen=True, slots=True)
class Clone:
    """An output alone in its storage whose elements do not overlap: a copy of its elements, strides kept (nothing
    regenerates a view from it); ``clone`` when it is ``dense`` (it keeps those strides)."""

    dense: bool


@dataclass(frozen=True, slots=True)
class CopyStorage:
    """Outputs sharing a storage (a view and its base), and overlapping ones (an expanded view): the storage copied
    once for all of them, offsets kept, so AOTAutograd regenerates the view from the base as eager would."""

    storage: int


KEEP = Keep()
OutputHow = Keep | InputView | Clone | CopyStorage


def output_plan(
    outputs: Sequence[Any],
    static_args: Sequence[Any],
    num_args: int,
    copy_indices: tuple[int, ...],
    input_views: dict[int, int],
) -> tuple[OutputHow, ...]:
    """How each output reaches the caller after a replay (:data:`OutputHow`, one per output)."""
    in_place = {
        storage(a)
        for i, a in enumerate(static_args[:num_args])
        if isinstance(a, torch.Tensor) and i not in copy_indices and a.untyped_storage().nbytes()
    }
    plan: list[OutputHow] = []
    for position, out in enumerate(outputs):
        source = input_views.get(position)
        if not isinstance(out, torch.Tensor):
            plan.append(KEEP)
        elif not out.untyped_storage().nbytes():  # no memory (a null pointer): nothing to tell apart
            plan.append(Clone(True))
        elif source is not None and source in copy_indices and storage(out) == storage(static_args[source]):
            plan.append(InputView(source))
        elif storage(out) in in_place:
            plan.append(KEEP)
        else:
            plan.append(CopyStorage(storage(out)))
    shared = Counter(how.storage for how in plan if type(how) is CopyStorage)
    for i, (out, how) in enumerate(zip(outputs, plan, strict=True)):
        if type(how) is CopyStorage and shared[how.storage] == 1:
            non_overlapping, dense = layout(out)
            if non_overlapping:
                plan[i] = Clone(dense)
    return tuple(plan)


def layout(t: torch.Tensor) -> tuple[bool, bool]:
    """(non-overlapping, dense) for ``t``'s layout, its dims taken smallest stride first. Non-overlapping: each
    stride clears the span of the dims below it (an expanded view, stride 0, overlaps, and only a copy of its
    storage keeps its layout). Dense: each stride is exactly that span (a permutation of a contiguous layout,
    whose strides ``clone`` keeps)."""
    span, dense = 1, True
    dims = [(n, st) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1]
    for size, stride in sorted(dims, key=lambda p: p[1]):
        if stride < span:
            return False, False
        dense = dense and stride == span
        span = stride * size
    return True, dense


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Handed:
    """One storage of a recorded graph's outputs, and the tensors on it handed to the caller without a copy by the
    last replay (:func:`hand_out`): a weak reference to the storage, how many held it at the recording (the
    graph's own outputs) and weak references to the handed tensors. Settled before the next replay that may
    overwrite that memory (MemoryPool.settle)."""

    __slots__ = ("handed", "held_at_recording", "storage")

    def __init__(self, storage: StorageWeakRef, held_at_recording: int) -> None:
        self.storage, self.held_at_recording = storage, held_at_recording
        self.handed: list[weakref.ref] = []

    def dropped(self) -> bool:
        """Nothing holds the memory any more (the handed tensors were let go): forget them."""
        # 0 once the storage is gone (the graph was dropped and nobody held it): the weak reference keeps the
        # StorageImpl's object, as CUDAGraph Trees rely on.
        if _use_count(self.storage.cdata) > self.held_at_recording:
            return False
        self.handed = []
        return True

    def settle(self, reading: Callable[[list], None]) -> bool:
        """Make the memory free to overwrite: nothing holds it (done), or only the handed tensors do (each is moved
        to a copy of the storage, offsets kept: one copy for all of them, on the current stream, told to
        ``reading`` first: the runtime's). False: something else holds it (a view of a handed tensor, autograd): it
        cannot be moved, and the memory must not be overwritten."""
        if self.dropped():
            return True
        held = _use_count(self.storage.cdata) - self.held_at_recording
        alive = [t for ref in self.handed if (t := ref()) is not None]
        if held != len(alive):
            return False
        reading(alive)
        copy = alive[0].untyped_storage().clone()
        # Same values elsewhere: not a write, so autograd (which may have saved the tensor) must not see one.
        with torch.autograd._unsafe_preserve_version_counter(tuple(alive)):
            for t in alive:
                t.set_(copy, t.storage_offset(), t.size(), t.stride())
        self.handed = []
        return True


def copy_out(
    static_outputs: Sequence[Any], plan: Sequence[OutputHow], static_args: Sequence[Any], args: list
) -> list[Any]:
    """A replay's outputs for the caller, by ``plan`` (:func:`output_plan`): pool memory copied once per storage,
    offsets and sharing kept."""
    copies: dict[int, Any] = {}
    outputs = []
    for out, how in zip(static_outputs, plan, strict=True):
        kind = type(how)
        if kind is Clone:
            if how.dense:
                outputs.append(out.clone())
            else:  # a strided view: only its elements, same strides
                copy = torch.empty_strided(out.size(), out.stride(), dtype=out.dtype, device=out.device)
                outputs.append(copy.copy_(out))
        elif kind is CopyStorage:
            if how.storage not in copies:
                copies[how.storage] = out.untyped_storage().clone()
            view = torch.empty(0, dtype=out.dtype, device=out.device)
            outputs.append(view.set_(copies[how.storage], out.storage_offset(), out.size(), out.stride()))
        else:
            outputs.append(_not_pool(out, how, static_args, args))
    return outputs


def hand_out(
    static_outputs: Sequence[Any],
    plan: Sequence[OutputHow],
    static_args: Sequence[Any],
    args: list,
    records: Sequence[Handed | None],
) -> list[Any]:
    """A replay's outputs for the caller without copying pool memory: each such output is a new tensor on the
    graph's own memory (``detach``: same storage, offset, sizes and strides), told to its storage's
    :class:`Handed` record (``records``: :func:`handed_records`), to settle before the next replay."""
    return [
        _not_pool(out, how, static_args, args) if record is None else hand(out, record)
        for out, how, record in zip(static_outputs, plan, records, strict=True)
    ]


def hand(out: torch.Tensor, record: Handed) -> torch.Tensor:
    """``out`` for the caller without a copy: a new tensor on its memory, told to its storage's ``record``."""
    alias = out.detach()
    record.handed.append(weakref.ref(alias))
    return alias


def _not_pool(out: Any, how: OutputHow, static_args: Sequence[Any], args: list) -> Any:
    """An output that is not in the pool's memory: kept as it is, or the same view of the caller's input."""
    if type(how) is Keep:
        return out
    base, buffer = args[how.source], static_args[how.source]
    offset = out.storage_offset() - buffer.storage_offset() + base.storage_offset()
    return base.as_strided(out.size(), out.stride(), offset)


def handed_records(static_outputs: Sequence[Any], plan: Sequence[OutputHow]) -> tuple[Handed | None, ...]:
    """Per output in pool memory, the :class:`Handed` record of its storage (one per storage, holding a weak
    reference to it and how many hold it now: taken at the recording, when only the graph's own outputs do); None
    for the others."""
    records: dict[int, Handed] = {}
    result: list[Handed | None] = []
    for out, how in zip(static_outputs, plan, strict=True):
        if type(how) not in (Clone, CopyStorage):
            result.append(None)
            continue
        key = storage(out)
        if key not in records:
            ref = StorageWeakRef(out.untyped_storage())
            records[key] = Handed(ref, _use_count(ref.cdata))
        result.append(records[key])
    return tuple(result)
