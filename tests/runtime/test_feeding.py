"""runtime/feeding.py's CUDA calls, on this machine without a GPU: NVIDIA's ``cuda.bindings.runtime`` replaced by a
stand-in that answers as its documentation says (each call returns ``(cudaError_t, *values)``) and keeps what it was
asked. What a GPU adds (that the driver accepts these calls, and the copies' values) is tested by the ``cuda`` tests
of test_input_copies.py."""

from __future__ import annotations

import contextlib
import enum
from types import SimpleNamespace

import pytest
import torch

from airgraph.runtime import feeding


class Error(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorNotSupported = 801


class Kind(enum.IntEnum):
    cudaMemcpyDeviceToDevice = 3


class NodeType(enum.IntEnum):
    cudaGraphNodeTypeKernel = 0
    cudaGraphNodeTypeMemcpy = 1


class Handle:
    """cudaStream_t, cudaGraph_t, cudaGraphExec_t: made from an address (``init_value``)."""

    def __init__(self, init_value: int = 0) -> None:
        self.value = init_value


class Runtime:
    """The part of ``cuda.bindings.runtime`` feeding.py calls. ``graphs``: raw cudaGraph_t address -> its nodes, each a
    (type, params) pair; ``calls``: what it was asked, in order; ``fail``: call name -> the error it returns."""

    cudaError_t, cudaMemcpyKind, cudaGraphNodeType = Error, Kind, NodeType
    cudaStream_t = cudaGraph_t = cudaGraphExec_t = Handle

    def __init__(self) -> None:
        self.device = 0
        self.graphs: dict[int, list[tuple[NodeType, SimpleNamespace]]] = {}
        self.calls: list[tuple] = []
        self.fail: dict[str, Error] = {}

    def cudaGetDevice(self):
        self.calls.append(("cudaGetDevice",))
        return self.fail.get("cudaGetDevice", Error.cudaSuccess), self.device

    def cudaSetDevice(self, index):
        self.calls.append(("cudaSetDevice", index))
        error = self.fail.get("cudaSetDevice", Error.cudaSuccess)
        if error == Error.cudaSuccess:
            self.device = index
        return (error,)

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        self.calls.append(("cudaMemcpyAsync", dst, src, count, kind, stream.value))
        return (self.fail.get("cudaMemcpyAsync", Error.cudaSuccess),)

    def cudaGraphGetNodes(self, graph, count):
        nodes = list(range(len(self.graphs[graph.value])))
        return Error.cudaSuccess, (nodes[:count] if count else None), len(nodes)

    def cudaGraphNodeGetType(self, node):
        return Error.cudaSuccess, self._nodes()[node][0]

    def cudaGraphMemcpyNodeGetParams(self, node):
        return Error.cudaSuccess, self._nodes()[node][1]

    def cudaGraphExecMemcpyNodeSetParams1D(self, exec_, node, dst, src, count, kind):
        self.calls.append(("cudaGraphExecMemcpyNodeSetParams1D", exec_.value, node, dst, src, count, kind))
        return (self.fail.get("cudaGraphExecMemcpyNodeSetParams1D", Error.cudaSuccess),)

    def _nodes(self):
        (nodes,) = self.graphs.values()
        return nodes


def memcpy(dst: int, src: int) -> tuple[NodeType, SimpleNamespace]:
    params = SimpleNamespace(dstPtr=SimpleNamespace(ptr=dst), srcPtr=SimpleNamespace(ptr=src))
    return NodeType.cudaGraphNodeTypeMemcpy, params


class Graph:
    """A ``torch.cuda.CUDAGraph`` recorded with ``keep_graph=True``, as FedGraph uses one."""

    RAW, EXEC = 0x1000, 0x2000

    def __init__(self) -> None:
        self.instantiated = self.replays = 0

    def instantiate(self) -> None:
        self.instantiated += 1

    def raw_cuda_graph(self) -> int:
        return self.RAW

    def raw_cuda_graph_exec(self) -> int:
        assert self.instantiated, "instantiate() first (keep_graph=True)"
        return self.EXEC

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def cudart(monkeypatch):
    runtime = Runtime()
    monkeypatch.setattr(feeding, "bindings", lambda: runtime)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return runtime


def fed_graph(cudart, index: int = 0):
    """Two fed buffers (a float and an int64 one) recorded from two sources, among a kernel and another copy."""
    buffers, sources = (
        [torch.zeros(4), torch.zeros(2, dtype=torch.long)],
        [torch.ones(4), torch.ones(2, dtype=torch.long)],
    )
    cudart.graphs[Graph.RAW] = [
        (NodeType.cudaGraphNodeTypeKernel, None),
        memcpy(buffers[1].data_ptr(), sources[1].data_ptr()),
        memcpy(12345, 67890),  # a copy of the function's own, not a fed one
        memcpy(buffers[0].data_ptr(), sources[0].data_ptr()),
    ]
    graph = Graph()
    return feeding.FedGraph(graph, buffers, sources, index), graph, buffers, sources


def updates(cudart) -> list[tuple]:
    return [call[1:] for call in cudart.calls if call[0] == "cudaGraphExecMemcpyNodeSetParams1D"]


def test_a_fed_graph_finds_its_memcpy_nodes_by_address_and_points_them_at_new_sources_only(cudart):
    fed, graph, buffers, sources = fed_graph(cudart)
    assert graph.instantiated == 1
    fed.feed(sources)  # where they are already: nothing to change
    assert not updates(cudart)
    new = [torch.full((4,), 2.0), torch.full((2,), 2, dtype=torch.long)]
    fed.feed(new)
    d2d = Kind.cudaMemcpyDeviceToDevice
    assert updates(cudart) == [
        (Graph.EXEC, 3, buffers[0].data_ptr(), new[0].data_ptr(), 16, d2d),  # (exec, node, dst, src, bytes, kind)
        (Graph.EXEC, 1, buffers[1].data_ptr(), new[1].data_ptr(), 16, d2d),
    ]
    fed.feed([new[0], sources[1]])  # one moved back
    assert updates(cudart)[2:] == [(Graph.EXEC, 1, buffers[1].data_ptr(), sources[1].data_ptr(), 16, d2d)]
    assert not [call for call in cudart.calls if call[0] in ("cudaSetDevice", "cudaGetDevice")]  # one GPU
    fed.replay()
    assert graph.replays == 1


def test_a_graph_without_a_memcpy_node_for_a_fed_buffer_is_refused(cudart):
    buffer, source = torch.zeros(4), torch.ones(4)
    cudart.graphs[Graph.RAW] = [memcpy(buffer.data_ptr(), 999)]  # the copy's source is not the recorded one
    with pytest.raises(feeding.FeedError, match=r"no memcpy node for its fed input buffers \[0\]"):
        feeding.FedGraph(Graph(), [buffer], [source], 0)


def test_an_update_the_driver_refuses_raises_and_is_tried_again_by_the_next_feed(cudart):
    fed, _, _, sources = fed_graph(cudart)
    new = [torch.full((4,), 2.0), sources[1]]
    cudart.fail["cudaGraphExecMemcpyNodeSetParams1D"] = Error.cudaErrorInvalidValue
    with pytest.raises(feeding.FeedError, match=r"cudaGraphExecMemcpyNodeSetParams1D failed: .*InvalidValue"):
        fed.feed(new)
    del cudart.fail["cudaGraphExecMemcpyNodeSetParams1D"]
    fed.feed(new)  # not taken for done
    assert [u[3] for u in updates(cudart)] == [new[0].data_ptr()] * 2


@pytest.mark.parametrize("current", [0, 1])
def test_with_several_gpus_an_update_runs_on_the_graphs_device_and_the_callers_is_put_back(
    cudart, monkeypatch, current
):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    fed, _, _, sources = fed_graph(cudart, index=1)
    cudart.device, cudart.calls = current, []
    fed.feed([torch.full((4,), 2.0), sources[1]])
    devices = [call for call in cudart.calls if call[0] in ("cudaSetDevice", "cudaGetDevice")]
    if current == 1:  # already the graph's
        assert devices == [("cudaGetDevice",)]
    else:
        assert devices == [("cudaGetDevice",), ("cudaSetDevice", 1), ("cudaSetDevice", 0)]
        setting = cudart.calls.index(("cudaSetDevice", 1))
        assert cudart.calls[setting + 1][0] == "cudaGraphExecMemcpyNodeSetParams1D"  # between the two
    assert cudart.device == current
    cudart.fail["cudaGraphExecMemcpyNodeSetParams1D"] = Error.cudaErrorInvalidValue
    with pytest.raises(feeding.FeedError):
        fed.feed([torch.full((4,), 3.0), sources[1]])
    assert cudart.device == current  # put back on failure too


def test_the_copies_are_recorded_first_on_the_current_stream_then_the_function(cudart, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0xABC))
    buffers, sources = [torch.zeros(4), torch.zeros(3)], [torch.ones(4), torch.ones(3)]
    ran = []
    run = feeding.copies_first(
        lambda args: ran.append(list(cudart.calls)) or "outputs", list(zip(buffers, sources, strict=True))
    )
    assert run(["args"]) == "outputs"
    d2d = Kind.cudaMemcpyDeviceToDevice
    assert ran == [
        [
            ("cudaSetDevice", 0),
            ("cudaMemcpyAsync", buffers[0].data_ptr(), sources[0].data_ptr(), 16, d2d, 0xABC),  # (dst, src, ...)
            ("cudaMemcpyAsync", buffers[1].data_ptr(), sources[1].data_ptr(), 12, d2d, 0xABC),
        ]
    ]
    cudart.fail["cudaMemcpyAsync"] = Error.cudaErrorNotSupported
    with pytest.raises(feeding.FeedError, match=r"cudaMemcpyAsync failed: .*NotSupported"):
        run(["args"])
    assert len(ran) == 1  # the function is not recorded after a failed copy


def test_the_bindings_runtime_is_started_on_a_device_once_outside_captures(cudart, monkeypatch):
    entered = []

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    feeding.started_on.cache_clear()
    cudart.fail["cudaSetDevice"] = Error.cudaErrorInvalidValue
    with pytest.raises(feeding.FeedError, match="cudaSetDevice failed"):
        feeding.started_on(1)
    del cudart.fail["cudaSetDevice"]
    feeding.started_on(1)  # a failure is not cached: tried again
    feeding.started_on(1)
    assert [call for call in cudart.calls if call[0] == "cudaSetDevice"] == [("cudaSetDevice", 1)] * 2
    assert entered == [1, 1]  # inside torch's device guard, which puts torch's current device back
    feeding.started_on.cache_clear()
