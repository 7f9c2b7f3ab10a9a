"""What a compare run keeps of each ATen graph airgraph compiled: its report, its segments and the real inputs
of its last call.

:class:`Recorder` attaches to an :class:`~airgraph.backend.AirgraphBackend` without changing what it compiles: it
wraps the instance's ``compile_graph`` (AOTAutograd calls it through the instance) and adds a shape-key observer
factory that keeps the segments and answers no observer. Inputs are copied with their storage, so strides and
offsets stay those the compiled segments saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.graph.program import Segment
from airgraph.report.schema import GraphReport

__all__ = ["RecordedGraph", "Recorder", "copy_value"]


@dataclass
class RecordedGraph:
    """One compiled ATen graph: its report, its segments (lowered) and the inputs of its last call."""

    report: GraphReport
    segments: list[Segment]
    inputs: list[Any] | None = None
    calls: int = 0

    @property
    def name(self) -> str:
        return f"{self.report.kind} graph {self.report.id}"


@dataclass
class Recorder:
    graphs: list[RecordedGraph] = field(default_factory=list)
    outcome: Any = None  # a trial's compiled outputs and gradients (precision/before.py), for the dumps
    _pending: list[tuple[GraphReport, list[Segment]]] = field(default_factory=list)

    def attach(self, backend: Any) -> None:
        compile_graph = backend.compile_graph

        def recording(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[[list], Any]:
            run = compile_graph(gm, example_inputs, **kwargs)
            if not self._pending:  # nothing lowered (a planned graph)
                return run
            report, segments = self._pending.pop()
            graph = RecordedGraph(report, segments)
            self.graphs.append(graph)

            def call(args: list) -> Any:
                graph.inputs = [copy_value(a) for a in args]
                graph.calls += 1
                return run(args)

            return boxed(call)

        backend.compile_graph = recording
        backend.shape_observers.append(self._observe)

    def _observe(self, report: GraphReport, segments: list[Segment]) -> None:
        self._pending.append((report, segments))
        return None


def copy_value(value: Any) -> Any:
    """A tensor's copy with its own storage and the same sizes, strides and offset; other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach()
    storage = value.untyped_storage().clone()
    out = torch.empty(0, dtype=value.dtype, device=value.device)
    return out.set_(storage, value.storage_offset(), value.size(), value.stride())
