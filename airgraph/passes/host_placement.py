"""host_placement: keep tiny shape arithmetic on the CPU (GE's small-shape host placement).

A tiny op on a GPU costs a kernel launch, and a device-to-host sync when the host needs its result. This pass
marks such ops ``node.meta[PLACEMENT] = "host"``; the partitioner puts them in host segments, which run as direct
ATen calls on the CPU. One forward walk in graph order decides every node after its inputs: anchors (values
already on the host), moves (all tensor inputs on the host or small constants, every output at most
``config.host_placement.max_elements`` elements provably, a CPU kernel, not random, not mutating), groups taken
back when they are not worth it, one shared asynchronous copy per moved value a device op reads, hoisting of
input-only host work to the top. The rules in full: docs/host-placement.md.

Invariants: random and mutating ops never move, so no side effect is reordered; a dynamic size that is not
provably small stays on the device and adds no guard; the syncs removed are counted in the pass's report; on a
CPU graph the pass changes nothing and says so.
"""

from __future__ import annotations

import operator

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airgraph.graph.analysis import has_side_effects, node_label
from airgraph.graph.meta import (
    ANCHOR,
    H2D,
    HOST,
    METADATA_OPS,
    MOVED,
    PLACEMENT,
    STREAM,
    is_non_blocking,
    on_host,
    tensors,
    transfer_device,
)
from airgraph.graph.meta import HOST_PLACEMENT as META
from airgraph.passes.base import CompileContext, PassResult

aten, prims = torch.ops.aten, torch.ops.prims

# Indexing ops on the device that accept CPU index tensors (and copy them to the device, blocking).
INDEX_OPS = frozenset({aten.index.Tensor, aten.index_put.default, aten._unsafe_index.Tensor})
_CPU = torch.device("cpu")
_DEVICE_PUT_HAS_NON_BLOCKING = any(a.name == "non_blocking" for a in prims.device_put.default._schema.arguments)
_READS_DEVICE = "reads a device tensor"


def has_cpu_kernel(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), "CPU")


def _small(val: torch.Tensor, limit: int) -> bool:
    return bool(statically_known_true(val.numel() <= limit))


def _redevice(val: object, device: torch.device) -> object:
    """The same fake value (sizes, strides, dtype) on ``device``; SymInt sizes are kept, no guard is added."""
    if isinstance(val, FakeTensor):
        with val.fake_mode:  # inside its mode: no device initialisation (a CUDA build with no GPU has none)
            return val.new_empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device)
    if isinstance(val, torch.Tensor):
        return val.new_empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device)
    if isinstance(val, (list, tuple)):
        return type(val)(_redevice(v, device) for v in val)
    return val


def _device_args_to_host(node: torch.fx.Node) -> None:
    """Rewrite every ``Device`` argument of the node's schema (``device=cuda``) to the CPU."""
    args, kwargs = list(node.args), dict(node.kwargs)
    for index, arg in enumerate(node.target._schema.arguments):
        if "Device" not in str(arg.type):
            continue
        if arg.kwarg_only or index >= len(args):
            if kwargs.get(arg.name) is not None:
                kwargs[arg.name] = _CPU
        elif args[index] is not None:
            args[index] = _CPU
    node.args, node.kwargs = tuple(args), kwargs


