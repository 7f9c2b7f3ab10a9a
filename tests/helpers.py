"""Small helpers shared by tests: configs, compiling with a fresh backend, tolerances per dtype."""

from __future__ import annotations

import socket
from typing import Any

import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.lowering.lower import lower_segments
from airgraph.lowering.select import GraphRequest

TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2},
}


def make_config(**options: Any) -> airgraph.CompilerConfig:
    """A config from flat options; dotted names reach groups: make_config(**{"debug.run_eagerly": True})."""
    config = airgraph.CompilerConfig()
    for name, value in options.items():
        group = config
        *path, leaf = name.split(".")
        for part in path:
            group = getattr(group, part)
        setattr(group, leaf, value)
    return config


def compile_with(fn: Any, *, dynamic: bool | None = None, fullgraph: bool = False, runtime: Any = None, **options: Any):
    """``fn`` compiled with a fresh backend of these options (``runtime``: e.g. a SimulatedCuda), and the backend."""
    backend = AirgraphBackend(make_config(**options), runtime=runtime)
    return torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=fullgraph), backend


def graph_request(backend: str = "aten", *, kind: str = "inference", device: str = "cpu") -> GraphRequest:
    """What the backend asks the seam for a graph, with ``backend`` as the configured kernel backend
    ("interpreter": debug.run_eagerly)."""
    options = {"debug.run_eagerly": True} if backend == "interpreter" else {"kernel_backend": backend}
    return GraphRequest(kind, torch.device(device), make_config(**options))


def lower_all(segments: list, backend: str = "aten", *, kind: str = "inference", device: str = "cpu") -> None:
    """Choose and lower every compute segment as the backend would, ``backend`` configured."""
    lower_segments(segments, graph_request(backend, kind=kind, device=device))


def assert_close(actual: Any, expected: Any) -> None:
    dtype = expected.dtype if isinstance(expected, torch.Tensor) else torch.float32
    torch.testing.assert_close(actual, expected, **TOLERANCES.get(dtype, {}))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@torch.library.custom_op("airgraph_test::unsafe_double", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def unsafe_double(x: torch.Tensor) -> torch.Tensor:
    """A custom op tagged ``cudagraph_unsafe``: capture must refuse a graph holding it."""
    return x * 2


@unsafe_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
