"""The "aten" kernel backend: a segment becomes one generated Python function of direct ATen calls.

No interpreter loop and no per-call attribute lookups: every op is bound once as a global of the generated
function (``OpOverload``'s C++ entry point where it has one), constants are bound the same way, and each
value is dropped right after its last use so memory is freed as early as eager would free it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.codegen import Emitter, compile_function, last_uses


def generate_source(gm: torch.fx.GraphModule, fn_name: str = "segment") -> tuple[str, dict[str, Any]]:
    """Python source of a boxed function computing ``gm``, and the globals it needs."""
    emitter = Emitter()
    nodes = list(gm.graph.nodes)
    names = {node: f"v{i}" for i, node in enumerate(nodes)}
    frees = last_uses([[] if n.op == "output" else n.all_input_nodes for n in nodes])

    placeholders = [n for n in nodes if n.op == "placeholder"]
    body = [f"def {fn_name}(args):"]
    if placeholders:
        body.append(f"    {', '.join(names[n] for n in placeholders)}, = args")
    body.append("    args.clear()")
    for i, node in enumerate(nodes):
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            body.append(f"    {names[node]} = {emitter.bind(value, 'attr')}")
        elif node.op == "call_function":
            args = [emitter.arg(a, names) for a in node.args]
            args += [f"{k}={emitter.arg(v, names)}" for k, v in node.kwargs.items()]
            call = f"{emitter.op(node.target)}({', '.join(args)})"
            body.append(f"    {names[node]} = {call}" if node.users else f"    {call}")
        elif node.op == "output":
            body.append(f"    return {emitter.arg(node.args[0], names)}")
        elif node.op != "placeholder":
            raise NotImplementedError(f"aten backend: unsupported node {node.format_node()}")
        dead = [names[n] for n in frees.get(i, ())]
        if dead:
            body.append(f"    del {', '.join(dead)}")
    return "\n".join(body) + "\n", emitter.globals


def compile_aten(gm: torch.fx.GraphModule) -> Callable[[list], Any]:
    source, scope = generate_source(gm)
    fn = compile_function(source, scope, "segment", "aten")
    fn._boxed_call = True
    return fn
