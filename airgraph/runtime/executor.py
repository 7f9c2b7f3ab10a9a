"""The executor: runs a graph's lowered segments in order, as one generated Python function.

The executor takes the graph's inputs as a list (AOTAutograd's boxed convention, cleared on entry so
inputs can be freed early), calls each segment's compiled callable with the values it reads, drops each
value after its last reader, and returns the graph outputs. With a single segment that reads the graph
inputs in order and returns the graph outputs in order, the segment's callable *is* the executor: no
extra Python frame per call.

Host segments (placement "host", see passes/host_placement.py) run on the CPU like any other segment. On
CUDA, a host value that one of host placement's copies sends to the device is pinned first, so the copy
(``non_blocking=True``) is truly asynchronous; the caching host allocator keeps the pinned block until the
copy has run. A graph input is always copied into a fresh pinned buffer first: the caller may write to its
tensor as soon as the call returns, while the asynchronous copy may not have run yet. (Pinning goes through the
runtime: ``runtime.pinned`` and ``runtime.pinned_copy``.) For reduce-overhead,
:class:`airgraph.runtime.host.HostSplit` runs the host work around the device work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph import ops
from airgraph.boxed import boxed
from airgraph.graph.codegen import Emitter, compile_function, last_uses
from airgraph.graph.meta import H2D, HOST, HOST_PLACEMENT
from airgraph.graph.program import Segment
from airgraph.runtime.device import CPU, DeviceRuntime


def build_executor(
    gm: torch.fx.GraphModule,
    segments: list[Segment],
    device: torch.device,
    *,
    runtime: DeviceRuntime = CPU,
    priorities: dict[str, int] | None = None,
) -> Callable[[list], Any]:
    """A boxed callable running ``segments`` (lowered) in order; see the module docstring.

    ``runtime`` runs the streams (runtime/device.py): CUDA's for a CUDA graph, the CPU's (none) for a CPU graph;
    the simulator runs a CPU graph as if it were a CUDA one. ``priorities``: each stream tag's priority."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outputs = list(nodes[-1].args[0])
    compute = [seg for seg in segments if not seg.sync]
    on_cuda = device.type == "cuda"
    multi_stream = runtime.has_streams and any(seg.stream is not None for seg in segments)
    # Sources of host placement's copies to the device: pinned first (module docstring), unless every device
    # segment reading one also writes it (it then gets the value itself: see below).
    sources = {n.args[0] for n in nodes if n.op == "call_function" and n.meta.get(HOST_PLACEMENT) == H2D}
    written = {seg.id: {seg.inputs[i] for i in seg.written} for seg in compute} if on_cuda and sources else {}
    to_pin = {
        n
        for n in (sources if on_cuda else ())
        if any(seg.placement != HOST and n in seg.inputs and n not in written[seg.id] for seg in compute)
    }

    if len(segments) == 1 and not segments[0].sync and not multi_stream and not to_pin:
        seg = segments[0]
        if seg.inputs == placeholders and seg.outputs == outputs and len(set(outputs)) == len(outputs):
            return runtime.wrap_segment(seg, seg.compiled)  # the compiled callable itself, but for the simulator

    emitter = Emitter()
    names = {node: f"v{i}" for i, node in enumerate(nodes)}
    steps = segments if multi_stream else compute  # without device streams, sync points are no-ops
    frees = last_uses([seg.inputs for seg in steps])
    keep = set(n for n in outputs if isinstance(n, torch.fx.Node))
    body = ["def run(args):"]
    if placeholders:
        body.append(f"    {', '.join(names[n] for n in placeholders)}, = args")
    body.append("    args.clear()")
    # host value -> its pinned copy, which device segments read (an asynchronous copy's source); host segments,
    # the caller and in-place writes keep the value itself, which they may change while the copy still reads
    pins: dict[torch.fx.Node, str] = {}
    outputs_set = set(outputs)
    for node in (n for n in placeholders if n in to_pin):  # the caller's tensor: always a new pinned copy
        pins[node] = f"{names[node]}_pinned"
        body.append(f"    {pins[node]} = {emitter.bind(runtime.pinned_copy, 'pinned_copy')}({names[node]})")
    streams = _StreamCode(emitter, body, device, runtime, priorities or {}) if multi_stream else None
    if streams is not None:
        keep |= streams.cross_stream_values(steps, placeholders)
        streams.fork([seg.stream for seg in steps])
    for step, seg in enumerate(steps):
        if streams is not None and seg.sync:
            streams.sync(seg.nodes[0], names)
            continue
        compiled = runtime.wrap_segment(seg, seg.compiled)
        writes = written.get(seg.id, ())
        reads = [names[n] if seg.placement == HOST or n in writes else pins.get(n, names[n]) for n in seg.inputs]
        call = f"{emitter.bind(compiled, f'segment{seg.id}')}([{', '.join(reads)}])"
        line = f"{', '.join(names[n] for n in seg.outputs)}, = {call}" if seg.outputs else call
        if streams is not None:
            streams.run_on(seg, line, names)
        else:
            body.append(f"    {line}")
        for node in (n for n in seg.outputs if n in to_pin):
            pins[node] = f"{names[node]}_pinned"
            pin = "pinned_copy" if node in outputs_set else "pinned"  # the caller's from now on: never shared
            body.append(f"    {pins[node]} = {emitter.bind(getattr(runtime, pin), pin)}({names[node]})")
        dead = [names[n] for n in frees.get(step, ()) if n not in keep]
        if dead:
            body.append(f"    del {', '.join(dead)}")
    if streams is not None:
        streams.join([n for n in outputs if isinstance(n, torch.fx.Node)], names)
    body.append(f"    return {emitter.arg(list(outputs), names)}")
    run = compile_function("\n".join(body) + "\n", emitter.globals, "run", "executor")
    return boxed(run)


