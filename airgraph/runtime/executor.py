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
tensor as soon as the call returns, while the asynchronous copy may not have run yet. For reduce-overhead, :class:`airgraph.runtime.host.HostSplit` cuts the host work off the device work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airgraph import ops
from airgraph.codegen import Emitter, compile_function, last_uses
from airgraph.lowering.partition import Segment
from airgraph.passes.host_placement import META


def build_executor(
    gm: torch.fx.GraphModule, segments: list[Segment], device: torch.device | None = None
) -> Callable[[list], Any]:
    """A boxed callable running ``segments`` (lowered) in order; see the module docstring."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outputs = list(nodes[-1].args[0])
    compute = [seg for seg in segments if seg.kind == "compute"]
    on_cuda = device is not None and device.type == "cuda"
    multi_stream = on_cuda and any(seg.stream is not None for seg in segments)
    # Sources of host placement's copies to the device: pinned first (module docstring).
    to_pin = {n.args[0] for n in nodes if n.op == "call_function" and n.meta.get(META) == "h2d"} if on_cuda else set()

    if len(segments) == 1 and segments[0].kind == "compute" and not multi_stream and not to_pin:
        seg = segments[0]
        if seg.inputs == placeholders and seg.outputs == outputs and len(set(outputs)) == len(outputs):
            return seg.compiled

    emitter = Emitter()
    names = {node: f"v{i}" for i, node in enumerate(nodes)}
    steps = segments if multi_stream else compute  # without device streams, sync points are no-ops
    frees = last_uses([seg.inputs for seg in steps])
    keep = set(n for n in outputs if isinstance(n, torch.fx.Node))
    body = ["def run(args):"]
    if placeholders:
        body.append(f"    {', '.join(names[n] for n in placeholders)}, = args")
    body.append("    args.clear()")
    for node in (n for n in placeholders if n in to_pin):
        body.append(f"    {names[node]} = {emitter.bind(pinned_copy, 'pinned_copy')}({names[node]})")
    streams = _StreamCode(emitter, body, device) if multi_stream else None
    if streams is not None:
        keep |= streams.cross_stream_values(steps)
        streams.fork([seg.stream for seg in steps])
    for step, seg in enumerate(steps):
        if streams is not None and seg.kind == "sync":
            streams.sync(seg.nodes[0], names)
            continue
        call = f"{emitter.bind(seg.compiled, f'segment{seg.id}')}([{', '.join(names[n] for n in seg.inputs)}])"
        line = f"{', '.join(names[n] for n in seg.outputs)}, = {call}" if seg.outputs else call
        if streams is not None:
            streams.run_on(seg, line)
        else:
            body.append(f"    {line}")
        for node in (n for n in seg.outputs if n in to_pin):
            body.append(f"    {names[node]} = {emitter.bind(pinned, 'pinned')}({names[node]})")
        dead = [names[n] for n in frees.get(step, ()) if n not in keep]
        if dead:
            body.append(f"    del {', '.join(dead)}")
    if streams is not None:
        streams.join()
    body.append(f"    return {emitter.arg(list(outputs), names)}")
    run = compile_function("\n".join(body) + "\n", emitter.globals, "run", "executor")
    run._boxed_call = True
    return run


class _StreamCode:
    """Emits the multi-stream parts of the executor (CUDA only).

    Side streams fork from the caller's current stream at graph entry and the caller's stream joins them
    before the graph returns, so a graph is legal inside CUDA graph capture and replays with the same
    overlap. A segment waits for the streams that produced its inputs; values that cross streams (and
    tensors given to record_tagged_stream) are kept alive until the join, so the caching allocator never
    hands their memory to other work while another stream may still read it.
    """

    def __init__(self, emitter: Emitter, body: list[str], device: torch.device) -> None:
        self.emitter, self.body, self.device = emitter, body, device
        self.producer: dict[torch.fx.Node, str | None] = {}
        self.synced: dict[tuple[str | None, str | None], int] = {}
        self.produced_at: dict[torch.fx.Node, int] = {}
        self.position = 0
        self.events: dict[str, str] = {}
        self.body.append(f"    cur = {emitter.bind(torch.cuda.current_stream, 'current_stream')}({device.index or 0})")

    def stream(self, tag: str | None) -> str:
        if tag is None:
            return "cur"
        return self.emitter.bind(ops.stream_for(tag, self.device), f"stream_{tag}")

    def cross_stream_values(self, steps: list[Segment]) -> set[torch.fx.Node]:
        stream_of: dict[torch.fx.Node, str | None] = {}
        crossing: set[torch.fx.Node] = set()
        for seg in steps:
            for node in seg.inputs:
                if node in stream_of and stream_of[node] != seg.stream:
                    crossing.add(node)
            if seg.kind == "sync" and seg.nodes[0].target is ops.RECORD_STREAM:
                crossing.update(seg.inputs)
            for node in seg.outputs:
                stream_of[node] = seg.stream
        return crossing

    def fork(self, tags: list[str | None]) -> None:
        self.side = list(dict.fromkeys(t for t in tags if t is not None))
        for tag in self.side:
            self.body.append(f"    {self.stream(tag)}.wait_stream(cur)")

    def join(self) -> None:
        for tag in self.side:
            self.body.append(f"    cur.wait_stream({self.stream(tag)})")

    def _wait_for_inputs(self, seg: Segment) -> None:
        for node in seg.inputs:
            if node not in self.producer:
                continue
            source = self.producer[node]
            if source == seg.stream:
                continue
            pair = (seg.stream, source)
            if self.synced.get(pair, -1) < self.produced_at[node]:
                self.body.append(f"    {self.stream(seg.stream)}.wait_stream({self.stream(source)})")
                self.synced[pair] = self.position

    def run_on(self, seg: Segment, line: str) -> None:
        self.position += 1
        self._wait_for_inputs(seg)
        if seg.stream is None:
            self.body.append(f"    {line}")
        else:
            ctx = self.emitter.bind(torch.cuda.stream, "cuda_stream")
            self.body.append(f"    with {ctx}({self.stream(seg.stream)}):")
            self.body.append(f"        {line}")
        for node in seg.outputs:
            self.producer[node] = seg.stream
            self.produced_at[node] = self.position

    def sync(self, node: torch.fx.Node, names: dict[torch.fx.Node, str]) -> None:
        self.position += 1
        stream = self.stream(node.meta.get("stream"))
        if node.target is ops.EVENT_RECORD:
            tag = node.args[0]
            if tag not in self.events:
                self.events[tag] = self.emitter.bind(torch.cuda.Event(), f"event_{tag}")
            event = self.events[tag]
            self.body.append(f"    {event}.record({stream})")
        elif node.target is ops.EVENT_WAIT:
            self.body.append(f"    {stream}.wait_event({self.events[node.args[0]]})")
        # RECORD_STREAM: the tensor is kept alive until the join (cross_stream_values); nothing to emit.


def pinned(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a value the graph computed) in pinned (page-locked) memory, for an asynchronous host-to-device copy."""
    return t if t.is_pinned() else t.pin_memory()


def pinned_copy(t: torch.Tensor) -> torch.Tensor:
    """A new pinned copy of ``t`` (a caller's tensor, which may be written to once the call returns)."""
    return torch.empty_like(t, pin_memory=True).copy_(t)
