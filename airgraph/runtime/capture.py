"""reduce-overhead: capture the executor's run in a CUDA graph and replay it, one graph per shape key.

States of one shape key (``CaptureState``): WARMUP (the first ``warmup_iters`` calls run the executor
uncaptured, so Triton kernels compile and autotune and cuBLAS picks its algorithms), then CAPTURED
(recorded once, replayed on every later call), or UNCAPTURED (the key runs the executor directly: the
graph holds an op that cannot be captured, capture failed, or the capture limit was reached).

Inputs, per position:

- static inputs (parameters and buffers, from AOTAutograd's ``static_input_indices``) are used in place;
  their addresses are part of the recording, so a moved one (``model.to``, ``load_state_dict(assign=True)``)
  makes the key re-capture;
- every other tensor is copied into a static buffer before each replay (skipped when the caller passes the
  buffer itself); a mutated one (in-place update in the graph) is copied back after the replay.

Memory: all keys of all graphs of one backend share one CUDA graph memory pool, as CUDAGraph Trees and
TorchAir do, which is safe because a key's outputs never stay in the pool: see below.

Outputs (the documented policy): **outputs stay correct**. After each replay the outputs are copied out of
the pool into fresh tensors owned by the caller (one device-to-device copy per output, on the replay's
stream), so a tensor kept from step N is never overwritten by step N+1, nor by another key's replay.

Replays run on the caller's current stream; when it differs from the previous replay's stream, the new
stream first waits for the old one, because keys share memory.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.report import GraphReport

log = logging.getLogger("airgraph")


class CaptureState(enum.Enum):
    WARMUP = "warmup"
    CAPTURED = "captured"
    UNCAPTURED = "uncaptured"


@dataclass
class _Key:
    state: CaptureState
    warmups: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    static_args: list[Any] = field(default_factory=list)
    static_outputs: Sequence[Any] = ()
    static_ptrs: tuple[int, ...] = ()
    copy_indices: tuple[int, ...] = ()


class MemoryPool:
    """Per device: one CUDA graph memory pool and one capture stream, shared by every graph and key of a backend.

    Warm-up runs and recordings both happen on the capture stream (as CUDAGraph Trees do), so whatever a
    first run sets up per stream (cuBLAS workspaces, Triton autotuning) is set up for the stream recorded.
    """

    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}
        self._streams: dict[int, torch.cuda.Stream] = {}

    @staticmethod
    def _index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def handle(self, device: torch.device) -> Any:
        index = self._index(device)
        if index not in self._handles:
            self._handles[index] = torch.cuda.graph_pool_handle()
        return self._handles[index]

    def stream(self, device: torch.device) -> torch.cuda.Stream:
        index = self._index(device)
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]


class GraphCapture:
    """Wraps a boxed executor; records and replays it per input-shape key."""

    _boxed_call = True  # AOTAutograd passes the inputs as one list

    def __init__(
        self,
        run: Callable[[list], Any],
        *,
        device: torch.device,
        static_indices: Sequence[int],
        mutated_indices: Sequence[int],
        pool: MemoryPool,
        capture_limit: int,
        warmup_iters: int,
        report: GraphReport,
        uncapturable: str | None = None,
    ) -> None:
        self._run = run
        self.device = device
        self._static = sorted(set(static_indices))
        self._static_set = frozenset(self._static)
        self._mutated = sorted(set(mutated_indices) - self._static_set)
        self._pool = pool
        self._limit = capture_limit
        self._warmup_iters = warmup_iters
        self._report = report
        self._uncapturable = uncapturable
        self._keys: dict[tuple, _Key] = {}
        self._dynamic: list[int] | None = None
        self._limit_warned = False
        self._last_stream: torch.cuda.Stream | None = None
        if uncapturable:
            report.uncaptured_reason = uncapturable
            log.warning("airgraph: graph %d runs uncaptured in reduce-overhead: %s", report.id, uncapturable)

    # -- keys --------------------------------------------------------------------------------------------
    def _key(self, args: list) -> tuple:
        """dtype, sizes, strides and device of every non-static tensor input; the value of every other input."""
        if self._dynamic is None:
            self._dynamic = [i for i in range(len(args)) if i not in self._static_set]
        return tuple(
            (a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor) else a
            for a in map(args.__getitem__, self._dynamic)
        )

    def _static_ptrs(self, args: list) -> tuple[int, ...]:
        return tuple(args[i].data_ptr() if isinstance(args[i], torch.Tensor) else 0 for i in self._static)

    # -- calls -------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> Any:
        if self._uncapturable:
            return self._run(args)
        key = self._key(args)
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = self._new_key()
        if entry.state is CaptureState.CAPTURED:
            if self._static_ptrs(args) != entry.static_ptrs:
                log.info("airgraph: graph %d: a parameter or buffer moved; re-capturing", self._report.id)
                self._report.recaptures += 1
                entry.graph = None
                entry.state, entry.warmups = CaptureState.WARMUP, self._warmup_iters - 1
            else:
                return self._replay(entry, args)
        if entry.state is CaptureState.UNCAPTURED:
            return self._run(args)
        # WARMUP: run for real (this call's results), then record if warm enough. Recording executes
        # nothing, so the call's side effects happen exactly once.
        keep = list(args)
        outputs = self._warmup(args)
        entry.warmups += 1
        if entry.warmups >= self._warmup_iters:
            self._record(entry, keep)
        return outputs

    def _new_key(self) -> _Key:
        captured = sum(1 for k in self._keys.values() if k.state is not CaptureState.UNCAPTURED)
        if captured >= self._limit:
            if not self._limit_warned:
                self._limit_warned = True
                log.warning(
                    "airgraph: graph %d reached its capture limit of %d shape keys; new shapes run uncaptured "
                    "(raise config.reduce_overhead.capture_limit, or mark dims dynamic to need fewer keys)",
                    self._report.id,
                    self._limit,
                )
            return _Key(CaptureState.UNCAPTURED)
        return _Key(CaptureState.WARMUP)

    def _warmup(self, args: list) -> Any:
        """Run uncaptured on the capture stream, ordered after and before the caller's stream."""
        caller = torch.cuda.current_stream(self.device)
        side = self._pool.stream(self.device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            outputs = self._run(args)
        caller.wait_stream(side)
        for out in outputs:  # allocated on the side stream, used on the caller's: don't reuse them early
            if isinstance(out, torch.Tensor) and out.is_cuda:
                out.record_stream(caller)
        return outputs

    def _record(self, entry: _Key, args: list) -> None:
        # Non-static inputs get buffers of their own; their contents are copied in before each replay
        # (recording reads no data, so they start uninitialized).
        static_args = [
            a if i in self._static_set or not isinstance(a, torch.Tensor) else _static_like(a)
            for i, a in enumerate(args)
        ]
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool.handle(self.device), stream=self._pool.stream(self.device)):
                static_outputs = self._run(list(static_args))
        except Exception as exc:  # capture refused an op: run this key uncaptured from now on
            entry.state = CaptureState.UNCAPTURED
            reason = f"CUDA graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            self._report.uncaptured_reason = reason
            log.warning("airgraph: graph %d runs uncaptured: %s", self._report.id, reason)
            return
        entry.graph, entry.static_args, entry.static_outputs = graph, static_args, static_outputs
        entry.static_ptrs = self._static_ptrs(static_args)
        entry.copy_indices = tuple(i for i, a in enumerate(static_args) if a is not args[i])
        entry.state = CaptureState.CAPTURED
        self._report.captured = True
        self._report.capture_keys += 1

    def _replay(self, entry: _Key, args: list) -> list[Any]:
        static_args = entry.static_args
        for i in entry.copy_indices:
            buffer, a = static_args[i], args[i]
            if buffer.data_ptr() != a.data_ptr():
                buffer.copy_(a)
        stream = torch.cuda.current_stream(self.device)
        if self._last_stream is not None and self._last_stream != stream:
            stream.wait_stream(self._last_stream)
        self._last_stream = stream
        entry.graph.replay()
        for i in self._mutated:
            if static_args[i].data_ptr() != args[i].data_ptr():
                args[i].copy_(static_args[i])
        args.clear()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in entry.static_outputs]


def _static_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def find_uncapturable(gm: torch.fx.GraphModule) -> str | None:
    """Why this CUDA graph cannot be recorded as one CUDA graph, naming the first offending op, or None.

    Ops with data-dependent output shapes or that read a device value on the host need a sync, which
    capture forbids (these are named first: they are what a user changes); CPU tensors inside a CUDA graph
    would be computed on the host once, while recording, and never again.
    """
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target is torch.ops.aten._local_scalar_dense.default:
            return f"{node.name} = {target} reads a device value on the host (.item(), a host sync)"
        if torch.Tag.dynamic_output_shape in target.tags or torch.Tag.data_dependent_output in target.tags:
            return f"{node.name} = {target} has a data-dependent output (needs a host sync)"
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.device.type != "cpu":
            continue
        if node.op == "placeholder":  # even a 0-dim one: a kernel would keep the value it had when recorded
            return f"input {node.name} is a CPU tensor inside a CUDA graph"
        if val.dim() > 0:
            return f"{node.name} = {node.target} is a CPU tensor inside a CUDA graph"
    return None
