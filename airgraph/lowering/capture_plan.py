"""The capture plan: can this graph be recorded as one CUDA graph, and what host work goes around the replay.

Decisions about a graph, made at compile time (runtime/capture.py carries them out):

- :func:`find_uncapturable` says why a graph cannot be captured (work on two GPUs, an op that needs a host sync
  (capture_rules.py), a CPU tensor inside the CUDA graph), naming the first offending op, or None;
- a CUDA graph is refused while PyTorch's caching allocator is off (``PYTORCH_NO_CUDA_MEMORY_CACHING``), as the
  runtime would refuse it;
- :func:`launches` says whether a node may launch device work: a graph of no such node is not captured (a CUDA
  graph of nothing);
- :func:`plan_host_work` classifies each node of a graph with host work (host placement's CPU ops) as static (a
  function of the shape key alone: computed once per key), per-call (depends on the data of CPU inputs, or is
  random: computed before every replay) or device (captured); host_split.py lowers the two host pieces.

:func:`plan_capture` makes these decisions once per graph and hands them on in a :class:`CapturePlan` (the host
plan with them): nothing downstream asks again.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airgraph import config
from airgraph.graph.meta import METADATA_OPS, on_host, tensors, transfer_device
from airgraph.lowering.capture_rules import host_sync_reason
from airgraph.runtime.device import UNCACHED_ALLOCATOR

__all__ = [
    "NOTHING_TO_CAPTURE",
    "CapturePlan",
    "HostPlan",
    "find_uncapturable",
    "has_host_work",
    "launches",
    "plan_capture",
    "plan_host_work",
]


@dataclass
class CapturePlan:
    """What reduce-overhead does with one graph (nothing, outside reduce-overhead)."""

    capture: bool = False  # GraphCapture wraps the executor: the runtime records graphs
    uncapturable: str | None = None  # why the graph runs uncaptured all the same (or on a runtime without graphs)
    host: HostPlan | None = None  # the host work, split off around the replay (lowering/host_split.py), if any

    @property
    def split(self) -> bool:
        return self.host is not None


def plan_capture(gm: torch.fx.GraphModule, *, mode: str, device: torch.device, can_capture: bool) -> CapturePlan:
    """Decide, once per graph, whether and how reduce-overhead captures it (see :class:`CapturePlan`)."""
    if mode != "reduce-overhead":
        return CapturePlan()
    if not can_capture:
        return CapturePlan(uncapturable=f"reduce-overhead captures CUDA graphs; this graph runs on {device.type}")
    if not any(map(launches, gm.graph.nodes)):  # a CUDA graph of nothing (CUDA warns "The CUDA Graph is empty")
        return CapturePlan(uncapturable=NOTHING_TO_CAPTURE)
    if device.type == "cpu":  # the simulator: CPU tensors stand for device ones, only the ops are checked
        return CapturePlan(capture=True, uncapturable=find_uncapturable(gm, simulated=True))
    host = plan_host_work(gm) if has_host_work(gm) else None
    reason = find_uncapturable(gm, host=host or HostPlan()) or _allocator_refusal()
    return CapturePlan(capture=True, uncapturable=reason, host=host if reason is None else None)


def _allocator_refusal() -> str | None:
    """PyTorch's CUDA caching allocator bypassed (``PYTORCH_NO_CUDA_MEMORY_CACHING``): a capture's allocations would
    not come from the graph's pool. Known from the environment at plan time; the runtime asks torch too."""
    return UNCACHED_ALLOCATOR if config.torch_cuda_caching_disabled() else None


NOTHING_TO_CAPTURE = "nothing to capture: the graph launches no device work (views, sizes and host work only)"


def launches(node: torch.fx.Node) -> bool:
    """Whether ``node`` may launch device work: a call on the device that takes or makes a tensor and is not a view
    (an op whose every output aliases an input without writing it), a size or an item of a tuple (shape arithmetic
    and checks of SymInts, ``_assert_scalar`` say, touch no tensor). Erring towards yes (an allocation, an in-place
    op returning nothing, an op that reads an input under an alias annotation and returns nothing, a device assert,
    any higher-order op, a Python call without a value, a module or method call): a graph of none of them is not
    captured, as its CUDA graph would hold nothing to replay (only its input copies, had it been captured)."""
    target = node.target
    if node.op in ("call_module", "call_method"):
        return True
    if node.op != "call_function" or on_host(node) or target is operator.getitem or target in METADATA_OPS:
        return False
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if isinstance(target, torch._ops.OpOverload):  # by its schema: a node that returns nothing has no value
        schema = target._schema
        return not _is_view(target) and any("Tensor" in str(a.type) for a in (*schema.arguments, *schema.returns))
    if "val" not in node.meta:
        return True
    return bool(tensors([node.meta["val"], *(n.meta.get("val") for n in node.all_input_nodes)]))


