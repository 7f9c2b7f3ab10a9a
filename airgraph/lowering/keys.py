"""Keys that name a segment across processes: what it computes (graph key) and at which shapes (shape key).

The static-kernel library and the tuning bank store their answers under these keys, so they must be stable: the
same segment traced in another process (other node names, other object ids) gets the same graph key.

- ``graph_key(gm)``: a digest of the segment's canonical text: its ops in order with their arguments (values
  by position, Python constants by value, tensor constants by their bytes' digest) and its inputs' dtypes and
  ranks. Sizes are not in it, except where the graph itself holds them as constants (a static-shape graph).
  It also names a Dynamo graph (torch-level ops, methods by name), for the static kernels' warm start.
- ``shape_key(values)``: the concrete (dtype, sizes, strides) of each tensor input and the value of each other
  input, or None while any of them is symbolic (a dynamic-shape graph has one per call, see runtime).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

__all__ = ["canonical_text", "graph_key", "shape_key"]


def shape_key(values: list[Any]) -> tuple | None:
    key = []
    for value in values:
        if isinstance(value, torch.Tensor):
            dims = (*value.shape, *value.stride())
            if any(isinstance(d, torch.SymInt) for d in dims):
                return None
            key.append((str(value.dtype).removeprefix("torch."), tuple(value.shape), tuple(value.stride())))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:
            key.append(value)
    return tuple(key)


def graph_key(gm: torch.fx.GraphModule) -> str:
    return hashlib.sha256(canonical_text(gm).encode()).hexdigest()[:32]


def canonical_text(gm: torch.fx.GraphModule) -> str:
    """One line per node, names replaced by positions, so equal computations read equal."""
    index: dict[torch.fx.Node, str] = {}
    lines = []
    for node in gm.graph.nodes:
        index[node] = f"%{len(index)}"
        if node.op == "placeholder":  # ATen graphs keep the traced value in "val", Dynamo's in "example_value"
            lines.append(f"input {_value_meta(node.meta.get('val', node.meta.get('example_value')))}")
        elif node.op == "get_attr":
            lines.append(f"constant {_constant(getattr(gm, node.target, None))}")
        elif node.op == "output":
            lines.append(f"output {_arg(node.args[0], index)}")
        else:
            args = _arg(node.args, index)
            kwargs = _arg(dict(sorted(node.kwargs.items())), index)
            method = "method " if node.op == "call_method" else ""  # x.view(...) in a Dynamo graph
            lines.append(f"{method}{_target(node.target)} {args} {kwargs}")
    return "\n".join(lines)


def _target(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"


def _value_meta(val: Any) -> str:
    if isinstance(val, torch.Tensor):
        return f"tensor({str(val.dtype).removeprefix('torch.')}, rank {val.dim()}, {val.device.type})"
    if isinstance(val, (torch.SymInt, int)):
        return "int"
    if isinstance(val, (torch.SymFloat, float)):
        return "float"
    return type(val).__name__


def _constant(value: Any) -> str:
    if isinstance(value, FakeTensor):  # a constant known by its metadata only
        return f"tensor({str(value.dtype).removeprefix('torch.')}, {tuple(value.shape)}, fake)"
    if isinstance(value, torch.Tensor):
        # A real constant read while a graph compiles, under the compile's FakeTensorMode: leave that mode to
        # read its bytes (as a kernel would read them), else fake mode refuses the real tensor.
        with unset_fake_temporarily():
            data = value.detach().cpu().contiguous()
            digest = hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        digest = digest[:16]
        return f"tensor({str(value.dtype).removeprefix('torch.')}, {tuple(value.shape)}, {digest})"
    return repr(value)


def _arg(value: Any, index: dict[torch.fx.Node, str]) -> str:
    if isinstance(value, torch.fx.Node):
        return index[value]
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_arg(v, index) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_arg(v, index)}" for k, v in value.items()) + "}"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "sym"
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return repr(value)
