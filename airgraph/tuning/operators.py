"""Operator tuning's units: the nodes of a segment that have alternative implementations, and how a choice is
applied to a segment's graph.

A unit is one node of a segment's graph with its real shapes:

- ``linear``: ``addmm(bias, x, t(W))`` / ``mm(x, t(W))`` where ``W`` is an input of the segment (a weight that
  outlives the call) and ``x`` is 2-D: ATen's GEMM (MKL/oneDNN on the CPU, cuBLAS on CUDA) vs prepacked weights vs
  Inductor's GEMM template (tuning/linear.py), a pre-transposed weight, the template's configurations;
- ``matmul``: ``bmm`` / ``mm`` of activations with a non-contiguous operand: as is, or operands made contiguous;
- ``attention``: a scaled-dot-product-attention kernel (the backend was fixed when the graph was traced): the
  device's other SDPA kernels;
- ``conv``: a 2-D ``convolution``: contiguous or channels-last.

A choice is applied by :func:`apply_op_choices`: the node is replaced by the chosen implementation, traced into ATen
ops with ``make_fx`` on the node's own (fake) values, so every kernel backend lowers it as it lowers the rest of the
segment (``airgraph::tuned_linear`` is a custom op both backends call). The replacement keeps the node's output
layout (a channels-last convolution hands back a contiguous result), so the segment's contract with its neighbours
(lowering/layouts.py) holds. The op graph a unit is measured on (:func:`op_graph`) goes through the same function,
so what is measured is what runs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.operator_schemas import normalize_function

from airgraph.tuning.linear import TUNED_LINEAR

__all__ = ["CATEGORIES", "OpUnit", "apply_op_choices", "find_units", "op_graph"]

aten = torch.ops.aten
CATEGORIES = {"linear": "gemm", "matmul": "gemm", "attention": "attention", "conv": "conv"}  # unit -> --ops group

SDPA_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "flash",
    aten._scaled_dot_product_attention_math.default: "math",
    aten._scaled_dot_product_flash_attention.default: "flash",
    aten._scaled_dot_product_efficient_attention.default: "efficient",
    aten._scaled_dot_product_cudnn_attention.default: "cudnn",
}


@dataclass
class OpUnit:
    node: torch.fx.Node  # in the segment's graph
    category: str  # "linear", "matmul", "attention", "conv"
    op_type: str  # "addmm", "mm", "bmm", "sdpa", "convolution"
    name: str  # the seed's op_name: module path/node name
    inputs: list[torch.fx.Node]  # the values the op graph takes, in order
    nodes: list[torch.fx.Node]  # the nodes of the op graph (a weight's transpose, the op)
    current: str = ""  # attention: the kernel the graph has now

    @property
    def dtype(self) -> torch.dtype:
        val = self.node.meta.get("val")
        val = val[0] if isinstance(val, (tuple, list)) else val
        return val.dtype if isinstance(val, torch.Tensor) else torch.float32

    def matches(self, names: tuple[str, ...] | None) -> bool:
        """Whether ``config.tuning.ops`` selects this unit (None: all)."""
        if names is None:
            return True
        wanted = {n.lower() for n in names}
        own = {self.op_type, self.category, CATEGORIES[self.category], self.node.name, self.name}
        aliases = {"linear", "sdpa"} if self.category == "linear" else set()
        return bool(wanted & {o.lower() for o in own | aliases}) or any(self.name.endswith("/" + n) for n in names)


def module_path(node: torch.fx.Node) -> str:
    """The module the node came from ("layers.0.attention"), from Dynamo's nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    return path.split("].", 1)[1] if "]." in path else ("" if path.startswith("L[") else path)


def _op_name(node: torch.fx.Node) -> str:
    path = module_path(node)
    return f"{path}/{node.name}" if path else node.name


def _is_tensor(node: Any, rank: int | None = None) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and (rank is None or val.dim() == rank)


