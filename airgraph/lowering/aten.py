"""The "aten" kernel backend: a segment becomes one generated Python function of direct ATen calls.

No interpreter loop and no per-call attribute lookups: every op is bound once as a global of the generated
function (``OpOverload``'s C++ entry point where it has one), constants are bound the same way, and each
value is dropped right after its last use so memory is freed as early as eager would free it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import TorchDispatchMode

from airgraph.boxed import boxed
from airgraph.graph.analysis import bound_arguments
from airgraph.graph.codegen import Emitter, compile_function, last_uses

_verified: dict[tuple, Any] = {}


class _FirstOp(TorchDispatchMode):
    """Records the first ATen op a call dispatches (the op a Python binding resolved to)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: Any = None
        self.arguments: tuple[tuple, dict] = ((), {})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.first is None:
            self.first, self.arguments = func, (tuple(args), dict(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return got is want
    if isinstance(got, torch.Tensor):  # a Python number the binding wrapped as a 0-dim tensor
        return isinstance(want, bool | int | float | complex) and got.dim() == 0
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    try:
        return bool(got == want)
    except Exception:
        return False


def _same_arguments(dispatched: list, wanted: list, skip_first: bool) -> bool:
    """A binding's defaults may differ from the schema's (``torch.binary_cross_entropy_with_logits`` reduces by
    none, the op by mean): the op must be called with the very arguments the node gives it."""
    pairs = list(zip(dispatched, wanted, strict=True))[1 if skip_first else 0 :]
    return all(_same(got, want) for got, want in pairs)


def _signature(node: torch.fx.Node) -> tuple:
    def type_of(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return type(value.meta.get("val")).__name__
        if isinstance(value, (list, tuple)):
            return tuple(type_of(v) for v in value)
        return type(value).__name__

    return (node.target, type_of(node.args), tuple(sorted((k, type_of(v)) for k, v in node.kwargs.items())))


def fast_callable(node: torch.fx.Node) -> Any:
    """The fastest callable that runs exactly ``node.target`` for arguments like ``node``'s.

    ``torch.sin(x)`` costs about two thirds of ``torch.ops.aten.sin.default(x)``: the generated Python
    bindings parse arguments faster than the schema-driven ``OpOverload`` path. A binding is used only
    after checking, on the node's fake values, that it dispatches to the very same overload; otherwise
    the ``OpOverload``'s own entry point is used. Results are cached per (overload, argument kinds).
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    key = _signature(node)
    if key in _verified:
        return _verified[key]
    name = target._schema.name.split("::")[-1]
    found = None
    for candidate in (getattr(torch._C._VariableFunctions, name, None), getattr(torch._C.TensorBase, name, None)):
        if candidate is not None and _dispatches_to(candidate, node):
            found = candidate
            break
    _verified[key] = found
    return found


def inplace_callable(node: torch.fx.Node) -> Any:
    """``Tensor.<op>_`` for a pointwise ``node`` whose first input dies here and can be overwritten, or None.

    Writing into a dying intermediate saves an allocation and a pass over fresh memory, as eager code that
    writes ``x.mul_(2)`` does. Allowed only when nothing else can observe the old value: the input is a
    fresh (non-view) result of an op in this segment, this node is its only reader, it is not read twice
    by this node, and the output has its exact dtype, sizes and strides. The in-place method is then
    checked, like the out-of-place bindings, to dispatch to the matching ``aten.<op>_`` overload.
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    if torch.Tag.pointwise not in target.tags or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    src = node.args[0]
    if len(src.users) != 1 or not _returns_fresh(src):
        return None
    others = torch.utils._pytree.tree_leaves([node.args[1:], dict(node.kwargs)])
    if any(other is src for other in others):
        return None
    out, inp = node.meta.get("val"), src.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(inp, torch.Tensor):
        return None
    if out.dtype != inp.dtype or out.device != inp.device or out.dim() != inp.dim():
        return None
    pairs = [*zip(out.shape, inp.shape, strict=True), *zip(out.stride(), inp.stride(), strict=True)]
    if not all(statically_known_true(a == b) for a, b in pairs):
        return None
    name = target._schema.name.split("::")[-1] + "_"
    overload = getattr(getattr(torch.ops.aten, name, None), target._overloadname, None)
    method = getattr(torch._C.TensorBase, name, None)
    if overload is None or method is None:
        return None
    key = ("inplace", *_signature(node))
    if key not in _verified:
        _verified[key] = method if _dispatches_to(method, node, expected=overload, copy_first=True) else None
    return _verified[key]


def _returns_fresh(node: torch.fx.Node) -> bool:
    """The node's value is a new tensor: an ATen op whose schema neither mutates nor returns an alias."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not schema.is_mutable and all(ret.alias_info is None for ret in schema.returns)


def _dispatches_to(candidate: Any, node: torch.fx.Node, *, expected: Any = None, copy_first: bool = False) -> bool:
    """Does ``candidate(*node's fake args)`` dispatch first to ``expected`` (default: the node's own op)?"""

    def val(value: Any) -> Any:
        return value.meta.get("val") if isinstance(value, torch.fx.Node) else value

    args = list(torch.fx.node.map_aggregate(node.args, val))
    kwargs = torch.fx.node.map_aggregate(node.kwargs, val)
    fake_mode = detect_fake_mode([*torch.utils._pytree.tree_leaves(args), *torch.utils._pytree.tree_leaves(kwargs)])
    if fake_mode is None:
        return False
    recorder = _FirstOp()
    try:
        with fake_mode:
            if copy_first:  # an in-place candidate writes to its first argument: never to the graph's own value
                args[0] = torch.empty_strided(
                    args[0].shape, args[0].stride(), dtype=args[0].dtype, device=args[0].device
                )
            with recorder:
                candidate(*args, **kwargs)
    except Exception:
        return False
    if recorder.first is not (node.target if expected is None else expected):
        return False
    # Both bound to the dispatched op's schema; an in-place candidate's first argument is the copy made above.
    dispatched = bound_arguments(recorder.first, *recorder.arguments)
    return _same_arguments(dispatched, bound_arguments(recorder.first, args, kwargs), skip_first=copy_first)


def generate_source(gm: torch.fx.GraphModule, fn_name: str = "segment") -> tuple[str, dict[str, Any]]:
    """Python source of a boxed function computing ``gm``, and the globals it needs.

    A result takes over the local name of an input that dies at its node (rebinding frees the old value,
    like ``del`` but without the extra bytecode), so memory is released exactly as eager would release it.
    """
    emitter = Emitter()
    nodes = list(gm.graph.nodes)
    frees = last_uses([n.all_input_nodes for n in nodes])
    names: dict[torch.fx.Node, str] = {}
    fresh = iter(f"v{i}" for i in range(len(nodes)))

    placeholders = [n for n in nodes if n.op == "placeholder"]
    for node in placeholders:
        names[node] = next(fresh)
    body = [f"def {fn_name}(args):"]
    if placeholders:
        body.append(f"    {', '.join(names[n] for n in placeholders)}, = args")
    body.append("    args.clear()")
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            continue
        if node.op == "output":
            body.append(f"    return {emitter.arg(node.args[0], names)}")
            break
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            expr = emitter.bind(value, "attr")
        elif node.op == "call_function":
            args = [emitter.arg(a, names) for a in node.args]
            args += [f"{k}={emitter.arg(v, names)}" for k, v in node.kwargs.items()]
            inplace = inplace_callable(node) if node.users else None
            fast = inplace or fast_callable(node)
            hint = f"{node.target.__name__}{'_inplace' if inplace else ''}"
            fn = emitter.bind(fast, hint) if fast is not None else emitter.op(node.target)
            expr = f"{fn}({', '.join(args)})"
        else:
            raise NotImplementedError(f"aten backend: unsupported node {node.format_node()}")
        dead = [names[n] for n in frees.get(i, ())]
        if node.users:
            names[node] = dead.pop(0) if dead else next(fresh)
            body.append(f"    {names[node]} = {expr}")
        else:
            body.append(f"    {expr}")
        if dead:
            body.append(f"    del {', '.join(dead)}")
    return "\n".join(body) + "\n", emitter.globals


def compile_aten(gm: torch.fx.GraphModule) -> Callable[[list], Any]:
    source, scope = generate_source(gm)
    fn = compile_function(source, scope, "segment", "aten")
    return boxed(fn)
