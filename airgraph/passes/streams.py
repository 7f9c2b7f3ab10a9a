"""streams: stream scopes and tagged events -> per-node stream assignments and event edges.

Walks the graph in program order with a stack of open ``stream_switch`` scopes. Every op gets
``node.meta["stream"]`` (the innermost scope's tag, or None for the caller's stream); the scope markers are
then erased. Event records, waits and ``record_tagged_stream`` stay in the graph as sync points the
executor performs (they get the stream they were issued on). The event edges (record -> wait) go into the
graph report, so ``explain`` and ``airgraph inspect`` show them.

Validated here, with errors naming the tag and the user's source line: a wait on an event that is not
recorded before it, unbalanced scopes, and a priority outside the device's range. (A non-str tag is
refused when the scope or event is created, in airgraph/scope.py and airgraph/ops.py.)
"""

from __future__ import annotations

import os
import re

import torch

from airgraph.graph.meta import STREAM
from airgraph.ops import EVENT_RECORD, EVENT_WAIT, RECORD_STREAM, STREAM_ENTER, STREAM_EXIT
from airgraph.passes.base import CompileContext, PassResult

# CUDA's stream priorities on current GPUs: 0 is the lowest, -5 the highest (lower number = higher
# priority). Used when no GPU can be asked (planning on a CPU machine); a real GPU's range wins.
DEFAULT_PRIORITY_RANGE = (0, -5)


class StreamGraphError(ValueError):
    """A stream scope or tagged event used in a way the compiled graph cannot honour."""


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_line(node: torch.fx.Node) -> str:
    """``file:line`` of the user's code that produced ``node``: the innermost frame Dynamo recorded that is not
    inside airgraph itself (the scope and event helpers)."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    user = [f for f in frames if not os.path.abspath(f[0]).startswith(_PACKAGE_DIR + os.sep)]
    frame = (user or frames or [None])[-1]
    return f"{frame[0]}:{frame[1]}" if frame else "unknown source line"


def priority_range(device: torch.device) -> tuple[int, int]:
    """(lowest, highest) stream priority for ``device``."""
    if device.type == "cuda" and torch.cuda.is_available():
        return tuple(torch.cuda.Stream.priority_range())  # type: ignore[return-value]
    return DEFAULT_PRIORITY_RANGE


def streams(gm: torch.fx.GraphModule, ctx: CompileContext) -> PassResult:
    result = PassResult()
    stack: list[tuple[str, torch.fx.Node]] = []
    priorities: dict[str, int] = {}
    last_record: dict[str, torch.fx.Node] = {}
    edges: list[dict] = []
    lowest, highest = priority_range(ctx.device)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        current = stack[-1][0] if stack else None
        if node.target is STREAM_ENTER:
            tag, priority = node.args
            if not highest <= priority <= lowest:
                raise StreamGraphError(
                    f"stream_switch({tag!r}, stream_priority={priority}) at {source_line(node)}: the priority is "
                    f"outside the device's range {highest}..{lowest} (lower numbers are higher priorities)"
                )
            if priorities.setdefault(tag, priority) != priority:
                raise StreamGraphError(
                    f"stream_switch({tag!r}) at {source_line(node)}: priority {priority} differs from the "
                    f"{priorities[tag]} this tag was first opened with; one tag names one stream"
                )
            stack.append((tag, node))
            gm.graph.erase_node(node)
            continue
        if node.target is STREAM_EXIT:
            (tag,) = node.args
            if not stack or stack[-1][0] != tag:
                open_tag = repr(stack[-1][0]) if stack else "none"
                raise StreamGraphError(
                    f"unbalanced stream scopes: the scope {tag!r} closes at {source_line(node)} while the "
                    f"innermost open scope is {open_tag}"
                )
            stack.pop()
            gm.graph.erase_node(node)
            continue
        node.meta[STREAM] = current
        if current is not None:
            result.note(f"{node.name} -> stream {current!r}")
        if node.target is EVENT_RECORD:
            last_record[node.args[0]] = node
        elif node.target is EVENT_WAIT:
            tag = node.args[0]
            if tag not in last_record:
                raise StreamGraphError(
                    f"tagged_event_wait on event {tag!r} at {source_line(node)} waits for an event that is never "
                    "recorded before the wait in this graph; call tagged_event_record(event) first"
                )
            record = last_record[tag]
            edges.append(
                {
                    "tag": tag,
                    "record": record.name,
                    "record_stream": record.meta[STREAM],
                    "wait": node.name,
                    "wait_stream": current,
                }
            )
        elif node.target is RECORD_STREAM:
            node.meta["record_stream"] = node.args[1]
    if stack:
        tag, node = stack[-1]
        raise StreamGraphError(
            f"unbalanced stream scopes: the scope {tag!r} opened at {source_line(node)} never closes"
        )
    ctx.report.events = edges
    ctx.report.stream_priorities = priorities
    return result
