"""CPU tensors standing for CUDA ones: the simulator's device (``SimulatedCuda.to_device``), its ops, and the cost
model of ``SimulatedCuda.time``.

The simulator runs CPU graphs as if they were CUDA graphs, but every value is a CPU tensor, so what depends on a
value's device would not run. With tensors placed on the simulated device (:class:`Placement`), it does:

- **tracing**: while a compiled function is called under ``SimulatedCuda.call()``, Dynamo and AOTAutograd fake
  every placed tensor as a CUDA tensor; every pass, the capture plan and the host split take their CUDA paths;
- **running**: the real values stay CPU tensors; device work runs under :class:`DeviceOps`, which reads a
  ``device="cuda"`` argument as the CPU and runs every op past the GPU state the simulator models
  (simulated_state.py).

Invariants: results are the eager CPU results whenever the CUDA logic is right; attention traces as the math
kernel; kernel backends are the ATen one and the interpreter (Inductor would generate Triton kernels).
docs/design/simulator.md has the details.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from airgraph.graph.fake_guard import fake_cuda_guard
from airgraph.graph.meta import tensors, transfer_device
from airgraph.runtime.simulated_state import GEMMS, SimulatedCudaError, host_sync

__all__ = ["CostModel", "DeviceFunctions", "DeviceOps", "Placement", "device_to_host"]

_CPU, _CUDA = torch.device("cpu"), torch.device("cuda", 0)


class Placement:
    """The tensors placed on the simulated device, and the tracing scope that fakes them as CUDA tensors."""

    def __init__(self) -> None:
        self._placed: dict[int, weakref.ref] = {}
        self._fakes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(CPU fake) -> (it, its CUDA twin)
        self._active = False

    def __bool__(self) -> bool:
        return bool(self._placed)

    def place(self, value: Any) -> None:
        """``value`` (a tensor, a module: its parameters and buffers) now lives on the simulated device."""
        if isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                self.place(tensor)
        elif isinstance(value, torch.Tensor):
            key = id(value)
            self._placed[key] = weakref.ref(value, lambda _: self._placed.pop(key, None))
        else:
            raise TypeError(f"SimulatedCuda.to_device takes tensors and modules, not {type(value).__name__}")

    def placed(self, t: torch.Tensor) -> bool:
        """Whether ``t``, or the tensor it is a view of, was placed on the simulated device."""
        for candidate in (t, t._base):
            ref = self._placed.get(id(candidate)) if candidate is not None else None
            if ref is not None and ref() is candidate:
                return True
        return False

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Fake placed tensors as CUDA tensors for the duration (docs/design/simulator.md); re-entrant."""
        if self._active or not self._placed:
            yield
            return
        original = FakeTensorMode.from_tensor
        placement = self

        def from_tensor(mode: FakeTensorMode, tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            fake = original(mode, tensor, **kwargs)
            if fake.device.type != "cpu" or not placement.placed(tensor):
                return fake
            if id(fake) not in placement._fakes:  # one CUDA twin per fake: Dynamo and AOTAutograd share it
                with _disable_current_modes(), mode:
                    placement._fakes[id(fake)] = (fake, fake.to(_CUDA))
            return placement._fakes[id(fake)][1]

        self._active = True
        FakeTensorMode.from_tensor = from_tensor
        try:
            with fake_cuda_guard(), sdpa_kernel([SDPBackend.MATH]):
                yield
        finally:
            FakeTensorMode.from_tensor = original
            self._active = False
            self._fakes.clear()


def _on_cpu(value: Any) -> Any:
    return _CPU if isinstance(value, torch.device) and value.type == "cuda" else value


class DeviceFunctions(TorchFunctionMode):
    """Reads ``device="cuda"`` as the CPU before PyTorch's Python bindings see it: a factory's binding
    initializes the device it names before any dispatch (the ATen kernel backend calls those bindings)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args = tuple(_on_cpu(a) for a in args)
        return func(*args, **{k: _on_cpu(v) for k, v in (kwargs or {}).items()})


class DeviceOps(TorchDispatchMode):
    """Runs the simulated device's ops on the CPU, past the GPU state the simulator models (simulated_state.py)."""

    def __init__(self, runtime: Any) -> None:  # runtime: the SimulatedCuda
        super().__init__()
        self.runtime = runtime

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rt = self.runtime
        args = tuple(_on_cpu(a) for a in args)
        kwargs = {k: _on_cpu(v) for k, v in (kwargs or {}).items()}
        graph = rt.recording
        if graph is not None and (why := host_sync(func, args, kwargs)):
            graph.invalidated = f"{func} ran while recording: {why}"
            raise SimulatedCudaError(f"operation not permitted when stream is capturing: {graph.invalidated}")
        tags = getattr(func, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            rt.generator.draw(recording=graph is not None)
        if getattr(func, "overloadpacket", None) in GEMMS and not rt.replaying:
            workspace = rt.workspaces.use(rt.current_stream(), graph.pool if graph is not None else None)
            if graph is not None:
                graph.workspaces.add(workspace)
        if func is torch.ops.prims.device_put.default:
            return args[0].clone()  # a copy to the device is new memory (on one device, device_put returns its input)
        return func(*args, **kwargs)


def device_to_host(node: torch.fx.Node) -> bool:
    """Whether ``node`` copies a device value to the host (a sync: refused while recording)."""
    if node.op != "call_function":
        return False
    device = transfer_device(node)
    if device is not None:
        source = node.args[0]
    elif node.target is torch.ops.aten.copy_.default:
        dst, source = node.args[0], node.args[1]
        device = next((t.device for t in tensors(dst.meta.get("val"))), None)
    else:
        return False
    from_device = [t for t in tensors(getattr(source, "meta", {}).get("val")) if t.device.type != "cpu"]
    return device is not None and device.type == "cpu" and bool(from_device)


class CostModel(TorchDispatchMode):
    """Sums the modelled cost of the ATen ops dispatched inside (views and metadata ops are free)."""

    def __init__(self, launch: float, bandwidth: float) -> None:
        super().__init__()
        self.launch, self.bandwidth, self.seconds = launch, bandwidth, 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.seconds += self.launch + sum(t.numel() * t.element_size() for t in tensors) / self.bandwidth
        return out