def _transposed_weight(node: Any) -> torch.fx.Node | None:
    """``W`` when ``node`` is ``t(W)`` or ``permute(W, [1, 0])`` of a 2-D segment input, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    is_t = node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0])
    weight = node.args[0]
    if is_t and isinstance(weight, torch.fx.Node) and weight.op == "placeholder" and _is_tensor(weight, 2):
        return weight
    return None


def _unit(node: torch.fx.Node) -> OpUnit | None:
    target, name = node.target, _op_name(node)
    if target in (aten.addmm.default, aten.mm.default):
        addmm = target is aten.addmm.default
        if addmm and (node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1):
            return None
        x, mat2 = node.args[-2], node.args[-1]
        bias = node.args[0] if addmm else None
        weight = _transposed_weight(mat2)
        if weight is not None and _is_tensor(x, 2) and (bias is None or _is_tensor(bias, 1)):
            inputs = [x, weight] + ([bias] if bias is not None else [])
            return OpUnit(node, "linear", target.__name__.split(".")[0], name, inputs, [mat2, node])
        target_name = target.__name__.split(".")[0]
        if not addmm and _is_tensor(x, 2) and _is_tensor(mat2, 2) and _non_contiguous(node.args):
            return OpUnit(node, "matmul", target_name, name, list(node.args), [node])
        return None
    if target is aten.bmm.default and _non_contiguous(node.args):
        return OpUnit(node, "matmul", "bmm", name, list(node.args), [node])
    if target in SDPA_OPS:
        args = _sdpa_args(node)
        if args is None or any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in node.users):
            return None  # only the attention output is used (not the logsumexp or the debug outputs)
        inputs = [n for n in node.all_input_nodes]
        return OpUnit(node, "attention", "sdpa", name, inputs, [node], current=SDPA_OPS[target])
    if target is aten.convolution.default and _is_tensor(node.args[0], 4) and not node.args[6]:
        if _channels_last(node.args[0]) or _channels_last(node):
            return None
        return OpUnit(node, "conv", "convolution", name, list(node.all_input_nodes), [node])
    return None


def _non_contiguous(args: tuple) -> bool:
    return any(_is_tensor(a) and not a.meta["val"].is_contiguous() for a in args)


def _channels_last(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last)


def find_units(gm: torch.fx.GraphModule) -> list[OpUnit]:
    """The tunable nodes of a segment's graph, in graph order (with symbolic shapes too: their keys are None, as
    tuning covers static shapes only, as AOE does)."""
    units = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            unit = _unit(node)
            if unit is not None:
                units.append(unit)
    return units


def op_graph(unit: OpUnit) -> torch.fx.GraphModule:
    """The unit alone: placeholders for its inputs, its nodes, its output (the node's value; for attention the
    first of its outputs)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    names: set[str] = set()
    for node in unit.inputs:  # inputs from two graphs may share a name: an argument name must be unique
        name = node.name
        while name in names:
            name += "_"
        names.add(name)
        env[node] = graph.placeholder(name)
        env[node].meta = dict(node.meta)
    for node in unit.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    out = env[unit.node]
    if unit.category == "attention":
        out = graph.call_function(operator.getitem, (out, 0))
        out.meta["val"] = unit.node.meta["val"][0]
    graph.output((out,))
    return torch.fx.GraphModule(torch.nn.Module(), graph, class_name=f"Op_{unit.op_type}")


# -- applying choices ---------------------------------------------------------------------------------------
def _linear_impl(node: torch.fx.Node, choice: dict[str, Any]) -> tuple[list[Any], Callable[..., Any]]:
    addmm = node.target is aten.addmm.default
    bias = node.args[0] if addmm else None
    x, weight = node.args[-2], _transposed_weight(node.args[-1])
    impl, schedule = choice["options"]["impl"], choice["options"].get("schedule", "")
    if bias is None:
        return [x, weight], lambda x_, w_: TUNED_LINEAR(x_, w_, None, impl, schedule)
    return [x, weight, bias], lambda x_, w_, b_: TUNED_LINEAR(x_, w_, b_, impl, schedule)


def _matmul_impl(node: torch.fx.Node, choice: dict[str, Any]) -> tuple[list[Any], Callable[..., Any]]:
    target = node.target
    return list(node.args), lambda a, b: target(a.contiguous(), b.contiguous())


def _sdpa_args(node: torch.fx.Node) -> dict[str, Any] | None:
    found = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if found is None:
        return None
    kw = dict(found.kwargs)
    if kw.get("dropout_p", 0.0) != 0.0:
        return None
    mask = kw.get("attn_mask", kw.get("attn_bias"))
    return {"q": kw["query"], "k": kw["key"], "v": kw["value"], "mask": mask, "causal": bool(kw.get("is_causal"))} | {
        "scale": kw.get("scale")
    }


def sdpa_call(kernel: str, q: Any, k: Any, v: Any, mask: Any, causal: bool, scale: float | None) -> Any:
    """The attention output of SDPA kernel ``kernel`` (the first of the kernel's outputs)."""
    if kernel == "math":
        return aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, causal, None, scale=scale)[0]
    if kernel == "flash" and q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[0]
    if kernel == "flash":
        if mask is not None:
            raise RuntimeError("the flash kernel takes no attention mask")
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[0]
    if kernel == "efficient":
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, 0.0, causal, scale=scale)[0]
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, False, 0.0, causal, False, scale=scale)[0]
    raise ValueError(f"unknown SDPA kernel {kernel!r}")


