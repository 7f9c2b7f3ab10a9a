"""Small helpers shared by tests: configs, compiling with a fresh backend, tolerances per dtype."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.lowering.lower import lower_segments
from airgraph.lowering.select import GraphRequest
from airgraph.runtime.simulated import SimGraph, SimulatedCuda

TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2},
}


class Step(torch.nn.Module):
    """A small residual MLP step (seeded weights): the model the fast path's and the input copies' tests call."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


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


@dataclass
class Target:
    """Where a capture test runs: a real GPU, or CPU tensors with CUDA streams and graphs simulated (a test
    marked `cuda` as a whole runs on the GPU only)."""

    device: str
    runtime: SimulatedCuda | None

    def compile(self, fn, **options):
        """``fn`` compiled for this target (each call checked, when simulated), and its backend."""
        compiled, backend = compile_with(fn, runtime=self.runtime, **options)
        if self.runtime is None:
            return compiled, backend

        def checked(*args, **kwargs):
            with self.runtime.call():
                return compiled(*args, **kwargs)

        return checked, backend

    def check(self) -> None:
        if self.runtime is not None:
            self.runtime.check()

    def new_stream(self):
        return self.runtime.new_stream(name="caller's side stream") if self.runtime else torch.cuda.Stream()

    def use(self, stream):
        return self.runtime.use(stream) if self.runtime else torch.cuda.stream(stream)

    def current_stream(self):
        return self.runtime.current_stream() if self.runtime else torch.cuda.current_stream()

    def graph_class(self) -> type:
        return SimGraph if self.runtime else torch.cuda.CUDAGraph


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
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now: each socket stays bound until all are chosen, so two
    rendezvous started at once never get the same port (one at a time, the system may hand out one twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def exited_pid() -> int:
    """The pid of a process of this machine that has exited (a claim or registration left behind by a crash)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@torch.library.custom_op("airgraph_test::unsafe_double", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def unsafe_double(x: torch.Tensor) -> torch.Tensor:
    """A custom op tagged ``cudagraph_unsafe``: capture must refuse a graph holding it."""
    return x * 2


@unsafe_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def cuda_unusable() -> str | None:
    """Why CUDA is unusable now (a test left the default generator in capture mode, the device in a sticky error, a
    capture that cannot begin), or None: a random op and a small capture on a fresh pool, checked against eager.
    Where it is unusable, the generator is reset (what a failed airgraph capture does), so the next test starts
    clean when that was all."""
    from airgraph.runtime.device import _CudaRecording

    try:
        x = torch.rand(8, device="cuda")
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=stream):
            y = x * 2 + torch.rand_like(x) * 0
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(y, x * 2):
            return "a captured graph's replay differs from eager"
        return None
    except Exception as exc:  # every failure is the answer
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    with contextlib.suppress(Exception):  # a sticky error: nothing resets it in this process
        _CudaRecording(torch.cuda.current_device(), None).reset_generator()
    return reason


def top_level_ops(events: Any) -> list[str]:
    """Names of the ATen ops in profiler ``events`` that no other ATen op called (a call's own dispatches)."""

    def nested(event: Any) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return True
            parent = parent.cpu_parent
        return False

    return [e.name for e in events if e.name.startswith("aten::") and not nested(e)]


def load_script(name: str) -> Any:
    """The module of ``scripts/<name>.py`` (scripts are not a package), loaded afresh."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