# Views that their schema does not call one (no alias annotation): no kernel either
_UNANNOTATED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def _is_view(op: torch._ops.OpOverload) -> bool:
    """Every output of ``op`` aliases an input it does not write (``is_view`` alone holds for an op that reads an
    aliased input and returns nothing, a collective's put say), or ``op`` is a view its schema does not annotate."""
    if op in _UNANNOTATED_VIEWS:
        return True
    returns = op._schema.returns
    return op.is_view and bool(returns) and all(r.alias_info is not None for r in returns)


STATIC, PER_CALL, ON_DEVICE = "static", "per_call", "device"  # where a node's value comes from (its origin)


@dataclass
class HostPlan:
    """How a graph's host work runs around a CUDA graph (see runtime/capture.py for the policy).

    ``origin`` says, for every node, where its value comes from: ``static`` (a function of the shape key alone:
    SymInt inputs, sizes, constants), ``per_call`` (depends on the data of CPU inputs, or random) or
    ``device``. ``transfers`` are the device nodes copying a host value to the device, ``feeds`` the static
    host values (SymInts, 0-dim CPU scalars) device ops read directly. ``problem`` says why the host work
    cannot be split off, or is None.
    """

    origin: dict[torch.fx.Node, str] = field(default_factory=dict)
    static: list[torch.fx.Node] = field(default_factory=list)
    per_call: list[torch.fx.Node] = field(default_factory=list)
    transfers: list[torch.fx.Node] = field(default_factory=list)
    feeds: list[torch.fx.Node] = field(default_factory=list)
    problem: str | None = None

    def describe(self) -> dict[str, list[str]]:
        """The report's ``host_prologue``: host nodes per origin and the transfers feeding the CUDA graph."""
        return {
            STATIC: [n.name for n in self.static],
            PER_CALL: [n.name for n in self.per_call],
            "transfers": [n.name for n in self.transfers],
        }


def _is_transfer(node: torch.fx.Node, source: torch.fx.Node) -> bool:
    device = transfer_device(node)
    return device is not None and device.type != "cpu" and node.args[0] is source


def plan_host_work(gm: torch.fx.GraphModule) -> HostPlan:
    """Classify the graph's host work for capture; see :class:`HostPlan`."""
    plan = HostPlan()
    origin = plan.origin
    weak = False  # the problem found is one of size arithmetic
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            is_tensor = isinstance(val, torch.Tensor)
            origin[node] = (PER_CALL if val.device.type == "cpu" else ON_DEVICE) if is_tensor else STATIC
            continue
        if node.op == "get_attr":
            origin[node] = STATIC if on_host(node) else ON_DEVICE
            if on_host(node):
                plan.static.append(node)
            continue
        if node.op == "output":
            continue
        if on_host(node):
            origin[node] = _host_origin(node, origin, plan)
            (plan.static if origin[node] == STATIC else plan.per_call).append(node)
            continue
        origin[node] = ON_DEVICE
        for inp in node.all_input_nodes:
            if origin[inp] == ON_DEVICE or (plan.problem is not None and not weak):
                continue
            if _is_transfer(node, inp):
                if free_unbacked_symbols(node.meta.get("val")):
                    plan.problem, weak = (
                        (
                            f"{node.name} = {node.target} copies {inp.name} to the device with a data-dependent shape "
                            "(it depends on input data): a CUDA graph's buffer has one shape"
                        ),
                        False,
                    )
                plan.transfers.append(node)
            elif inp.op == "placeholder" and origin[inp] == STATIC:
                continue  # a SymInt input of the graph: the device part gets it too
            elif origin[inp] == STATIC and (not tensors(inp.meta.get("val")) or inp.meta["val"].dim() == 0):
                if inp not in plan.feeds:
                    plan.feeds.append(inp)
            elif plan.problem is None or (weak and tensors(node.meta.get("val"))):
                what = "changes with every call" if origin[inp] == PER_CALL else "is a CPU tensor"
                plan.problem = (
                    f"{node.name} = {node.target} reads {inp.name}, a host value that {what}, inside the CUDA graph"
                )
                # arithmetic on sizes (a runtime check of an unbacked size): a tensor op's problem says more
                weak = not tensors(node.meta.get("val"))
    return plan