def _attention_impl(node: torch.fx.Node, choice: dict[str, Any]) -> tuple[list[Any], Callable[..., Any]]:
    args = _sdpa_args(node)
    assert args is not None
    kernel, causal, scale = choice["options"]["kernel"], args["causal"], args["scale"]
    if args["mask"] is None:
        return [args["q"], args["k"], args["v"]], lambda q, k, v: sdpa_call(kernel, q, k, v, None, causal, scale)
    return [args["q"], args["k"], args["v"], args["mask"]], lambda q, k, v, m: sdpa_call(
        kernel, q, k, v, m, causal, scale
    )


def _conv_impl(node: torch.fx.Node, choice: dict[str, Any]) -> tuple[list[Any], Callable[..., Any]]:
    x, weight, bias, *rest = node.args
    cl = torch.channels_last

    def conv(x_: Any, w_: Any, *b_: Any) -> Any:
        out = aten.convolution(x_.contiguous(memory_format=cl), w_.contiguous(memory_format=cl), *b_, *rest)
        return out.contiguous()

    if bias is None:
        return [x, weight], lambda x_, w_: conv(x_, w_, None)
    return [x, weight, bias], conv


_IMPLS = {"linear": _linear_impl, "matmul": _matmul_impl, "attention": _attention_impl, "conv": _conv_impl}


def apply_op_choices(gm: torch.fx.GraphModule, choices: dict[str, dict[str, Any]]) -> torch.fx.GraphModule:
    """A copy of ``gm`` with each node named in ``choices`` replaced by its chosen implementation (see the module
    docstring). ``choices``: node name -> ``{"tune_mode", "name", "options"}`` as the bank stores them."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    replaced: dict[torch.fx.Node, torch.fx.Node | None] = {}  # an attention node's getitems -> the new output
    units = {u.node.name: u for u in find_units(gm)}
    unknown = set(choices) - set(units)
    if unknown:
        raise ValueError(f"tuning choices for nodes that are not tunable here: {', '.join(sorted(unknown))}")
    for node in gm.graph.nodes:
        if node in replaced:
            if replaced[node] is not None:
                env[node] = replaced[node]
        elif node.name in choices:
            unit = units[node.name]
            inputs, fn = _IMPLS[unit.category](node, choices[node.name])
            expected = node.meta["val"][0] if unit.category == "attention" else node.meta["val"]

            def laid_out(*args: Any, fn: Callable[..., Any] = fn, expected: Any = expected) -> Any:
                return restride(fn(*args), expected)

            out = _inline(graph, laid_out, [env[n] for n in inputs], [n.meta["val"] for n in inputs])
            _check_layout(out, expected, node)
            if unit.category == "attention":
                for user in node.users:
                    replaced[user] = out if user.args[1] == 0 else None  # the others are unused
            else:
                env[node] = out
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.eliminate_dead_code()
    new = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    return new


def _inline(graph: torch.fx.Graph, fn: Callable[..., Any], args: list[torch.fx.Node], vals: list[Any]) -> torch.fx.Node:
    """Trace ``fn`` on the fake ``vals`` into ATen ops and copy them into ``graph`` reading ``args``."""
    mode = detect_fake_mode(vals)
    with mode if mode is not None else torch._subclasses.FakeTensorMode():
        traced = make_fx(fn)(*vals)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = iter(args)
    out = None
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "output":
            out = env[node.args[0]]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    assert out is not None
    return out


def restride(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` laid out with ``like``'s strides (a dense layout): as it is when they already match, else through
    one copy (permute to ``like``'s dimension order, make contiguous, permute back)."""
    if tuple(value.stride()) == tuple(like.stride()):
        return value
    order = sorted(range(like.dim()), key=lambda d: (-like.stride()[d], -d))
    inverse = [order.index(d) for d in range(like.dim())]
    return value.permute(order).contiguous().permute(inverse)


def _check_layout(new: torch.fx.Node, expected: Any, node: torch.fx.Node) -> None:
    val = new.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return
    got, want = (tuple(val.shape), tuple(val.stride())), (tuple(expected.shape), tuple(expected.stride()))
    if got != want:
        raise ValueError(f"the tuned implementation of {node.name} returns sizes, strides {got}; the graph has {want}")