class _Walk:
    """One forward walk: which values are on the host and why nodes move or stay.

    The walk only decides (marking ``placement`` so later nodes see their inputs on the host); ``prune``
    then takes back moves that gain nothing and ``apply`` rewrites the moved nodes.
    """

    def __init__(self, gm: torch.fx.GraphModule, limit: int) -> None:
        self.gm, self.limit = gm, limit
        self.moved: dict[torch.fx.Node, str] = {}
        self.anchors: list[torch.fx.Node] = []
        self.stays: dict[torch.fx.Node, str] = {}
        self.device_val: dict[torch.fx.Node, object] = {}  # a moved node's value before the move
        self.host_consts: dict[torch.fx.Node, torch.fx.Node] = {}
        # Host values that change from call to call: CPU inputs and what is computed from them (or random).
        self.per_call: set[torch.fx.Node] = set()

    # -- deciding ----------------------------------------------------------------------------------------
    def visit(self, node: torch.fx.Node) -> None:
        outs = tensors(node.meta.get("val"))
        if node.op in ("placeholder", "get_attr"):
            if outs and all(t.device.type == "cpu" for t in outs):
                self.mark(node, ANCHOR)
            return
        if node.op != "call_function":
            return
        inputs = [n for n in node.all_input_nodes if tensors(n.meta.get("val"))]
        if not all(on_host(n) or self.small_constant(n) for n in inputs):
            if any(on_host(n) for n in inputs):
                self.stays[node] = _READS_DEVICE
            return
        target = node.target
        if target is operator.getitem:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and on_host(source):
                self.mark(node, source.meta[META])
                if source in self.moved:
                    self.moved[node] = f"an output of {source.name}"
            return
        if not isinstance(target, torch._ops.OpOverload):
            return
        random = torch.Tag.nondeterministic_seeded in target.tags
        if target._schema.is_mutable or (has_side_effects(node) and not random):
            if inputs:
                self.stays[node] = "mutates its input or has side effects"
            return
        if not outs:  # .item(), sym_size, ... of host values: computed on the host
            if inputs:
                self.mark(node, ANCHOR)
            return
        if all(t.device.type == "cpu" for t in outs):
            self.mark(node, ANCHOR)
            return
        reason = self.why_not(node, outs)
        if reason is not None:
            if inputs or node.users:
                self.stays[node] = reason
            return
        self.mark(node, MOVED)
        sizes = ", ".join(str(t.numel()) for t in outs)
        source = "host inputs" if inputs else "sizes and scalars only"
        self.moved[node] = f"{source}; output elements {sizes} <= {self.limit}"

    def why_not(self, node: torch.fx.Node, outs: list[torch.Tensor]) -> str | None:
        target = node.target
        if any(t.device.type == "cpu" for t in outs):
            return "outputs on both the host and the device"
        if torch.Tag.nondeterministic_seeded in target.tags:
            return "random (nondeterministic_seeded): the device generator must produce it"
        if not has_cpu_kernel(target):
            return "no CPU kernel"
        large = [t for t in outs if not _small(t, self.limit)]
        if large:
            return f"output has {large[0].numel()} elements, not provably <= {self.limit}"
        return None

    def small_constant(self, node: torch.fx.Node) -> bool:
        val = node.meta.get("val")
        if node.op != "get_attr" or not isinstance(val, torch.Tensor) or not _small(val, self.limit):
            return False
        return not isinstance(self._attr(node), torch._subclasses.FakeTensor)  # a value we can copy now

    def mark(self, node: torch.fx.Node, why: str) -> None:
        node.meta[PLACEMENT], node.meta[META] = HOST, why
        if why == ANCHOR:
            self.anchors.append(node)
        target = node.target
        random = isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags
        if node.op == "placeholder" or random or any(i in self.per_call for i in node.all_input_nodes):
            self.per_call.add(node)

    # -- taking back moves that gain nothing -----------------------------------------------------------------
    def prune(self) -> None:
        """Undo each group of connected moves that removes no sync and saves no device launch.

        A group (moved nodes connected by data edges) is kept when a host op reads it (``.item()``, ``.cpu()``:
        a device-to-host sync removed), when it replaces a blocking host-to-device copy, or when it moves more
        ops than the copies back to the device it needs. ``where(mask, scalar_tensor(0.0), x)`` keeps its
        scalar on the device: one fill kernel would only become one copy.
        """
        seen: set[torch.fx.Node] = set()
        for start in list(self.moved):
            if start in seen:
                continue
            group, stack = [], [start]
            seen.add(start)
            while stack:
                node = stack.pop()
                group.append(node)
                for other in (*node.all_input_nodes, *node.users):
                    if other in self.moved and other not in seen:
                        seen.add(other)
                        stack.append(other)
            ops = sum(1 for n in group if n.target is not operator.getitem and transfer_device(n) is None)
            copies = sum(1 for n in group if tensors(n.meta.get("val")) and any(not on_host(u) for u in n.users))
            host_readers = any(on_host(u) and u not in self.moved for n in group for u in n.users)
            blocking = any(transfer_device(n) is not None and not is_non_blocking(n) for n in group)
            if host_readers or blocking or ops > copies:
                continue
            for node in group:
                del self.moved[node]
                node.meta.pop(PLACEMENT, None)
                node.meta.pop(META, None)
                if node.target is not operator.getitem:
                    self.stays[node] = f"moving its group saves nothing: {ops} op(s), {copies} copy(ies) back, no sync"
        self.stays = {  # a reader of host values whose host inputs all went back is no frontier any more
            n: why for n, why in self.stays.items() if why != _READS_DEVICE or any(map(on_host, n.all_input_nodes))
        }

    # -- rewriting ---------------------------------------------------------------------------------------------
    def apply(self) -> None:
        """Rewrite every moved node to run on the CPU: device arguments, small constants, ``meta["val"]``."""
        for node in self.moved:
            self.device_val[node] = node.meta["val"]
            node.meta[STREAM] = None  # host work runs on no device stream
            if node.target is not operator.getitem:
                for inp in node.all_input_nodes:
                    if tensors(inp.meta.get("val")) and not on_host(inp):
                        node.replace_input_with(inp, self.host_constant(inp))
                _device_args_to_host(node)
            node.meta["val"] = _redevice(node.meta["val"], _CPU)
        for node in self.anchors:
            node.meta[STREAM] = None

    def _attr(self, node: torch.fx.Node) -> object:
        value = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return value

    def host_constant(self, node: torch.fx.Node) -> torch.fx.Node:
        """A CPU copy of a small device constant, made once at compile time. The constant is a real tensor (on a
        GPU, make_fx runs small constant ops for real) and the pass runs under the compile's FakeTensorMode,
        which refuses real tensors: the copy is made outside it."""
        if node not in self.host_consts:
            name = f"_host_{str(node.target).replace('.', '_')}"
            with unset_fake_temporarily():  # a buffer, not a plain attribute: FX's get_attr warns of those
                self.gm.register_buffer(name, self._attr(node).detach().cpu(), persistent=False)
            with self.gm.graph.inserting_after(node):
                copy = self.gm.graph.get_attr(name)
            copy.meta["val"] = _redevice(node.meta["val"], _CPU)
            copy.meta[PLACEMENT], copy.meta[META], copy.meta[STREAM] = HOST, ANCHOR, None
            self.host_consts[node] = copy
        return self.host_consts[node]

    def device_of(self, node: torch.fx.Node) -> torch.device:
        return tensors(self.device_val[node])[0].device


