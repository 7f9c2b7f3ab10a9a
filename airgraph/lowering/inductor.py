"""The "inductor" kernel backend: a segment compiled by torch's Inductor (Triton on CUDA, C++ on CPU).

The segment is already an ATen graph (AOTAutograd ran, with Inductor's decompositions when this backend
is selected), so it goes straight to ``compile_fx_inner``, Inductor's per-graph entry point, which exists
with the same keyword arguments from torch 2.11 to 2.13. Inductor's own CUDA graphs stay off: capture is
airgraph's job (runtime/capture.py), over all segments at once.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.boxed import boxed
from airgraph.graph.meta import is_frozen
from airgraph.lowering import aot
from airgraph.lowering.request import LowerRequest


def compile_inductor(request: LowerRequest) -> Callable[[list], Any]:
    """Compile one segment. ``request.options["inductor_config"]``: Inductor config patches (e.g. freezing,
    max_autotune_gemm) chosen by the seam; ``request.options["cpp_wrapper"]``: a C++ wrapper instead of Python's
    (Inductor's own option); ``request.donated``: inputs Inductor may overwrite (backward only)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    kind = request.kind
    # Random ops run as ATen's own (fallback_random): Inductor lowers them natively only after its joint-graph
    # pass replaced them, which runs inside its own AOTAutograd (not airgraph's); ATen's draw the numbers eager
    # draws, in the same order, so dropout masks equal eager's.
    patches = {**request.options.get("inductor_config", {}), "triton.cudagraphs": False, "fallback_random": True}
    donated = request.donated if kind == "backward" else None
    with inductor_config.patch(patches), aot.donating(donated), _constants_allowed(request):
        compiled = compile_fx_inner(
            _decomposed(_frozen_marked(_copy(request.gm))),
            request.example_inputs,
            is_inference=kind == "inference",
            is_backward=kind == "backward",
            cudagraphs=False,
            cpp_wrapper=bool(request.options.get("cpp_wrapper", False)),
        )
    return boxed(compiled)  # Inductor's compiled graphs take the boxed (list) calling convention


def _frozen_marked(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, marked as holding frozen parameters where it does (graph/meta.py: ``mark_frozen``), as torch's
    freezing marks its graphs: Inductor's FX graph cache then neither keys it by the weights' values nor stores
    them (``has_frozen_params``)."""
    for node in gm.graph.find_nodes(op="get_attr"):
        if is_frozen(getattr(gm, str(node.target), None)):
            gm._has_frozen_params = True  # torch._inductor.freezing_utils.record_has_frozen_params
            break
    return gm


@contextlib.contextmanager
def _constants_allowed(request: LowerRequest) -> Any:
    """A segment holding real constants (frozen parameters, lowering/freeze.py) is compiled with its fake mode taking
    real tensors too, as torch's own freezing compiles (``compile_fx.fw_compiler_freezing``)."""
    mode = detect_fake_mode(request.example_inputs)
    if mode is None or not request.gm.graph.find_nodes(op="get_attr"):
        yield
        return
    allow, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True
    try:
        yield
    finally:
        mode.allow_non_fake_inputs = allow


def _decomposed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with every op that Inductor decomposes rather than lowers (``aten.t``, ``aten.addmm``'s relatives...)
    replaced by its decomposition, in place. A segment traced for another kernel backend (AOTAutograd without
    Inductor's table: the aten backend, then a tuning candidate or the seam picking Inductor for this one segment)
    holds such ops, and Inductor refuses them ("both a fallback and a decomp for same op"). Each is traced alone on
    its node's fake values and inlined; an op without them stays as it is. Call under ``fallback_random``, as the
    backend's own table is selected (random ops stay ATen's)."""
    from torch._inductor.decomposition import select_decomp_table

    table = select_decomp_table()
    todo = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in table and "val" in n.meta]
    for node in todo:
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        inputs = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
        values = [leaves[i].meta.get("val") for i in inputs]
        if any(v is None for v in values):
            continue
        op = functools.partial(_call, node.target, leaves, inputs, spec)
        with detect_fake_mode(values) or contextlib.nullcontext():
            traced = make_fx(op, decomposition_table=table)(*values)
        _inline(gm.graph, node, traced, [leaves[i] for i in inputs])
    if todo:
        gm.graph.lint()
        gm.recompile()
    return gm


def _call(target: Any, leaves: list, inputs: list[int], spec: Any, *values: Any) -> Any:
    """``target`` called on its node's arguments (flattened: ``leaves``) with ``values`` at the node inputs."""
    filled = list(leaves)
    for i, value in zip(inputs, values, strict=True):
        filled[i] = value
    args, kwargs = pytree.tree_unflatten(filled, spec)
    return target(*args, **kwargs)


def _inline(graph: torch.fx.Graph, node: torch.fx.Node, traced: torch.fx.GraphModule, args: list) -> None:
    """Replace ``node`` in ``graph`` by ``traced``'s ops reading ``args``; a multi-output node's ``getitem`` users
    read the matching output directly."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(args)
    result: Any = None
    with graph.inserting_before(node):
        for t in traced.graph.nodes:
            if t.op == "placeholder":
                env[t] = next(placeholders)
            elif t.op == "output":
                result = pytree.tree_map(lambda a: env[a] if isinstance(a, torch.fx.Node) else a, t.args[0])
            elif t.op == "get_attr":  # a constant the decomposition made: kept on the segment's module
                name = f"_decomp_{len(graph.nodes)}_{t.target}"
                setattr(graph.owning_module, name, getattr(traced, str(t.target)))
                env[t] = graph.get_attr(name)
                env[t].meta = dict(t.meta)
            else:
                env[t] = graph.node_copy(t, env.__getitem__)
    if isinstance(result, torch.fx.Node):
        node.replace_all_uses_with(result)
    else:
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise RuntimeError(f"{node.format_node()}: a multi-output op used other than by index")
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    graph.erase_node(node)


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the segment's graph for Inductor, whose passes rewrite the graph they are given in place: the
    segment's own graph stays as traced (the tuning bank and the kernel library key segments by it, after
    lowering too). Nodes and their meta dicts are copied; the values in them are shared, not copied."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
