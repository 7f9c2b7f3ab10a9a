"""The executor: runs a graph's lowered segments in order, as one generated Python function.

The executor takes the graph's inputs as a list (AOTAutograd's boxed convention, cleared on entry so
inputs can be freed early), calls each segment's compiled callable with the values it reads, drops each
value after its last reader, and returns the graph outputs. With a single segment that reads the graph
inputs in order and returns the graph outputs in order, the segment's callable *is* the executor: no
extra Python frame per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph.codegen import Emitter, compile_function, last_uses
from airgraph.lowering.partition import Segment


def build_executor(gm: torch.fx.GraphModule, segments: list[Segment]) -> Callable[[list], Any]:
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output_node = nodes[-1]
    outputs = list(output_node.args[0])

    if len(segments) == 1:
        seg = segments[0]
        if seg.inputs == placeholders and seg.outputs == outputs and len(set(outputs)) == len(outputs):
            return seg.compiled

    emitter = Emitter()
    names = {node: f"v{i}" for i, node in enumerate(nodes)}
    frees = last_uses([seg.inputs for seg in segments])
    body = ["def run(args):"]
    if placeholders:
        body.append(f"    {', '.join(names[n] for n in placeholders)}, = args")
    body.append("    args.clear()")
    live_out = set(n for n in outputs if isinstance(n, torch.fx.Node))
    for step, seg in enumerate(segments):
        fn = emitter.bind(seg.compiled, f"segment{seg.id}")
        call = f"{fn}([{', '.join(names[n] for n in seg.inputs)}])"
        if seg.outputs:
            body.append(f"    {', '.join(names[n] for n in seg.outputs)}, = {call}")
        else:
            body.append(f"    {call}")
        dead = [names[n] for n in frees.get(step, ()) if n not in live_out]
        if dead:
            body.append(f"    del {', '.join(dead)}")
    body.append(f"    return {emitter.arg(list(outputs), names)}")
    run = compile_function("\n".join(body) + "\n", emitter.globals, "run", "executor")
    run._boxed_call = True
    return run