def _insert_copies(
    gm: torch.fx.GraphModule, walk: _Walk, device: torch.device, *, inductor: bool, capture: bool
) -> tuple[list[torch.fx.Node], list[str]]:
    """One host-to-device copy per moved value that a device op or the graph output reads; one per CPU index
    tensor that an indexing op on the device reads (it would copy it itself, blocking); and, for capture
    (reduce-overhead), one per CPU scalar that changes per call and that a kernel reads (as a kernel argument
    it would be frozen at its recording value; as a device tensor it is refilled before every replay).

    Returns the copies and the blocking copies they replace.
    """
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    copies, unblocked = [], []
    for node in [*walk.moved, *walk.anchors]:
        val = node.meta.get("val")
        if node in walk.moved:
            readers = [u for u in node.users if not on_host(u)]
            target = walk.device_of(node)
        elif isinstance(val, torch.Tensor) and val.dim() > 0:
            readers = [u for u in node.users if not on_host(u) and u.target in INDEX_OPS and u.args[0] is not node]
            target = device
        elif isinstance(val, torch.Tensor) and capture and node in walk.per_call:
            readers = [u for u in node.users if not on_host(u) and u.op != "output" and transfer_device(u) is None]
            target = device
        else:
            continue
        if not readers or not tensors(val):
            continue
        first = min(readers, key=order.__getitem__)
        with gm.graph.inserting_before(first):
            if inductor:
                args = (node, target, True) if _DEVICE_PUT_HAS_NON_BLOCKING else (node, target)
                copy = gm.graph.call_function(prims.device_put.default, args)
            else:
                copy = gm.graph.call_function(aten._to_copy.default, (node,), {"device": target, "non_blocking": True})
        copy.meta["val"] = walk.device_val[node] if node in walk.moved else _redevice(val, target)
        copy.meta[STREAM] = first.meta.get(STREAM) if first.op != "output" else None
        copy.meta[META] = H2D
        copy.meta["stack_trace"] = node.meta.get("stack_trace")
        for reader in readers:
            reader.replace_input_with(node, copy)
            if node not in walk.moved and val.dim() > 0:
                unblocked.append(f"{node_label(reader)} reads the CPU index {node.name}: it would copy it, blocking")
        copies.append(copy)
    return copies, unblocked


