"""concat_linear: matmuls of one input by constant weights become one matmul over the weights concatenated.

An attention block projects one input three times (q, k, v) and a SwiGLU block twice (gate, up): three or two
``mm`` (``addmm`` with a bias) nodes reading the same input, each by a constant weight (``get_attr``, or its
``t``/``permute``: ``nn.Linear``'s layout), which config.frozen_parameters makes of the parameters
(lowering/freeze.py). They become one ``mm`` over a constant concatenated once, at compile time, and a ``slice``
of its columns per former matmul: one GEMM launch instead of three, whatever kernel backend lowers the graph.

Members of a group: the same kind (``mm``, or ``addmm`` with constant 1-D biases and beta = alpha = 1), the same
input (the same node, or equal views of one node: AOTAutograd flattens the input once per linear), weights of
one dtype and layout, one stream. A slice has the strides of the wide result, so the values downstream of it
are traced again (fake tensors) through the ops that see the new strides, until the old layouts come back:

- a ``view`` that the new strides no longer allow becomes a ``reshape``;
- a group whose new layouts would reach a graph output, or an op that refuses them, stays as it was (the reason
  is in the pass's details).

The concatenated weight is a copy made when compiling (the members' own weights stay the model's); memory grows
by the size of the weights concatenated.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airgraph.graph.analysis import has_side_effects, node_label
from airgraph.graph.meta import STREAM, is_frozen, mark_frozen
from airgraph.passes.base import CompileContext, PassResult

aten = torch.ops.aten

_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
_RESHAPED = frozenset({aten.view.default, aten._unsafe_view.default})  # may become reshape under new strides
_TRANSPOSES = frozenset({aten.t.default, aten.permute.default})
ATTR = "_concat_linear"  # attribute name prefix of a concatenated weight on the graph module


@dataclass
class _Member:
    node: torch.fx.Node  # the mm / addmm
    weight: torch.fx.Node  # the constant (get_attr)
    bias: torch.fx.Node | None  # addmm's constant bias


@dataclass
class _Group:
    members: list[_Member] = field(default_factory=list)
    transposed: bool = False  # weights in nn.Linear's (out, in) layout, read through t/permute


def concat_linear(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    groups: dict[tuple, _Group] = {}
    for node in gm.graph.nodes:
        found = _member(node)
        if found is not None:
            member, transposed, key = found
            group = groups.setdefault(key, _Group(transposed=transposed))
            group.members.append(member)
    for group in groups.values():
        if len(group.members) < 2:
            continue
        names = ", ".join(m.node.name for m in group.members)
        plan = _Plan(gm, group)
        refused = plan.trace()
        if refused is not None:
            result.details.append(f"{names}: left as they are: {refused}")
            continue
        merged = plan.apply()
        widths = "+".join(str(w) for w in plan.widths)
        result.note(f"{names} -> {node_label(merged)} over one weight of {widths} columns")
        for view in plan.reshaped:
            result.details.append(f"{view.name}: a view of the new strides, now {node_label(view)}")
    return result


def _member(node: torch.fx.Node) -> tuple[_Member, bool, tuple] | None:
    """(the member, whether its weight is transposed, its group's key), or None: not a matmul by a constant."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    bias = None
    if node.target is aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 3:
            return None
        bias, x, w = node.args
        if not _constant(bias) or _val(bias).dim() != 1:
            return None
    else:
        x, w = node.args
    transposed = False
    if isinstance(w, torch.fx.Node) and w.op == "call_function" and w.target in _TRANSPOSES:
        if w.target is aten.permute.default and list(w.args[1]) != [1, 0]:
            return None
        w, transposed = w.args[0], True
    if not _constant(w) or _val(w).dim() != 2 or not isinstance(x, torch.fx.Node):
        return None
    weight = _val(w)
    key = (node.target, transposed, _input_key(x), weight.dtype, weight.device, node.meta.get(STREAM))
    return _Member(node, w, bias), transposed, key


def _random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _constant(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "get_attr" and isinstance(_val(node), torch.Tensor)


def _val(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def _input_key(node: torch.fx.Node) -> Any:
    """What a matmul reads: the node, or (for equal views of one node) the view chain spelled out."""
    if node.op == "call_function" and node.target in _VIEWS:
        return ("view", _input_key(node.args[0]), _arg_key(node.args[1:]))
    return node


def _arg_key(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_arg_key(v) for v in value)
    if isinstance(value, torch.SymInt):
        return ("sym", str(value.node.expr))
    if isinstance(value, torch.fx.Node):
        return _input_key(value)
    return value


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _concat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The tensors concatenated, computed now: real constants outside the compile's fake mode, fake ones (a plan
    on fake inputs) inside theirs."""
    if isinstance(tensors[0], FakeTensor):
        with tensors[0].fake_mode:
            return torch.cat(tensors, dim)
    with unset_fake_temporarily(), torch.no_grad():
        return torch.cat([t.detach() for t in tensors], dim).contiguous()


def _same_layout(a: Any, b: Any) -> bool:
    """Equal dtype, sizes and strides (statically: no guard is added for a dynamic size)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b, strict=True))
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)
    if a.dtype != b.dtype or a.dim() != b.dim():
        return False
    pairs = [*zip(a.shape, b.shape, strict=True), *zip(a.stride(), b.stride(), strict=True)]
    return all(statically_known_true(x == y) for x, y in pairs) and statically_known_true(
        a.storage_offset() == b.storage_offset()
    )


