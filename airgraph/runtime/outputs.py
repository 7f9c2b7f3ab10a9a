"""How each output of a replay reaches the caller (runtime/capture.py's documented policy: outputs stay correct),
and copying memory that an expanded view (stride 0) covers once per element it really has."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["copy_out", "expanded_dims", "one_per_expanded", "output_plan", "storage"]


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


# How each output of a replay reaches the caller (see the module docstring):
_KEEP, _INPUT_VIEW, _CLONE, _COPY = "keep", "input view", "clone", "copy"


def output_plan(
    outputs: Sequence[Any],
    static_args: list,
    num_args: int,
    copy_indices: tuple[int, ...],
    input_views: dict[int, int],
) -> list[tuple]:
    """How each output reaches the caller after a replay:

    - (_KEEP,): non-tensors, and views of inputs used in place (parameters, buffers, CPU inputs of host work):
      that memory is theirs, not the pool's;
    - (_INPUT_VIEW, i): a view of input ``i`` (``input_views``, from the FX graph), which has a static buffer:
      the same view of the caller's tensor. Only graph-level views: an output that merely occupies an input's
      buffer (an input Inductor was allowed to overwrite) is pool data like any other;
    - (_CLONE, dense): an output alone in its storage whose elements do not overlap: a copy of its elements,
      strides kept (nothing regenerates a view from it); ``clone`` when it is dense (it keeps those strides);
    - (_COPY, storage): outputs sharing a storage (a view and its base), and overlapping ones (an expanded
      view): the storage copied once for all of them, offsets kept, so AOTAutograd regenerates the view from
      the base as eager would.
    """
    in_place = {
        storage(a)
        for i, a in enumerate(static_args[:num_args])
        if isinstance(a, torch.Tensor) and i not in copy_indices and a.untyped_storage().nbytes()
    }
    plan: list[tuple] = []
    for position, out in enumerate(outputs):
        source = input_views.get(position)
        if not isinstance(out, torch.Tensor):
            plan.append((_KEEP,))
        elif not out.untyped_storage().nbytes():  # no memory (a null pointer): nothing to tell apart
            plan.append((_CLONE, True))
        elif source is not None and source in copy_indices and storage(out) == storage(static_args[source]):
            plan.append((_INPUT_VIEW, source))
        elif storage(out) in in_place:
            plan.append((_KEEP,))
        else:
            plan.append((_COPY, storage(out)))
    shared = Counter(how[1] for how in plan if how[0] == _COPY)
    for i, (out, how) in enumerate(zip(outputs, plan, strict=True)):
        if how[0] == _COPY and shared[how[1]] == 1:
            non_overlapping, dense = layout(out)
            if non_overlapping:
                plan[i] = (_CLONE, dense)
    return plan


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


def copy_out(static_outputs: Sequence[Any], plan: list[tuple], static_args: list, args: list) -> list[Any]:
    """A replay's outputs for the caller, by ``plan`` (:func:`output_plan`): pool memory copied once per storage,
    offsets and sharing kept."""
    copies: dict[int, Any] = {}
    outputs = []
    for out, how in zip(static_outputs, plan, strict=True):
        if how[0] == _CLONE:
            if how[1]:
                outputs.append(out.clone())
            else:  # a strided view: only its elements, same strides
                copy = torch.empty_strided(out.size(), out.stride(), dtype=out.dtype, device=out.device)
                outputs.append(copy.copy_(out))
        elif how[0] == _KEEP:
            outputs.append(out)
        elif how[0] == _INPUT_VIEW:
            base, buffer = args[how[1]], static_args[how[1]]
            offset = out.storage_offset() - buffer.storage_offset() + base.storage_offset()
            outputs.append(base.as_strided(out.size(), out.stride(), offset))
        else:
            if how[1] not in copies:
                copies[how[1]] = out.untyped_storage().clone()
            view = torch.empty(0, dtype=out.dtype, device=out.device)
            outputs.append(view.set_(copies[how[1]], out.storage_offset(), out.size(), out.stride()))
    return outputs
