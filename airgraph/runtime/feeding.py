"""In-graph input copies on CUDA (``config.reduce_overhead.input_copies = "in-graph"``): a graph that fills its own
input buffers.

A copy launched before each replay costs the host more than the replay it feeds (docs/design/capture.md,
"In-graph input copies", cites the measurement). Here the copies are recorded as the graph's first nodes
instead: one memcpy node per input, from the recording call's tensor into the buffer. Before each replay,
:meth:`FedGraph.feed` points the nodes at that call's tensors (``cudaGraphExecMemcpyNodeSetParams1D``: a change
to the instantiated graph on the host, no launch; skipped for a node whose source address is the same).

Invariants: CUDA applies such a change to later launches only, so a launch still queued copies what it was given
(the semantics of a copy launched on the same stream just before each replay); a source is laid out as its
buffer (a memcpy of its bytes); every CUDA runtime call's failure raises :class:`FeedError`. The CUDA runtime API
comes from ``cuda.bindings``; without it (:func:`bindings` is None) the runtime cannot feed a graph.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

__all__ = ["FedGraph", "FeedError", "bindings", "copies_first", "memcpy_nodes", "started_on"]


class FeedError(RuntimeError):
    """Recording a graph's input copies, or pointing them at a call's tensors, failed (a CUDA runtime call's error)."""


@functools.cache
def bindings() -> ModuleType | None:
    """``cuda.bindings.runtime`` where it is installed and its runtime works, else None. Probed once (asked when a
    GraphCapture is made, outside any capture): its first call initializes the bindings' own CUDA runtime, which
    must not happen inside a stream capture, and a runtime that cannot start (no driver) is found once, not by
    every recording."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    if runtime.cudaGetDevice()[0] != runtime.cudaError_t.cudaSuccess:
        return None
    return runtime


def _ok(result: tuple, call: str) -> Any:
    cudart = bindings()
    assert cudart is not None
    if result[0] != cudart.cudaError_t.cudaSuccess:
        raise FeedError(f"{call} failed: {result[0]!r}")
    return result[1] if len(result) == 2 else result[1:]


@functools.cache
def started_on(index: int) -> None:
    """Start the bindings' runtime on device ``index``, outside any capture (before a fed graph's first recording
    there): its first ``cudaSetDevice`` on a device initializes its state on that device's primary context, torch's
    context. Once per device; raises :class:`FeedError` (not cached) if it fails."""
    cudart = bindings()
    assert cudart is not None
    with torch.cuda.device(index):  # (torch's current device is put back after)
        _ok(cudart.cudaSetDevice(index), "cudaSetDevice")


def copies_first(fn: Callable[[list], Any], fed: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[list], Any]:
    """``fn`` preceded by one ``cudaMemcpyAsync`` per (buffer, source) pair on the current stream: recorded inside a
    capture, the graph's first nodes. A memcpy of the buffer's bytes: each source is laid out as its buffer."""
    cudart = bindings()
    assert cudart is not None
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def run(args: list) -> Any:
        # The bindings' runtime keeps a current device of its own: torch's, the capture's (started there already:
        # started_on)
        _ok(cudart.cudaSetDevice(torch.cuda.current_device()), "cudaSetDevice")
        stream = cudart.cudaStream_t(init_value=torch.cuda.current_stream().cuda_stream)
        for buffer, source in fed:
            copy = cudart.cudaMemcpyAsync(buffer.data_ptr(), source.data_ptr(), buffer.nbytes, kind, stream)
            _ok(copy, "cudaMemcpyAsync")
        return fn(args)

    return run


class FedGraph:
    """A ``torch.cuda.CUDAGraph`` recorded with ``keep_graph=True`` (its node handles must outlive the instantiation)
    whose first nodes copy ``sources`` into ``buffers`` (:func:`copies_first`) on device ``index``: instantiated, its
    memcpy nodes found. :meth:`feed` points them at a call's tensors; :meth:`replay` launches it."""

    def __init__(
        self, graph: torch.cuda.CUDAGraph, buffers: Sequence[torch.Tensor], sources: Sequence[torch.Tensor], index: int
    ) -> None:
        cudart = bindings()
        assert cudart is not None
        # An update runs in the current context, the thread's current device's (torch's too: one driver context per
        # device): with several devices, the graph's is made current for it, and the caller's restored after
        self._device = index if torch.cuda.device_count() > 1 else None
        self._get_device, self._set_device = cudart.cudaGetDevice, cudart.cudaSetDevice
        graph.instantiate()
        self.graph = graph
        self._set = cudart.cudaGraphExecMemcpyNodeSetParams1D
        self._exec = cudart.cudaGraphExec_t(init_value=graph.raw_cuda_graph_exec())
        self._kind, self._success = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, cudart.cudaError_t.cudaSuccess
        nodes = memcpy_nodes(graph.raw_cuda_graph())
        pairs = [(b.data_ptr(), s.data_ptr()) for b, s in zip(buffers, sources, strict=True)]
        missing = [k for k, pair in enumerate(pairs) if pair not in nodes]
        if missing:
            raise FeedError(f"the recorded graph has no memcpy node for its fed input buffers {missing}")
        # per fed buffer: [its node, its address, its size, the address its node copies from now]
        self._nodes = [[nodes[pair], pair[0], b.nbytes, pair[1]] for pair, b in zip(pairs, buffers, strict=True)]

    def feed(self, sources: Sequence[torch.Tensor]) -> None:
        """The next replays copy from ``sources`` (one per fed buffer, in order)."""
        if self._device is None:
            self._point(sources)
            return
        error, current = self._get_device()
        if error != self._success:
            raise FeedError(f"cudaGetDevice failed: {error!r}")
        if current == self._device:
            self._point(sources)
            return
        if self._set_device(self._device)[0] != self._success:
            raise FeedError(f"cudaSetDevice({self._device}) failed")
        try:
            self._point(sources)
        finally:
            self._set_device(current)

    def _point(self, sources: Sequence[torch.Tensor]) -> None:
        for node, source in zip(self._nodes, sources, strict=True):
            ptr = source.data_ptr()
            if ptr != node[3]:
                (error,) = self._set(self._exec, node[0], node[1], ptr, node[2], self._kind)
                if error != self._success:  # (GraphCapture records the graph again, with copy launches)
                    raise FeedError(f"cudaGraphExecMemcpyNodeSetParams1D failed: {error!r}")
                node[3] = ptr

    def replay(self) -> None:
        self.graph.replay()


def memcpy_nodes(raw_graph: int) -> dict[tuple[int, int], Any]:
    """The memcpy nodes of a cudaGraph_t (``CUDAGraph.raw_cuda_graph()``), by (destination, source) address."""
    cudart = bindings()
    assert cudart is not None
    graph = cudart.cudaGraph_t(init_value=raw_graph)
    count = _ok(cudart.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")[1]
    memcpy = cudart.cudaGraphNodeType.cudaGraphNodeTypeMemcpy
    found = {}
    for node in _ok(cudart.cudaGraphGetNodes(graph, count), "cudaGraphGetNodes")[0]:
        if _ok(cudart.cudaGraphNodeGetType(node), "cudaGraphNodeGetType") == memcpy:
            params = _ok(cudart.cudaGraphMemcpyNodeGetParams(node), "cudaGraphMemcpyNodeGetParams")
            found[(int(params.dstPtr.ptr), int(params.srcPtr.ptr))] = node
    return found
