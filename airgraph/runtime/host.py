"""reduce-overhead with host placement: the host work split off the device work.

Host work cannot be captured in a CUDA graph. :func:`plan_host_work` classifies every node as static (a
function of the shape key alone), per-call (depends on CPU input data or is random) or device;
:class:`HostSplit` lowers the three pieces separately so that runtime/capture.py can run the static host
work once when a key is recorded, the per-call host work before every replay, and capture the device part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airgraph.lowering import KERNEL_BACKENDS, backend_for, lower_segments, partition
from airgraph.lowering.partition import HOST, Segment
from airgraph.passes.host_placement import META, METADATA_OPS, is_non_blocking, on_host, tensors, transfer_device
from airgraph.runtime import executor
from airgraph.runtime.executor import build_executor

# -- reduce-overhead: the host work split off the device work ---------------------------------------------
STATIC, PER_CALL, DEVICE = "static", "per_call", "device"


@dataclass
class HostPlan:
    """How a graph's host work runs around a CUDA graph (see runtime/capture.py for the policy).

    ``kind`` says, for every node, where its value comes from: ``static`` (a function of the shape key alone:
    SymInt inputs, sizes, constants), ``per_call`` (depends on the data of CPU inputs, or random) or
    ``device``. ``transfers`` are the device nodes copying a host value to the device, ``feeds`` the static
    host values (SymInts, 0-dim CPU scalars) device ops read directly. ``problem`` says why the host work
    cannot be split off, or is None.
    """

    kind: dict[torch.fx.Node, str] = field(default_factory=dict)
    static: list[torch.fx.Node] = field(default_factory=list)
    per_call: list[torch.fx.Node] = field(default_factory=list)
    transfers: list[torch.fx.Node] = field(default_factory=list)
    feeds: list[torch.fx.Node] = field(default_factory=list)
    problem: str | None = None


def _is_transfer(node: torch.fx.Node, source: torch.fx.Node) -> bool:
    device = transfer_device(node)
    return device is not None and device.type != "cpu" and node.args[0] is source


def plan_host_work(gm: torch.fx.GraphModule) -> HostPlan:
    """Classify the graph's host work for capture; see :class:`HostPlan`."""
    plan = HostPlan()
    kind = plan.kind
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            is_tensor = isinstance(val, torch.Tensor)
            kind[node] = (PER_CALL if val.device.type == "cpu" else DEVICE) if is_tensor else STATIC
            continue
        if node.op == "get_attr":
            kind[node] = STATIC if on_host(node) else DEVICE
            if on_host(node):
                plan.static.append(node)
            continue
        if node.op == "output":
            continue
        if on_host(node):
            kind[node] = _host_kind(node, kind, plan)
            (plan.static if kind[node] == STATIC else plan.per_call).append(node)
            continue
        kind[node] = DEVICE
        for inp in node.all_input_nodes:
            if kind[inp] == DEVICE or plan.problem is not None:
                continue
            if _is_transfer(node, inp):
                if free_unbacked_symbols(node.meta.get("val")):
                    plan.problem = (
                        f"{node.name} = {node.target} copies {inp.name} to the device with a data-dependent shape "
                        "(it depends on input data): a CUDA graph's buffer has one shape"
                    )
                plan.transfers.append(node)
            elif inp.op == "placeholder" and kind[inp] == STATIC:
                continue  # a SymInt input of the graph: the device part gets it too
            elif kind[inp] == STATIC and (not tensors(inp.meta.get("val")) or inp.meta["val"].dim() == 0):
                if inp not in plan.feeds:
                    plan.feeds.append(inp)
            else:
                what = "changes with every call" if kind[inp] == PER_CALL else "is a CPU tensor"
                plan.problem = (
                    f"{node.name} = {node.target} reads {inp.name}, a host value that {what}, inside the CUDA graph"
                )
    return plan


def _host_kind(node: torch.fx.Node, kind: dict[torch.fx.Node, str], plan: HostPlan) -> str:
    inputs = node.all_input_nodes
    if node.target in METADATA_OPS and not free_unbacked_symbols(node.meta.get("val")):
        return STATIC  # reads sizes or strides that the shape key fixes (not data-dependent ones)
    device = [inp for inp in inputs if kind[inp] == DEVICE]
    if device and plan.problem is None:
        plan.problem = f"host op {node.name} = {node.target} reads {device[0].name}, a value computed on the device"
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and (
        target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
    ):
        return PER_CALL
    return PER_CALL if any(kind[inp] != STATIC for inp in inputs) else STATIC


