"""Recording one shape key: its input buffers, the capture (with in-graph input copies, and without them when
they fail), and the :class:`~airgraph.runtime.recorded.RecordedGraph` it produces.

Invariants: the input buffers are made before the warm-up (which may mutate inputs) and hold that call's values;
a recording executes nothing, so the call's side effects happen once; cuBLAS workspaces are cleared before and
after each capture, so the recording's GEMMs get theirs from the pool; a capture that fails after the allocators
began retires the pool; in-graph copies that fail are dropped for good and the capture is made again without
them. docs/design/capture.md has the policy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from airgraph.log import log
from airgraph.runtime.device import BORROWED, FOREACH_COPY_DTYPES, CaptureError, DeviceRuntime
from airgraph.runtime.host import HostSplit
from airgraph.runtime.outputs import expanded_dims, handed_records, memory_copier, output_plan, storage
from airgraph.runtime.pool import MemoryPool
from airgraph.runtime.recapture import RecapturePolicy
from airgraph.runtime.recorded import RecordedGraph, getter

__all__ = ["CaptureReport", "Recorder", "is_device_tensor"]


class CaptureReport(Protocol):
    """What GraphCapture keeps up to date in the graph's report (report/schema.py's GraphReport)."""

    id: int
    captured: bool
    capture_keys: int
    recaptures: int
    uncaptured_reason: str | None


class Recorder:
    """Records the keys of one GraphCapture: ``run`` (or the device part of ``split``) on static buffers."""

    def __init__(
        self,
        run: Callable[[list], Any],
        *,
        device: torch.device,
        pool: MemoryPool,
        policy: RecapturePolicy,
        report: CaptureReport,
        split: HostSplit | None,
        mutated: Sequence[int],
        input_views: dict[int, int],
        hand_out: bool,
        feed: bool,
        unread: Sequence[int] = (),
    ) -> None:
        self._run, self._split, self._policy, self._report = run, split, policy, report
        self.device, self._pool, self._runtime = device, pool, pool.runtime
        self._mutated, self._input_views, self._hand_out = tuple(mutated), input_views, hand_out
        self.feed = feed  # in-graph input copies: on until they fail once
        self._unread = frozenset(unread)  # static inputs the graph does not read: not checked before a replay

    def input_buffers(self, args: list) -> tuple[set[int], list[Any]]:
        """The inputs used in place (positions), and the recording's inputs: those, and for every other device
        input a static buffer of its own, holding the input's value. Its contents are copied in again before each
        replay; a CUDA recording reads no data, but this call's inputs (as CUDAGraph Trees record with) are the
        values a run of the recording would see, where uninitialized memory could hold an index out of range (the
        simulator runs the function while recording). Made before the warm-up, which may mutate inputs. Host work's
        inputs are read outside the graph."""
        static = self._policy.used_in_place(args)
        buffers = [
            a if i in static or not is_device_tensor(a, i, self._split) else self._runtime.static_buffer(a)
            for i, a in enumerate(args)
        ]
        for buffer, a in zip(buffers, args, strict=True):
            if buffer is not a:
                memory_copier(self._runtime.copy_, buffer)(buffer, a)
        return static, buffers

    def record(self, args: list, static: set[int], buffers: list[Any]) -> RecordedGraph | str:
        """Record the key of ``args`` on ``buffers`` (:meth:`input_buffers`; ``static``: the inputs used in place):
        its RecordedGraph, or why it could not be captured."""
        split = self._split
        static_args, capture_fn, statics, refill = list(buffers), self._run, (), ()
        if split is not None:  # host work: this call's (the warm-up just ran it), outside the recording
            statics, values = split.last_run
            split.last_run = None
            boundary = split.boundary(values)
            transfers = split.transfers  # the boundary holds their copies first, then the feeds
            pairs = zip(boundary[: len(transfers)], transfers, strict=True)
            refill = tuple((b, t) for b, t in pairs if not t.static)
            static_args, capture_fn = [*buffers, *boundary], split.device_fn
        captured = self._capture(capture_fn, static_args, self._fed(args, buffers))
        if isinstance(captured, str):
            return captured
        graph, static_outputs, fed = captured
        self._pool.static_storages.update(
            (storage(args[i]), weakref.ref(args[i])) for i in self._policy.static if isinstance(args[i], torch.Tensor)
        )
        return self._recorded(args, static, static_args, graph, static_outputs, fed, tuple(statics), refill)

    def _capture(self, fn: Callable[[list], Any], static_args: list, fed: list) -> tuple | str:
        """``fn`` captured on ``static_args``: (graph, static outputs, fed), or the reason it failed. With in-graph
        input copies, a failure captures again without them (and turns them off for good)."""
        refused = None
        while True:
            self._runtime.clear_blas_workspaces()  # the recording's GEMMs get their workspace from the pool
            try:
                graph, static_outputs = self._runtime.capture(
                    fn,
                    list(static_args),
                    pool=self._pool.handle(self.device),
                    stream=self._pool.stream(self.device),
                    device=self.device,
                    fed=fed,
                )
                break
            except Exception as exc:  # with in-graph input copies: again without them; else the key runs uncaptured
                if isinstance(exc, CaptureError) and exc.pool_spent:
                    self._pool.retire(self.device)
                if fed:  # (a FeedError, or a capture or instantiation the copies may have broken)
                    refused, fed = exc, []
                    continue
                what = str(exc) if isinstance(exc, CaptureError) else f"{type(exc).__name__}: {exc}"
                return f"CUDA graph capture failed: {what.splitlines()[0]}"
            finally:
                self._runtime.clear_blas_workspaces()
        if refused is not None:  # recorded without the copies: they were the trouble
            log.warning(
                "airgraph: graph %d: recording its input copies in the graph failed (%s); they are launched before "
                "each replay from now on",
                self._report.id,
                refused,
            )
            self.feed = False
        return graph, static_outputs, fed

    def _recorded(
        self,
        args: list,
        static: set[int],
        static_args: list,
        graph: Any,
        static_outputs: Sequence[Any],
        fed: list[tuple[int, torch.Tensor]],
        statics: tuple,
        refill: tuple,
    ) -> RecordedGraph:
        n, split = len(args), self._split
        static_ptrs: list[int | None] = [None] * len(static_args)
        for i in sorted(static):
            if isinstance(static_args[i], torch.Tensor):
                static_ptrs[i] = static_args[i].data_ptr()
        static_checked = [i for i in sorted(static) if static_ptrs[i] is not None and i not in self._unread]
        copy_indices = tuple(i for i in range(n) if static_args[i] is not args[i])
        fed_positions = tuple(i for i, _ in fed)
        launched = [i for i in copy_indices if i not in fed_positions]
        batches, copies = _input_copies(static_args, launched, self._runtime)
        copy_back = tuple(i for i in self._mutated if i in copy_indices)
        plan = output_plan(static_outputs, static_args, n, copy_indices, self._input_views)
        handed = handed_records(static_outputs, plan)
        plain = split is None and not copies and not copy_back and None not in handed
        return RecordedGraph(
            graph=graph,
            # Tensors used in place are the caller's (parameters, a static cache): kept by addresses, not alive (as
            # a CUDA graph keeps them), so a cache freed after its last call leaves its memory to the next one
            static_args=tuple(
                BORROWED if i < n and a is args[i] and is_device_tensor(a, i, split) else a
                for i, a in enumerate(static_args)
            ),
            static_outputs=static_outputs,
            static_ptrs=static_ptrs,
            static_checked=static_checked,
            checked_ptrs=tuple(static_ptrs[i] for i in static_checked),
            static_getter=getter(static_checked),
            copy_indices=copy_indices,
            batches=batches,
            copies=copies,
            copy_back=copy_back,
            fed=fed_positions,
            fed_getter=getter(fed_positions),
            outputs=plan,
            handed=handed,
            handed_storages=tuple({id(h): h for h in handed if h is not None}.values()),
            owned=tuple(a for i, a in enumerate(static_args) if i >= n or a is not args[i]),
            lean=tuple(zip(static_outputs, handed, strict=True)) if plain and self._hand_out else None,
            statics=statics,
            refill=refill,
        )

    def _fed(self, args: list, buffers: list) -> list[tuple[int, torch.Tensor]]:
        """With in-graph input copies, the inputs whose buffers the graph fills itself, each with the recording
        call's tensor as its recorded source (runtime/feeding.py): device tensors with a buffer of their own, laid out
        as it (the same dtype, dense, not expanded, no conjugate or negative bit: a copy of their bytes), not empty.
        The key fixes dtype, sizes and strides, and Dynamo's guards the dispatch keys: every call's tensor there is
        laid out the same. The others, and all of them where the runtime cannot feed a graph, are copied by a launch
        before each replay."""
        if not self.feed:
            return []
        return [
            (i, a)
            for i, (a, b) in enumerate(zip(args, buffers, strict=True))
            if b is not a
            and is_device_tensor(a, i, self._split)
            and a.dtype == b.dtype
            and a.device == b.device
            and a.numel()
            and a.is_contiguous()
            and b.is_contiguous()
            and not expanded_dims(b)
            and not (a.is_conj() or a.is_neg())
        ]


def _input_copies(static_args: list, indices: Sequence[int], runtime: DeviceRuntime) -> tuple[tuple, tuple]:
    """How a replay copies the inputs at ``indices`` into their buffers (``static_args``): per device and dtype
    (a CPU scalar a CUDA graph reads has a CPU buffer), one ``runtime.copy_many`` of (the buffers, a getter of the
    inputs); one by one an expanded buffer (stride 0), over the memory it really has (outputs.memory_copier), and
    a dtype CUDA's foreach copy refuses."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    one_by_one = []
    for i in indices:
        buffer = static_args[i]
        if expanded_dims(buffer) or buffer.dtype not in FOREACH_COPY_DTYPES:
            one_by_one.append((i, buffer, memory_copier(runtime.copy_, buffer)))
        else:
            groups.setdefault((buffer.device, buffer.dtype), []).append(i)
    batches = tuple(([static_args[i] for i in group], getter(group)) for group in groups.values())
    return batches, tuple(one_by_one)


def is_device_tensor(value: Any, position: int, split: HostSplit | None) -> bool:
    """Inputs that get a static buffer: every tensor, or with host work split off, the graph's device tensors only
    (as traced: in the simulator, CPU tensors stand for CUDA ones)."""
    if not isinstance(value, torch.Tensor):
        return False
    return split is None or position not in split.host_inputs
