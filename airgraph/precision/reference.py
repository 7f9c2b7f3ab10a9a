"""The reference values a segment is checked against: the recorded ATen graph interpreted op by op.

The graph is interpreted (``torch.fx.Interpreter``, each op run by the graph's device runtime) on the inputs of
its last compiled call, and every node's value is kept; a placeholder keeps its value from before the graph wrote
any (an input mutation's ``copy_``). In reduce-overhead with host work split off the CUDA graph
(lowering/host_split.py), the device program's segments are nodes of another graph module, copied from the graph's
node by node with their meta: a copy's original is the graph's node holding the same traced value (the object
itself), of the same name where several hold it (an op writing in place returns its input); a transfer's or a
feed's placeholder is the transfer or the host value it stands for. Each copy then gets its original's value.

Invariants: the recorded inputs are never written (the interpreter runs on copies); a node whose original is not
found has no reference value, so its segment is not checked (and the report says so).
"""

from __future__ import annotations

from typing import Any

import torch

from airgraph.precision.record import copy_value
from airgraph.runtime.device import DeviceRuntime

__all__ = ["reference_values"]


class _Reference(torch.fx.Interpreter):
    """Runs the graph op by op through ``runtime`` and keeps every node's value."""

    def __init__(self, gm: torch.fx.GraphModule, runtime: DeviceRuntime) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.runtime = runtime

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return self.runtime.run_op(target, *args, **kwargs)

    def values(self, inputs: list[Any]) -> dict[torch.fx.Node, Any]:
        self.run(*[copy_value(v) for v in inputs])
        for node, value in zip(self.graph.find_nodes(op="placeholder"), inputs, strict=True):
            self.env[node] = value
        return self.env


def reference_values(
    gm: torch.fx.GraphModule, others: list[torch.fx.GraphModule], inputs: list[Any], runtime: DeviceRuntime
) -> dict[torch.fx.Node, Any]:
    """Every node's value in ``gm`` on ``inputs``, and in each of ``others`` (device programs split off ``gm``) that
    of its original's."""
    values = dict(_Reference(gm, runtime).values(inputs))
    for program in others:
        for copy, original in _originals(gm, program).items():
            if original in values:
                values[copy] = values[original]
    return values


def _originals(gm: torch.fx.GraphModule, program: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each node of ``program`` and the node of ``gm`` it copies (module docstring)."""
    holders: dict[int, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op != "output" and node.meta.get("val") is not None:
            holders.setdefault(id(node.meta["val"]), []).append(node)
    found = {}
    for node in program.graph.nodes:
        candidates = holders.get(id(node.meta.get("val")), []) if node.op != "output" else []
        named = [c for c in candidates if c.name == node.name]
        if named or len(candidates) == 1:
            found[node] = (named or candidates)[0]
    return found