def describe_host_split(gm: torch.fx.GraphModule) -> dict[str, list[str]]:
    """The report's ``host_prologue``: host nodes per kind and the transfers feeding the CUDA graph."""
    plan = plan_host_work(gm)
    return {
        STATIC: [n.name for n in plan.static],
        PER_CALL: [n.name for n in plan.per_call],
        "transfers": [n.name for n in plan.transfers],
    }


@dataclass
class Transfer:
    """One host value copied to the device ahead of the device part: a graph input of that part."""

    node: torch.fx.Node
    source: int  # slot of the host value
    static: bool  # computed once per shape key (its device copy is a constant of the key's CUDA graph)
    pin: bool  # host placement's own copy: from pinned memory, asynchronous
    non_blocking: bool
    graph_input: bool  # the source is a graph input (the caller's tensor): pinned into a new buffer

    def _source(self, value: torch.Tensor) -> torch.Tensor:
        if not self.pin:
            return value
        return executor.pinned_copy(value) if self.graph_input else executor.pinned(value)

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        """The node's own op on ``value``: a new device tensor."""
        return self.node.target(self._source(value), *self.node.args[1:], **self.node.kwargs)

    def refill(self, buffer: torch.Tensor, value: torch.Tensor) -> None:
        """Copy this call's ``value`` into the static ``buffer`` the CUDA graph reads, on the current stream."""
        if buffer.shape != value.shape:  # plan_host_work refuses data-dependent shapes; never broadcast
            raise RuntimeError(
                f"airgraph: host value for {self.node.name} has shape {tuple(value.shape)} but the CUDA graph was "
                f"recorded with {tuple(buffer.shape)}"
            )
        buffer.copy_(self._source(value), non_blocking=self.non_blocking)


class HostSplit:
    """A graph cut into static host work, per-call host work and the device part, each lowered on its own.

    Values live in slots: the graph inputs first, then the static results, then the per-call results. The
    device part's inputs are the graph inputs followed by one value per transfer (the device copy) and per
    feed (a static host value). Called as a boxed callable, it runs everything uncaptured (warm-up, keys
    that are not captured); ``GraphCapture`` uses the pieces to run the host work around a replay.
    """

    def __init__(
        self, gm: torch.fx.GraphModule, requested: str, *, kind: str, priorities: dict[str, int] | None = None
    ) -> None:
        self._boxed_call = True  # an instance attribute, as GraphCapture's (see there)
        self.last_run: tuple[list, list] | None = None
        plan = plan_host_work(gm)
        if plan.problem is not None:
            raise ValueError(f"host work cannot be split off the CUDA graph: {plan.problem}")
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.device = next(
            (t.device for n in nodes for t in tensors(n.meta.get("val")) if t.device.type != "cpu"),
            torch.device("cuda"),
        )
        output = nodes[-1]
        outputs = list(output.args[0])
        slots: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(placeholders)}
        readers = {n: [u for u in n.users] for n in nodes}

        def needed(group: list[torch.fx.Node]) -> list[torch.fx.Node]:
            inside = set(group)
            return [n for n in group if any(u not in inside for u in readers[n])]

        static_out, per_call_out = needed(plan.static), needed(plan.per_call)
        self.static_fn, self.static_in = _lower_host(gm, plan.static, static_out, slots, requested, kind)
        slots.update({n: len(slots) + i for i, n in enumerate(static_out)})
        self.per_call_fn, self.per_call_in = _lower_host(gm, plan.per_call, per_call_out, slots, requested, kind)
        slots.update({n: len(slots) + i for i, n in enumerate(per_call_out)})
        self.transfers = [
            Transfer(
                node=t,
                source=slots[t.args[0]],
                static=plan.kind[t.args[0]] == STATIC,
                pin=t.meta.get(META) == "h2d",
                non_blocking=t.meta.get(META) == "h2d" or is_non_blocking(t),
                graph_input=t.args[0].op == "placeholder",
            )
            for t in plan.transfers
        ]
        self.feeds = [slots[n] for n in plan.feeds]
        device_gm, device_outputs = _device_part(gm, plan, placeholders, outputs)
        segments = partition(device_gm)
        lower_segments(segments, requested, kind=kind)
        self.device_fn = build_executor(device_gm, segments, self.device, priorities=priorities)
        self.device_gm = device_gm
        # Graph output i: ("device", index in the device part's outputs) or ("host", slot) or ("const", value).
        self.recipe: list[tuple[str, Any]] = []
        for out in outputs:
            if not isinstance(out, torch.fx.Node):
                self.recipe.append(("const", out))
            elif out in device_outputs:
                self.recipe.append(("device", device_outputs[out]))
            else:
                self.recipe.append(("host", slots[out]))
        self.static_slots = len(placeholders), len(placeholders) + len(static_out)

    # -- the pieces GraphCapture runs ----------------------------------------------------------------------
    def run_static(self, args: list) -> list:
        """The static host values for these inputs' shape key."""
        return list(self.static_fn([args[i] for i in self.static_in])) if self.static_in is not None else []

    def run_per_call(self, args: list, statics: list) -> list:
        """This call's per-call host values."""
        if self.per_call_in is None:
            return []
        values = [*args, *statics]
        return list(self.per_call_fn([values[i] for i in self.per_call_in]))

    def boundary(self, values: list) -> list:
        """The device part's extra inputs: each transfer's device copy, then each feed."""
        return [t(values[t.source]) for t in self.transfers] + [values[i] for i in self.feeds]

    def assemble(self, device_outputs: list, values: list, *, clone_static: bool) -> list:
        """The graph outputs from the device part's outputs and the host values."""
        low, high = self.static_slots
        result = []
        for where, what in self.recipe:
            if where == "device":
                result.append(device_outputs[what])
            elif where == "host":
                value = values[what]
                copy = clone_static and low <= what < high and isinstance(value, torch.Tensor)
                result.append(value.clone() if copy else value)
            else:
                result.append(what)
        return result

    def __call__(self, args: list) -> list:
        """Uncaptured: host work, transfers and the device part in order."""
        inputs = list(args)
        args.clear()
        statics = self.run_static(inputs)
        values = [*inputs, *statics, *self.run_per_call(inputs, statics)]
        self.last_run = (statics, values)  # GraphCapture records from these: the host work runs once a call
        outputs = self.device_fn([*inputs, *self.boundary(values)])
        return self.assemble(list(outputs), values, clone_static=False)