def _host_origin(node: torch.fx.Node, origin: dict[torch.fx.Node, str], plan: HostPlan) -> str:
    inputs = node.all_input_nodes
    if node.target in METADATA_OPS and not free_unbacked_symbols(node.meta.get("val")):
        return STATIC  # reads sizes or strides that the shape key fixes (not data-dependent ones)
    device = [inp for inp in inputs if origin[inp] == ON_DEVICE]
    if device and plan.problem is None:
        plan.problem = f"host op {node.name} = {node.target} reads {device[0].name}, a value computed on the device"
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and (
        target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
    ):
        return PER_CALL
    return PER_CALL if any(origin[inp] != STATIC for inp in inputs) else STATIC


def has_host_work(gm: torch.fx.GraphModule) -> bool:
    """Host ops or CPU inputs that host placement marked: the graph's host work is split off around the replay."""
    return any(on_host(n) for n in gm.graph.nodes)


def find_uncapturable(gm: torch.fx.GraphModule, *, simulated: bool = False, host: HostPlan | None = None) -> str | None:
    """Why this CUDA graph cannot be recorded as one CUDA graph, naming the first offending op, or None.

    A graph touching two GPUs is refused (one CUDA graph records one device's work, as CUDAGraph Trees refuse it).
    Ops that need a host sync or that a CUDA graph cannot record (capture_rules.py) are named next: they are what
    a user changes. Host work that host placement put on the CPU is fine: it runs around the replay (module
    docstring), unless device work reads one of its per-call values directly. Any other CPU tensor inside a CUDA
    graph would be computed on the host once, while recording, and never again, so it is refused, and so is a
    0-dim one (a kernel would take its value as an argument, frozen at the recording) unless it is a function of
    the shape key alone (constants, sizes), the same for every call of the key.

    ``simulated``: a CPU graph run as a CUDA one by the simulator: only the ops are checked (every tensor is
    a CPU tensor there, standing for a device one). ``host``: the graph's host plan when the caller has made it
    (an empty one without host work); otherwise it is made here when first needed.
    """
    devices = {t.device for n in gm.graph.nodes for t in tensors(n.meta.get("val")) if t.device.type not in _HOSTS}
    if len(devices) > 1:
        names = ", ".join(sorted(map(str, devices)))
        return f"the graph touches {names}: one CUDA graph records the work of one device"

    @functools.cache
    def host_plan() -> HostPlan:  # planned once, when first asked for
        if host is not None:
            return host
        return plan_host_work(gm) if has_host_work(gm) else HostPlan()

    @functools.cache
    def static_symbols() -> set:  # unbacked symbols that host work computes once per shape key
        return {s for n in host_plan().static for s in free_unbacked_symbols(n.meta.get("val"))}

    unchecked = None  # an assert on values that change per call: the host work's problem, if any, says why first
    for node in gm.graph.nodes:
        if node.op == "call_function" and not on_host(node):
            reason = host_sync_reason(node, static_symbols)
            if reason is not None and node.target is torch.ops.aten._assert_scalar.default:
                unchecked = unchecked or reason
            elif reason is not None:
                return reason
    if not simulated and host_plan().problem is not None:
        return host_plan().problem
    if unchecked is not None or simulated:
        return unchecked
    per_call: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if _changes_per_call(node, per_call):
            per_call.add(node)
        if not isinstance(val, torch.Tensor) or val.device.type != "cpu" or on_host(node):
            continue
        if node.op == "placeholder":  # even a 0-dim one: a kernel would keep the value it had when recorded
            return f"input {node.name} is a CPU tensor inside a CUDA graph"
        if val.dim() > 0:
            return f"{node.name} = {node.target} is a CPU tensor inside a CUDA graph"
        if node in per_call and any(not on_host(u) and u.op != "output" for u in node.users):
            return (
                f"{node.name} = {node.target} is a CPU scalar that changes from call to call, read inside the CUDA "
                "graph: a kernel would keep its recording value (host placement copies such a scalar to the device "
                "before every replay: passes.host_placement)"
            )
    return None


_HOSTS = ("cpu", "meta")


def _changes_per_call(node: torch.fx.Node, per_call: set[torch.fx.Node]) -> bool:
    """A CPU tensor input, a random or mutating op, or a node reading one (``per_call``: those found so far)."""
    if node.op == "placeholder":
        val = node.meta.get("val")
        return isinstance(val, torch.Tensor) and val.device.type == "cpu"
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and (
        target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
    ):
        return True
    return any(inp in per_call for inp in node.all_input_nodes)
