"""In-graph multi-stream ops: stream scope markers, tagged events and record_tagged_stream.

Each is a torch.library custom op in the ``airgraph`` namespace with a fake kernel and no outputs, marked
side-effectful (``torch.fx.node.has_side_effect``) so that Dynamo, AOTAutograd's functionalization and
dead-code elimination keep them, in program order. The streams pass (airgraph/passes/streams.py) turns
them into per-node stream assignments and event edges; the executor runs them.

The same calls work in plain eager code: on CUDA they switch real streams and record/wait real events;
on the CPU they do nothing (ordered execution is already correct).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.fx.node import has_side_effect

__all__ = ["TaggedEvent", "create_tagged_event", "record_tagged_stream", "tagged_event_record", "tagged_event_wait"]


def _check_tag(tag: Any, what: str) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"{what}: the tag must be a non-empty str, got {tag!r} ({type(tag).__name__})")
    return tag


# -- the custom ops (what the compiled graph holds) -------------------------------------------------------
@torch.library.custom_op("airgraph::stream_enter", mutates_args=())
def _stream_enter(tag: str, priority: int) -> None:
    """Scope marker: the following ops run on the stream named ``tag`` (compiled graphs only)."""


@torch.library.custom_op("airgraph::stream_exit", mutates_args=())
def _stream_exit(tag: str) -> None:
    """Scope marker: the scope opened for ``tag`` ends."""


@torch.library.custom_op("airgraph::event_record", mutates_args=())
def _event_record(tag: str) -> None:
    """Record the event ``tag`` on the current stream."""


@torch.library.custom_op("airgraph::event_wait", mutates_args=())
def _event_wait(tag: str) -> None:
    """Make the current stream wait for the last record of event ``tag``."""


@torch.library.custom_op("airgraph::record_stream", mutates_args=())
def _record_stream(tensor: torch.Tensor, tag: str) -> None:
    """``tensor`` is used on stream ``tag``: its memory must outlive that stream's work."""


for _op in (_stream_enter, _stream_exit, _event_record, _event_wait, _record_stream):
    _op.register_fake(lambda *args: None)

STREAM_ENTER = torch.ops.airgraph.stream_enter.default
STREAM_EXIT = torch.ops.airgraph.stream_exit.default
EVENT_RECORD = torch.ops.airgraph.event_record.default
EVENT_WAIT = torch.ops.airgraph.event_wait.default
RECORD_STREAM = torch.ops.airgraph.record_stream.default
STREAM_OPS = frozenset({STREAM_ENTER, STREAM_EXIT, EVENT_RECORD, EVENT_WAIT, RECORD_STREAM})
for _overload in STREAM_OPS:
    has_side_effect(_overload)


# -- eager state: tag -> stream per device, the scope stack --------------------------------------------------
class _EagerStreams(threading.local):
    def __init__(self) -> None:
        self.stack: list[Any] = []


_eager = _EagerStreams()
_streams: dict[tuple[str, int], torch.cuda.Stream] = {}


def device_index(device: torch.device | str | int | None) -> int | None:
    """The device's index (``cuda:1`` -> 1, ``2`` -> 2), or None for the current device (``cuda``, None)."""
    if device is None or isinstance(device, int):
        return device
    return torch.device(device).index


def cuda_index(device: torch.device | str | int | None) -> int:
    """The CUDA device's index, the current device's where ``device`` names none."""
    index = device_index(device)
    return torch.cuda.current_device() if index is None else index


def stream_for(tag: str, device: torch.device | str | int | None = None, priority: int = 0) -> torch.cuda.Stream:
    """The CUDA stream a tag names on a device (same tag, same stream; created on first use, with the priority
    of that use: the streams pass refuses a tag opened with two priorities in one graph)."""
    index = cuda_index(device)
    key = (tag, index)
    if key not in _streams:
        _streams[key] = torch.cuda.Stream(device=index, priority=priority)
    return _streams[key]


def _eager_cuda() -> bool:
    return torch.cuda.is_available() and not torch.compiler.is_compiling()


class TaggedEvent:
    """An event named by a tag; create it outside the compiled region (e.g. in ``__init__``)."""

    def __init__(self, tag: str) -> None:
        self.tag = _check_tag(tag, "create_tagged_event")
        self._event: torch.cuda.Event | None = None

    def __repr__(self) -> str:
        return f"TaggedEvent({self.tag!r})"

    def _cuda_event(self) -> torch.cuda.Event:
        if self._event is None:
            self._event = torch.cuda.Event()
        return self._event


def create_tagged_event(tag: str) -> TaggedEvent:
    """A tagged event: record it with :func:`tagged_event_record`, wait on it with :func:`tagged_event_wait`."""
    return TaggedEvent(tag)


def _event_tag(event: Any, what: str) -> str:
    if not isinstance(event, TaggedEvent):
        raise TypeError(f"{what}: expected an event from airgraph.ops.create_tagged_event, got {type(event).__name__}")
    return event.tag


def tagged_event_record(event: TaggedEvent) -> None:
    """Record ``event`` on the current stream (as ``torch.cuda.Event.record``)."""
    tag = _event_tag(event, "tagged_event_record")
    if _eager_cuda():
        event._cuda_event().record(torch.cuda.current_stream())
    else:
        torch.ops.airgraph.event_record(tag)


def tagged_event_wait(event: TaggedEvent) -> None:
    """Make the current stream wait until ``event``'s last record has completed (as ``Event.wait``)."""
    tag = _event_tag(event, "tagged_event_wait")
    if _eager_cuda():
        torch.cuda.current_stream().wait_event(event._cuda_event())
    else:
        torch.ops.airgraph.event_wait(tag)


def record_tagged_stream(tensor: torch.Tensor, tag: str) -> None:
    """``tensor`` is used on the stream ``tag``: its memory is not reused before that stream's work on it is done
    (the compiled-graph counterpart of ``Tensor.record_stream``)."""
    _check_tag(tag, "record_tagged_stream")
    if _eager_cuda():
        if tensor.is_cuda:
            tensor.record_stream(stream_for(tag, tensor.device))
    else:
        torch.ops.airgraph.record_stream(tensor, tag)