def build_host_split(
    gm: torch.fx.GraphModule, requested: str, *, kind: str, priorities: dict[str, int] | None = None
) -> HostSplit:
    """Lower ``gm`` as a :class:`HostSplit` (reduce-overhead on CUDA with capturable host work)."""
    return HostSplit(gm, requested, kind=kind, priorities=priorities)


def _lower_host(
    gm: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    outputs: list[torch.fx.Node],
    slots: dict[torch.fx.Node, int],
    requested: str,
    kind: str,
) -> tuple[Callable[[list], Any] | None, list[int] | None]:
    """One host segment over ``nodes``, lowered; and the slots of its inputs. (None, None) when empty."""
    if not nodes:
        return None, None
    members = set(nodes)
    inputs = list(dict.fromkeys(i for n in nodes for i in n.all_input_nodes if i not in members))
    seg = Segment(id=0, placement=HOST, stream=None, nodes=nodes, inputs=inputs, outputs=outputs)
    seg.gm = _module(gm, inputs, nodes, outputs)
    seg.backend = backend_for(seg, requested)
    seg.compiled = KERNEL_BACKENDS[seg.backend](seg.gm, seg.example_inputs(), kind=kind)
    return seg.compiled, [slots[i] for i in inputs]


def _module(
    owner: torch.fx.GraphModule, inputs: list[torch.fx.Node], nodes: list[torch.fx.Node], outputs: list[torch.fx.Node]
) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(owner, graph, class_name="HostSegment")


def _device_part(
    gm: torch.fx.GraphModule, plan: HostPlan, placeholders: list[torch.fx.Node], outputs: list
) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, int]]:
    """The graph without its host work: transfers and feeds become inputs after the graph's own."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in placeholders:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node, suffix in [*((n, "buffer") for n in plan.transfers), *((n, "host") for n in plan.feeds)]:
        env[node] = graph.placeholder(f"{node.name}_{suffix}")
        env[node].meta = {k: v for k, v in node.meta.items() if k not in (META, "placement")}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in env or plan.kind.get(node) != DEVICE:
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    on_device = [o for o in outputs if isinstance(o, torch.fx.Node) and o in env and plan.kind.get(o) == DEVICE]
    device_outputs = {out: i for i, out in enumerate(dict.fromkeys(on_device))}
    graph.output(tuple(env[o] for o in device_outputs))
    return torch.fx.GraphModule(gm, graph, class_name="DevicePart"), device_outputs