class _Plan:
    """One group: the new values its rewrite gives downstream (traced first, nothing changed), then the rewrite."""

    def __init__(self, gm: torch.fx.GraphModule, group: _Group) -> None:
        self.gm, self.group = gm, group
        self.first = group.members[0].node
        weights = [_val(m.weight) for m in group.members]
        self.widths = [int(w.shape[0] if group.transposed else w.shape[1]) for w in weights]
        self.values: dict[torch.fx.Node, Any] = {}  # node -> its value after the rewrite (those that change)
        self.reshaped: list[torch.fx.Node] = []  # views that become reshapes
        self.fake_mode = _val(self.first).fake_mode if isinstance(_val(self.first), FakeTensor) else None

    # -- tracing the new values ----------------------------------------------------------------------------------
    def trace(self) -> str | None:
        """Trace the values that change downstream of the members; the reason the group is refused, or None."""
        if self.fake_mode is None:
            return "its values are not fake tensors"
        wide = self.wide = self._fake_wide()
        start = 0
        for member, width in zip(self.group.members, self.widths, strict=True):
            with self.fake_mode:
                self.values[member.node] = aten.slice.Tensor(wide, 1, start, start + width)
            start += width
        order = {node: i for i, node in enumerate(self.gm.graph.nodes)}
        pending = sorted({u for m in self.group.members for u in m.node.users}, key=order.__getitem__)
        seen = set(pending)
        while pending:
            node = pending.pop(0)
            if node.op == "output":
                return f"{self._changed(node)} would reach a graph output with new strides"
            if node.op != "call_function" or (has_side_effects(node) and not _random(node)):
                continue  # reads the new layout as it is (copy_ into an input, a stream op)
            new = self._retrace(node)
            if isinstance(new, str):
                return new
            if _same_layout(new, _val(node)):
                continue
            self.values[node] = new
            for user in sorted(node.users, key=order.__getitem__):
                if user not in seen:
                    seen.add(user)
                    pending.append(user)
            pending.sort(key=order.__getitem__)
        return None

    def _changed(self, output: torch.fx.Node) -> str:
        return next((n.name for n in output.all_input_nodes if n in self.values), "a value")

    def _fake_wide(self) -> torch.Tensor:
        """The fake value of the one wide matmul, traced on a fake weight of the concatenated shape."""
        group, first = self.group, self.first
        w0 = _val(group.members[0].weight)
        total = sum(self.widths)
        shape = (total, w0.shape[1]) if group.transposed else (w0.shape[0], total)
        bias = first.target is aten.addmm.default
        x = _val(first.args[1] if bias else first.args[0])
        with self.fake_mode:
            w = torch.empty(shape, dtype=w0.dtype, device=w0.device)
            w = aten.permute.default(w, [1, 0]) if group.transposed else w
            if bias:
                b = torch.empty((total,), dtype=_val(first.args[0]).dtype, device=w0.device)
                return aten.addmm.default(b, x, w)
            return aten.mm.default(x, w)

    def _retrace(self, node: torch.fx.Node) -> Any:
        """The node's value on the new values of its inputs, or why it cannot have one."""
        target = node.target
        try:
            return self._run(node, target)
        except Exception as exc:  # any refusal of the op leaves the group as it was
            if target in _RESHAPED:
                try:
                    value = self._run(node, aten.reshape.default)
                except Exception:
                    pass
                else:
                    self.reshaped.append(node)
                    return value
            return f"{node.name} = {target} refuses the new strides ({type(exc).__name__}: {str(exc).splitlines()[0]})"

    def _run(self, node: torch.fx.Node, target: Any) -> Any:
        def value(arg: Any) -> Any:
            return self.values[arg] if arg in self.values else _val(arg)

        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        if target is operator.getitem:
            return operator.getitem(*args)
        with self.fake_mode:
            return target(*args, **kwargs)

    # -- the rewrite ---------------------------------------------------------------------------------------------
    def apply(self) -> torch.fx.Node:
        """Rewrite the graph as traced: one wide matmul, a slice per member, reshapes for refused views."""
        gm, group, graph = self.gm, self.group, self.gm.graph
        members = group.members
        dim = 0 if group.transposed else 1
        index = sum(1 for name in dict(gm.named_buffers()) if name.startswith(ATTR))
        first = self.first
        biased = members[0].bias is not None
        x = first.args[1] if biased else first.args[0]
        with graph.inserting_before(first):
            w_node = self._register(f"{ATTR}{index}_weight", [m.weight for m in members], dim)
            if group.transposed:
                w_node = self._node(aten.permute.default, (w_node, [1, 0]), first)
            if biased:
                b_node = self._register(f"{ATTR}{index}_bias", [m.bias for m in members], 0)
                wide = graph.call_function(aten.addmm.default, (b_node, x, w_node))
            else:
                wide = graph.call_function(aten.mm.default, (x, w_node))
            wide.meta = {**first.meta, "val": self.wide}
            start = 0
            slices = []
            for member, width in zip(members, self.widths, strict=True):
                piece = graph.call_function(aten.slice.Tensor, (wide, 1, start, start + width))
                piece.meta = {**member.node.meta, "val": self.values[member.node]}
                slices.append(piece)
                start += width
        for member, piece in zip(members, slices, strict=True):
            member.node.replace_all_uses_with(piece)
            graph.erase_node(member.node)
        for view in self.reshaped:
            view.target = aten.reshape.default
        for node, new in self.values.items():
            if node.graph is graph and node.op != "placeholder":
                node.meta["val"] = new
        return wide

    def _register(self, name: str, nodes: list[torch.fx.Node | None], dim: int) -> torch.fx.Node:
        """A constant of the tensors at ``nodes`` concatenated (made now) and its get_attr node. Its traced value
        is the traced values concatenated: the device as traced (the CUDA simulator's tensors are real CPU ones)."""
        present = [n for n in nodes if n is not None]
        tensors = [_attr(self.gm, n) for n in present]
        merged = _concat(tensors, dim)
        if any(map(is_frozen, tensors)):
            mark_frozen(merged)
        with unset_fake_temporarily():  # a buffer, not a plain attribute: FX's get_attr warns of those
            self.gm.register_buffer(name, merged, persistent=False)
        node = self.gm.graph.get_attr(name)
        with self.fake_mode:
            value = torch.cat([_val(n) for n in present], dim)
        node.meta = {**{k: v for k, v in self.first.meta.items() if k != "val"}, "val": value}
        return node

    def _node(self, target: Any, args: tuple, like: torch.fx.Node) -> torch.fx.Node:
        """A new call of ``target`` with ``like``'s metadata (stream, source) and its own traced value."""
        node = self.gm.graph.call_function(target, args)
        with self.fake_mode:
            value = target(*torch.fx.node.map_arg(args, _val))
        node.meta = {**{k: v for k, v in like.meta.items() if k != "val"}, "val": value}
        return node
