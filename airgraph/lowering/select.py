"""The seam: the one place that decides which implementation runs each compute segment.

``choose(segment, request)`` asks each step in order; the first that answers wins:

1. ``debug``: ``config.debug.run_eagerly`` runs every segment through the interpreter, for bisecting;
2. ``host``: host segments (host placement put their ops on the CPU) run as direct ATen calls: Inductor's
   win is fusion on the device, and these are a few tiny ops;
3. ``compare``: segments of nodes config.fallback names (``airgraph.compare``'s fix, passes/fallback.py) run as
   direct ATen calls, as eager runs them;
4. ``static_kernels``: the kernel library has prebuilt kernels for this segment (airgraph/kernels);
5. ``tuning``: the tuning bank has a measured choice for this segment (airgraph/tuning);
6. ``config``: ``config.kernel_backend``.

The answer is an :class:`Impl`: the kernel backend's name (lowering/backends.py), its parameters, and who chose
it (``chosen_by``, one of :data:`CHOSEN_BY`), which every segment report carries. Steps 4 and 5 ask the
stores the backend was given (``GraphRequest.static_kernels``, ``GraphRequest.tuning``); with none they answer no.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airgraph.graph.meta import COMPARE, FALLBACK, HOST

if TYPE_CHECKING:
    import torch

    from airgraph.config import CompilerConfig
    from airgraph.graph.program import Segment

__all__ = ["CHOSEN_BY", "STEPS", "GraphRequest", "Impl", "ImplSource", "choose"]

CHOSEN_BY = ("debug", "host", "compare", "static_kernels", "tuning", "config")


@dataclass(frozen=True)
class Impl:
    """What runs a segment: a kernel backend, its parameters, and which step of the seam chose it."""

    backend: str
    chosen_by: str
    options: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"inductor_config": {"freezing": True}}
    # What the deciding store knows it by (a tuning bank entry's key, the static kernels' keys), for reports.
    source: Mapping[str, Any] = field(default_factory=dict)


class ImplSource(Protocol):
    """A store that can answer the seam for a segment: the kernel library, the tuning bank."""

    def lookup(self, segment: Segment, request: GraphRequest) -> Impl | None: ...


@dataclass
class GraphRequest:
    """What is being compiled: one ATen graph's kind, device and config, shared by all its segments."""

    kind: str  # "inference", "forward" or "backward"
    device: torch.device
    config: CompilerConfig
    static_kernels: ImplSource | None = None
    tuning: ImplSource | None = None


def _debug(segment: Segment, request: GraphRequest) -> Impl | None:
    return Impl("interpreter", "debug") if request.config.debug.run_eagerly else None


def _host(segment: Segment, request: GraphRequest) -> Impl | None:
    return Impl("aten", "host") if segment.placement == HOST else None


def _compare(segment: Segment, request: GraphRequest) -> Impl | None:
    named = bool(segment.nodes) and all(node.meta.get(FALLBACK) == COMPARE for node in segment.nodes)
    return Impl("aten", "compare") if named else None


def _static_kernels(segment: Segment, request: GraphRequest) -> Impl | None:
    return request.static_kernels.lookup(segment, request) if request.static_kernels is not None else None


def _tuning(segment: Segment, request: GraphRequest) -> Impl | None:
    return request.tuning.lookup(segment, request) if request.tuning is not None else None


def _config(segment: Segment, request: GraphRequest) -> Impl | None:
    return Impl(request.config.kernel_backend, "config")


STEPS: list[tuple[str, Callable[[Segment, GraphRequest], Impl | None]]] = [
    ("debug", _debug),
    ("host", _host),
    ("compare", _compare),
    ("static_kernels", _static_kernels),
    ("tuning", _tuning),
    ("config", _config),
]


def choose(segment: Segment, request: GraphRequest) -> Impl:
    """The implementation of a compute segment: the first step of :data:`STEPS` that answers."""
    for name, step in STEPS:
        impl = step(segment, request)
        if impl is not None:
            if impl.chosen_by != name:
                raise AssertionError(f"the seam's {name!r} step answered as {impl.chosen_by!r}")
            return impl
    raise AssertionError("the seam's last step always answers")
