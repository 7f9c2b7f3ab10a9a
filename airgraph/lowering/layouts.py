"""The strides values really have at run time, segment by segment: the contract between compiled graphs.

A traced ATen graph says what strides each value has in eager PyTorch (``node.meta["val"]``). Compiled code
may choose others: Inductor lays out convolution activations channels-last when that is faster, and reports
the strides its graph's outputs really have; AOTAutograd reads that report (lowering/aot.py)
after compiling a forward graph and compiles the backward for saved tensors in those layouts (the backward's
example inputs are restrided, and no longer match the backward graph's ``meta["val"]``).

A graph cut into segments must keep that contract at every boundary, inside the graph as at its edges:

- a segment is compiled for the strides its inputs will really have: the graph's example inputs (not the
  placeholders' traced values), or what an earlier segment really returns;
- what a segment really returns is what its kernel backend reports (Inductor), or, for backends that run the
  graph's own ATen ops (aten, interpreter), what those ops give on inputs of those strides (fake propagation,
  only when an input's layout differs from the traced one);
- the graph reports its own outputs' real strides to AOTAutograd, in graph output order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airgraph.lowering import aot

__all__ = ["Layouts", "real_outputs", "same_layout"]


class Layouts:
    """Node -> the (fake) value it really has at run time, for values that cross a segment boundary."""

    def __init__(self, placeholders: list[torch.fx.Node], example_inputs: list[Any]) -> None:
        # AOTAutograd's example inputs are the truth for the graph's inputs (restrided saved activations).
        self.values: dict[torch.fx.Node, Any] = dict(zip(placeholders, example_inputs, strict=True))
        # A graph input a segment returns (partition.py: a lone segment returns the inputs the graph returns)
        # may come back as a copy in another layout; the input itself keeps its own (``values``).
        self.returned: dict[torch.fx.Node, Any] = {}

    def value(self, node: torch.fx.Node) -> Any:
        return self.values.get(node, node.meta.get("val"))

    def inputs(self, nodes: list[torch.fx.Node]) -> list[Any]:
        """The example inputs to compile a segment reading ``nodes`` for."""
        return [self.value(n) for n in nodes]

    def restrided(self, nodes: list[torch.fx.Node]) -> bool:
        """Whether any of ``nodes`` runs with a layout other than its traced one."""
        return any(not same_layout(self.value(n), n.meta.get("val")) for n in nodes)

    def record(self, outputs: list[torch.fx.Node], values: list[Any] | None) -> None:
        """The segment producing ``outputs`` really returns ``values`` (None: the traced ones)."""
        if values is None:
            return
        for node, value in zip(outputs, values, strict=True):
            if node.op == "placeholder":
                self.returned[node] = value
            elif isinstance(value, torch.Tensor) and not same_layout(value, node.meta.get("val")):
                self.values[node] = value

    def report(self, graph_outputs: list[Any]) -> None:
        """Tell AOTAutograd the graph outputs' real strides (lowering/aot.py), when it asks."""
        strides = []
        for node in graph_outputs:
            value = self.returned.get(node, self.value(node)) if isinstance(node, torch.fx.Node) else None
            strides.append(tuple(value.stride()) if isinstance(value, torch.Tensor) else None)
        aot.report_output_strides(strides)


def same_layout(a: Any, b: Any) -> bool:
    """Same strides, as far as is known without adding a guard (a symbolic difference counts as different)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a is b or not (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor))
    if a is b:
        return True
    return same_strides(a.stride(), b.stride())


def same_strides(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))


def propagate(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[Any] | None:
    """The fake values ``gm``'s own ATen ops return for ``inputs`` (fake tensors), or None without a fake mode."""
    mode = detect_fake_mode(inputs)
    if mode is None:
        return None
    allow, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True  # constants of the graph are real
    try:
        with mode:
            return list(torch.fx.Interpreter(gm).run(*inputs))
    finally:
        mode.allow_non_fake_inputs = allow


def real_outputs(
    compile_segment: Callable[[list[Any]], Any], gm: torch.fx.GraphModule, inputs: list[Any], *, reports: bool
) -> tuple[Any, list[Any] | None]:
    """Compile a segment on ``inputs`` and find the values its outputs really have.

    ``reports``: the backend reports its outputs' strides (Inductor); otherwise it runs ``gm``'s ops as they are,
    and its outputs have the traced layouts unless an input's does not (then they are fake-propagated).
    """
    traced = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    if reports:
        # A list of our own for what the compiler reports; the enclosing graph's (AOTAutograd's) is left alone.
        with aot.reported_output_strides() as strides:
            compiled = compile_segment(inputs)
        if not strides:
            return compiled, None
        vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in _outputs(gm)]
        return compiled, [_with_strides(v, s) for v, s in zip(vals, strides, strict=True)]
    compiled = compile_segment(inputs)
    if all(same_layout(a, b) for a, b in zip(inputs, traced, strict=True)):
        return compiled, None
    return compiled, propagate(gm, inputs)


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.find_nodes(op="output")[0].args[0])


def _with_strides(val: Any, strides: tuple | None) -> Any:
    """``val`` (a traced fake value) as a new tensor with ``strides`` (which may span more memory: padding)."""
    if not isinstance(val, torch.Tensor) or strides is None or same_strides(val.stride(), tuple(strides)):
        return val
    mode = detect_fake_mode([val])
    with mode if mode is not None else contextlib.nullcontext():
        return torch.empty_strided(val.size(), strides, dtype=val.dtype, device=val.device)