class _StreamCode:
    """Emits the multi-stream parts of the executor (CUDA, or the simulator on the CPU).

    Side streams fork from the caller's current stream at graph entry and the caller's stream joins them
    before the graph returns, so a graph is legal inside CUDA graph capture and replays with the same
    overlap. Before a segment runs, its stream waits for every other stream that produced one of its inputs
    (read after write) and, for each input the segment writes in place, for every other stream that read it
    (write after read: a functionalized graph's ``copy_`` into an input runs after the side streams that
    read the old value). Values that cross streams (graph inputs read on a side stream, and tensors given
    to record_tagged_stream, included) are kept alive until the join, so the caching allocator never hands
    their memory to other work while another stream may still read it; a side stream's value read on
    another stream is also ``record_stream``-ed for the reader, as its block is freed after the join into
    the side stream's pool. (runtime/simulated.py checks all of this on the CPU.)
    """

    def __init__(
        self,
        emitter: Emitter,
        body: list[str],
        device: torch.device,
        runtime: DeviceRuntime,
        priorities: dict[str, int],
    ) -> None:
        self.emitter, self.body, self.device, self.runtime = emitter, body, device, runtime
        self.priorities = priorities
        self.producer: dict[torch.fx.Node, str | None] = {}
        self.produced_at: dict[torch.fx.Node, int] = {}
        self.readers: dict[torch.fx.Node, dict[str | None, int]] = {}  # value -> stream -> last read position
        self.synced: dict[tuple[str | None, str | None], int] = {}  # (waiter, waited) -> position of the wait
        self.position = 0
        self.events: dict[str, str] = {}
        current = emitter.bind(runtime.current_stream, "current_stream")
        self.body.append(f"    cur = {current}({emitter.bind(device, 'device')})")

    def stream(self, tag: str | None) -> str:
        if tag is None:
            return "cur"
        side = self.runtime.side_stream(tag, self.device, self.priorities.get(tag, 0))
        return self.emitter.bind(side, f"stream_{tag}")

    def cross_stream_values(self, steps: list[Segment], placeholders: list[torch.fx.Node]) -> set[torch.fx.Node]:
        stream_of: dict[torch.fx.Node, str | None] = dict.fromkeys(placeholders)  # inputs: the caller's stream
        crossing: set[torch.fx.Node] = set()
        for seg in steps:
            for node in seg.inputs:
                if node in stream_of and stream_of[node] != seg.stream:
                    crossing.add(node)
            if seg.sync and seg.nodes[0].target is ops.RECORD_STREAM:
                crossing.update(seg.inputs)
            for node in seg.outputs:
                stream_of[node] = seg.stream
        return crossing

    def fork(self, tags: list[str | None]) -> None:
        self.side = list(dict.fromkeys(t for t in tags if t is not None))
        for tag in self.side:
            self.body.append(f"    {self.stream(tag)}.wait_stream(cur)")

    def join(self, outputs: list[torch.fx.Node], names: dict[torch.fx.Node, str]) -> None:
        for tag in self.side:
            self.body.append(f"    cur.wait_stream({self.stream(tag)})")
        # Outputs a side stream made are the caller's now: when freed, their blocks go back to the side
        # stream's pool, and its next work need not be ordered after the caller's reads (record_stream).
        record = self.emitter.bind(self.runtime.record_stream, "record_stream")
        for node in dict.fromkeys(outputs):
            if self.producer.get(node) is not None:
                self.body.append(f"    {record}({names[node]}, cur)")

    def _wait(self, waiter: str | None, waited: str | None, since: int) -> None:
        """``waiter`` waits for ``waited``'s work up to position ``since``, unless it already has."""
        if waiter == waited or self.synced.get((waiter, waited), -1) >= since:
            return
        self.body.append(f"    {self.stream(waiter)}.wait_stream({self.stream(waited)})")
        self.synced[(waiter, waited)] = self.position

    def _wait_for_inputs(self, seg: Segment) -> None:
        written = {seg.inputs[i] for i in seg.written}
        for node in seg.inputs:
            if node in self.producer:
                self._wait(seg.stream, self.producer[node], self.produced_at[node])
            if node in written:
                for reader, at in self.readers.get(node, {}).items():
                    self._wait(seg.stream, reader, at)

    def run_on(self, seg: Segment, line: str, names: dict[torch.fx.Node, str]) -> None:
        self.position += 1
        self._wait_for_inputs(seg)
        if seg.stream is None:
            self.body.append(f"    {line}")
        else:
            ctx = self.emitter.bind(self.runtime.use, "use_stream")
            self.body.append(f"    with {ctx}({self.stream(seg.stream)}):")
            self.body.append(f"        {line}")
        # A side stream's value read on another stream: its block goes back to the side stream's pool when
        # freed (after the join), and that stream's next work is not ordered after this read (the caller may
        # call next time from another stream): the allocator must wait for the reader.
        record = self.emitter.bind(self.runtime.record_stream, "record_stream")
        for node in seg.inputs:
            if self.producer.get(node, seg.stream) not in (None, seg.stream):
                self.body.append(f"    {record}({names[node]}, {self.stream(seg.stream)})")
        for node in seg.inputs:
            self.readers.setdefault(node, {})[seg.stream] = self.position
        for node in seg.outputs:
            self.producer[node] = seg.stream
            self.produced_at[node] = self.position

    def sync(self, node: torch.fx.Node, names: dict[torch.fx.Node, str]) -> None:
        self.position += 1
        stream = self.stream(node.meta.get("stream"))
        if node.target is ops.EVENT_RECORD:
            tag = node.args[0]
            if tag not in self.events:
                self.events[tag] = self.emitter.bind(self.runtime.new_event(), f"event_{tag}")
            event = self.events[tag]
            self.body.append(f"    {event}.record({stream})")
        elif node.target is ops.EVENT_WAIT:
            self.body.append(f"    {stream}.wait_event({self.events[node.args[0]]})")
        # RECORD_STREAM: the tensor is kept alive until the join (cross_stream_values); nothing to emit.
