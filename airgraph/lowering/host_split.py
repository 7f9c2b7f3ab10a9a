"""reduce-overhead with host work: a graph cut into static host work, per-call host work and the device program.

:func:`split_host_work` follows the capture plan's host plan (:func:`~airgraph.lowering.capture_plan.plan_host_work`):
it lowers the two host pieces, each through the seam like any segment, and cuts out the device program, the graph
without its host work, into a :class:`~airgraph.graph.program.HostProgram`. The device program then goes through
the same partition, choose, lower, executor, tuning and capture steps as a graph without host work (backend.py);
runtime/host.py runs the host pieces around the replay of its CUDA graph (runtime/capture.py has the policy).
"""

from __future__ import annotations

import torch

from airgraph.graph.meta import H2D, HOST, HOST_PLACEMENT, PLACEMENT, SEGMENT, is_non_blocking, tensors
from airgraph.graph.program import HostProgram, Segment, Transfer
from airgraph.lowering.capture_plan import ON_DEVICE, STATIC, HostPlan
from airgraph.lowering.lower import lower_segment
from airgraph.lowering.partition import subgraph
from airgraph.lowering.select import GraphRequest, choose

__all__ = ["split_host_work"]


def split_host_work(gm: torch.fx.GraphModule, plan: HostPlan, request: GraphRequest) -> HostProgram:
    """``gm`` cut by its host ``plan`` (the capture plan's) into a :class:`HostProgram`: its host pieces lowered,
    its device program (``device_gm``) left for the caller to partition and lower (``HostProgram.adopt``)."""
    if plan.problem is not None:
        raise ValueError(f"host work cannot be split off the CUDA graph: {plan.problem}")
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    device = next(
        (t.device for n in nodes for t in tensors(n.meta.get("val")) if t.device.type != "cpu"),
        torch.device("cuda"),
    )
    outputs = list(nodes[-1].args[0])
    slots: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(placeholders)}

    def needed(group: list[torch.fx.Node]) -> list[torch.fx.Node]:
        inside = set(group)
        return [n for n in group if any(u not in inside for u in n.users)]

    host_segments: list[Segment] = []
    static_out, per_call_out = needed(plan.static), needed(plan.per_call)
    static_fn, static_in = _lower_host(gm, plan.static, static_out, slots, request, host_segments)
    slots.update({n: len(slots) + i for i, n in enumerate(static_out)})
    per_call_fn, per_call_in = _lower_host(gm, plan.per_call, per_call_out, slots, request, host_segments)
    slots.update({n: len(slots) + i for i, n in enumerate(per_call_out)})
    transfers = [
        Transfer(
            name=t.name,
            op=t.target,
            args=tuple(t.args[1:]),
            kwargs=dict(t.kwargs),
            source=slots[t.args[0]],
            static=plan.origin[t.args[0]] == STATIC,
            pin=t.meta.get(HOST_PLACEMENT) == H2D,
            non_blocking=t.meta.get(HOST_PLACEMENT) == H2D or is_non_blocking(t),
            graph_input=t.args[0].op == "placeholder",
        )
        for t in plan.transfers
    ]
    device_gm, device_outputs, copies = _device_part(gm, plan, placeholders, outputs)
    recipe: list[tuple[str, object]] = []
    for out in outputs:
        if not isinstance(out, torch.fx.Node):
            recipe.append(("const", out))
        elif out in device_outputs:
            recipe.append(("device", device_outputs[out]))
        else:
            recipe.append(("host", slots[out]))
    return HostProgram(
        static_fn=static_fn,
        static_in=static_in,
        per_call_fn=per_call_fn,
        per_call_in=per_call_in,
        transfers=transfers,
        feeds=[slots[n] for n in plan.feeds],
        device_gm=device_gm,
        copies=copies,
        device=device,
        recipe=recipe,
        static_slots=(len(placeholders), len(placeholders) + len(static_out)),
        segments=host_segments,
    )


def _lower_host(
    gm: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    outputs: list[torch.fx.Node],
    slots: dict[torch.fx.Node, int],
    request: GraphRequest,
    segments: list[Segment],
) -> tuple[object, list[int] | None]:
    """One host segment over ``nodes``, lowered through the seam; and the slots of its inputs. (None, None) when
    there are no such nodes."""
    if not nodes:
        return None, None
    members = set(nodes)
    inputs = list(dict.fromkeys(i for n in nodes for i in n.all_input_nodes if i not in members))
    seg = Segment(id=len(segments), placement=HOST, stream=None, nodes=nodes, inputs=inputs, outputs=outputs)
    for node in nodes:
        node.meta[SEGMENT] = seg.id
    seg.gm = subgraph(gm, inputs, nodes, outputs, "HostSegment")
    segments.append(seg)
    return lower_segment(seg, choose(seg, request), request), [slots[i] for i in inputs]


def _device_part(
    gm: torch.fx.GraphModule, plan: HostPlan, placeholders: list[torch.fx.Node], outputs: list
) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, int], dict[torch.fx.Node, torch.fx.Node]]:
    """The graph without its host work: transfers and feeds become inputs after the graph's own. Also returns
    the position of each device output, and each of the graph's device nodes' copy."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in placeholders:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node, suffix in [*((n, "buffer") for n in plan.transfers), *((n, "host") for n in plan.feeds)]:
        env[node] = graph.placeholder(f"{node.name}_{suffix}")
        env[node].meta = {k: v for k, v in node.meta.items() if k not in (HOST_PLACEMENT, PLACEMENT)}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in env or plan.origin.get(node) != ON_DEVICE:
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    on_device = [o for o in outputs if isinstance(o, torch.fx.Node) and o in env and plan.origin.get(o) == ON_DEVICE]
    device_outputs = {out: i for i, out in enumerate(dict.fromkeys(on_device))}
    graph.output(tuple(env[o] for o in device_outputs))
    copies = {node: copy for node, copy in env.items() if node.op != "placeholder"}
    return torch.fx.GraphModule(gm, graph, class_name="DevicePart"), device_outputs, copies
