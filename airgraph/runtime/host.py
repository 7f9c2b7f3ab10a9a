"""reduce-overhead with host work: runs a :class:`~airgraph.graph.program.HostProgram` (lowering/host_split.py).

:class:`HostSplit` runs the static host work once per shape key, the per-call host work before every replay and
copies their values to the device around the CUDA graph of the device part (runtime/capture.py has the policy and
calls the pieces); called directly it runs all of it uncaptured (warm-up, keys that are not captured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.graph.program import HostProgram, Transfer
from airgraph.runtime.device import CUDA, DeviceRuntime

__all__ = ["HostSplit", "refill", "transfer"]


def _source(t: Transfer, value: torch.Tensor, runtime: DeviceRuntime) -> torch.Tensor:
    if not t.pin:
        return value
    return runtime.pinned_copy(value) if t.graph_input else runtime.pinned(value)


def transfer(t: Transfer, value: torch.Tensor, runtime: DeviceRuntime = CUDA) -> torch.Tensor:
    """The graph's own copy op on ``value``: a new device tensor."""
    return runtime.run_op(t.op, _source(t, value, runtime), *t.args, **t.kwargs)


def refill(t: Transfer, buffer: torch.Tensor, value: torch.Tensor, runtime: DeviceRuntime = CUDA) -> None:
    """Copy this call's ``value`` into the static ``buffer`` the CUDA graph reads, on the current stream."""
    if buffer.shape != value.shape:  # plan_host_work refuses data-dependent shapes; never broadcast
        raise RuntimeError(
            f"airgraph: host value for {t.name} has shape {tuple(value.shape)} but the CUDA graph was "
            f"recorded with {tuple(buffer.shape)}"
        )
    runtime.copy_(buffer, _source(t, value, runtime), non_blocking=t.non_blocking)


class HostSplit:
    """The host pieces of a program around its device part (``device_fn``, the device part's executor).

    Values live in slots: the graph inputs first, then the static results, then the per-call results.
    """

    def __init__(self, program: HostProgram, device_fn: Callable[[list], Any], runtime: DeviceRuntime = CUDA) -> None:
        boxed(self)
        self.program = program
        self.device_fn = device_fn
        self.runtime = runtime
        self.transfers = program.transfers
        self.last_run: tuple[list, list] | None = None
        # Positions of the graph's CPU tensor inputs, as traced (the device part's first placeholders are the graph's).
        placeholders = program.device_gm.graph.find_nodes(op="placeholder")
        self.host_inputs = frozenset(
            i for i, n in enumerate(placeholders) if isinstance(v := n.meta.get("val"), torch.Tensor) and v.is_cpu
        )

    def run_static(self, args: list) -> list:
        """The static host values for these inputs' shape key."""
        p = self.program
        return list(p.static_fn([args[i] for i in p.static_in])) if p.static_fn is not None else []

    def run_per_call(self, args: list, statics: list) -> list:
        """This call's per-call host values."""
        p = self.program
        if p.per_call_fn is None:
            return []
        values = [*args, *statics]
        return list(p.per_call_fn([values[i] for i in p.per_call_in]))

    def boundary(self, values: list) -> list:
        """The device part's extra inputs: each transfer's device copy, then each feed."""
        p = self.program
        return [transfer(t, values[t.source], self.runtime) for t in p.transfers] + [values[i] for i in p.feeds]

    def assemble(self, device_outputs: list, values: list, *, clone_static: bool) -> list:
        """The graph outputs from the device part's outputs and the host values."""
        low, high = self.program.static_slots
        result = []
        for where, what in self.program.recipe:
            if where == "device":
                result.append(device_outputs[what])
            elif where == "host":
                value = values[what]
                copy = clone_static and low <= what < high and isinstance(value, torch.Tensor)
                result.append(value.clone() if copy else value)
            else:
                result.append(what)
        return result

    def __call__(self, args: list) -> list:
        """Uncaptured: host work, transfers and the device part in order."""
        inputs = list(args)
        args.clear()
        statics = self.run_static(inputs)
        values = [*inputs, *statics, *self.run_per_call(inputs, statics)]
        self.last_run = (statics, values)  # GraphCapture records from these: the host work runs once a call
        outputs = self.device_fn([*inputs, *self.boundary(values)])
        return self.assemble(list(outputs), values, clone_static=False)