def _hoist(gm: torch.fx.GraphModule) -> int:
    """Move host ops that depend on graph inputs only (and the SymInt arithmetic they read) to the top.

    Constants (``get_attr``) go first, then the host ops in their original order. A node moves only when all
    its inputs are already placed above it; random ops stay where they are (their order is the RNG's).
    """
    nodes = list(gm.graph.nodes)
    host = {n for n in nodes if on_host(n) and n.op == "call_function"}
    wanted: set[torch.fx.Node] = set()
    stack = list(host)
    while stack:  # SymInt-valued pure nodes the host ops read
        for inp in stack.pop().all_input_nodes:
            if inp.op == "call_function" and inp not in host and inp not in wanted and _pure_scalar(inp):
                wanted.add(inp)
                stack.append(inp)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    ready = set(placeholders)
    cursor = placeholders[-1] if placeholders else None
    hoisted = 0
    for node in nodes:
        if node.op != "get_attr" and node not in host and node not in wanted:
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
            continue
        if not all(inp in ready for inp in node.all_input_nodes):
            continue
        ready.add(node)
        if node in wanted:
            node.meta[PLACEMENT], node.meta[STREAM] = HOST, None
            node.meta.setdefault(META, ANCHOR)
        if cursor is None:
            head = next(iter(gm.graph.nodes))
            if head is not node:
                head.prepend(node)
        elif cursor.next is not node:
            cursor.append(node)
            hoisted += node.op != "get_attr"
        cursor = node
    return hoisted


def _pure_scalar(node: torch.fx.Node) -> bool:
    """A node computing a SymInt/number from metadata or other numbers: free to run anywhere."""
    if tensors(node.meta.get("val")) or has_side_effects(node):
        return False
    if node.target in METADATA_OPS:
        return True
    if isinstance(node.target, torch._ops.OpOverload):
        return False
    return all(not tensors(inp.meta.get("val")) for inp in node.all_input_nodes)


def _syncs_removed(walk: _Walk) -> list[str]:
    """Device-to-host syncs (and blocking host-to-device copies) the new placement removes."""
    found = []
    for node in walk.anchors:
        if node.op != "call_function":
            continue
        from_device = [n for n in node.all_input_nodes if n in walk.moved]
        if not from_device:
            continue
        if node.target in METADATA_OPS:
            continue
        if not tensors(node.meta.get("val")):
            found.append(f"{node_label(node)} reads {from_device[0].name} on the host: no device-to-host sync")
        elif (device := transfer_device(node)) is not None and device.type == "cpu":
            found.append(
                f"{node_label(node)} copies {from_device[0].name}, already on the host: no device-to-host copy"
            )
    for node in walk.moved:
        if transfer_device(node) is not None and not is_non_blocking(node):
            found.append(f"{node_label(node)}: a blocking host-to-device copy replaced by an asynchronous one")
    return found


def host_placement(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    if ctx.device.type == "cpu":
        result.details.append("the graph runs on the CPU: every op is already on the host, nothing to place")
        return result
    limit = ctx.config.host_placement.max_elements
    walk = _Walk(gm, limit)
    for node in list(gm.graph.nodes):
        walk.visit(node)
    walk.prune()
    walk.apply()
    for node, reason in walk.moved.items():
        result.note(f"{node_label(node)} -> host: {reason}")
    copies, unblocked = _insert_copies(
        gm,
        walk,
        ctx.device,
        inductor=ctx.config.kernel_backend == "inductor",
        capture=ctx.config.mode == "reduce-overhead",
    )
    for copy in copies:
        result.note(f"{copy.name}: one host-to-device copy of {copy.args[0].name} for its device readers")
    hoisted = _hoist(gm) if walk.moved or walk.anchors else 0
    syncs = _syncs_removed(walk) + unblocked
    anchors = [n.name for n in walk.anchors]
    if anchors:
        shown = ", ".join(anchors[:6]) + (f" (+{len(anchors) - 6} more)" if len(anchors) > 6 else "")
        result.details.append(f"anchors already on the host: {shown}")
    for node, reason in walk.stays.items():
        result.details.append(f"{node_label(node)} stays on the device: {reason}")
    result.details.extend(f"sync removed: {line}" for line in syncs)
    if hoisted:
        result.details.append(f"{hoisted} host op(s) hoisted ahead of the device work")
    if not walk.moved and not anchors:
        result.details.append("no host values in this graph: nothing to place")
    ctx.report.host_placement = {
        "max_elements": limit,
        "moved": [n.name for n in walk.moved],
        "anchors": anchors,
        "copies": [c.name for c in copies],
        "syncs_removed": len(syncs),
    }
    result.changed += len(anchors)  # their placement changed: they now run in host segments
    return result
