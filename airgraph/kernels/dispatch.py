"""What runs a segment the seam's static_kernels step answered for: per input-shape key, a static kernel or the
dynamic one.

:class:`StaticKernelSegment` is the boxed callable the "static_kernels" kernel backend (lowering/backends.py)
returns. Nothing is compiled when it is made. Each call computes a cheap key from the inputs that vary (those
whose traced sizes or strides are symbolic, and SymInts); the first call of a key looks the segment's graph key
and the key's full shape key up in the kernel library (``StaticKernels.load``): a kernel that is installed, built
for this machine and intact runs from then on. Otherwise the segment's dynamic kernel runs: compiled the first
time a key needs it, by the kernel backend the rest of the seam chose (tuning's choice, or
``config.kernel_backend``). A process whose keys are all in the library therefore compiles nothing.

A key that runs dynamic kernels because another process on the node is building its static kernel is looked up
again at most every :data:`RECHECK_SECONDS` until it is installed, and then switches (never while a CUDA graph is
being captured: a captured key keeps replaying what it recorded).

Outputs keep the layouts lowering promised the next segments (the traced strides: lowering/layouts.py): the
first run of each key compares its outputs' strides with those, and an output a kernel laid out otherwise is
copied into the promised layout from then on (Inductor keeps output strides, so this is a safeguard). Outputs that
are Python values (sizes) are constants of a key: a static kernel returns tensors only and they are put back.

The segment's report (``backend.reports``, ``airgraph.explain``) says what ran: "static_kernels" chosen by
"static_kernels" once any key ran a static kernel, otherwise the dynamic kernel's backend and chooser; its
``source`` lists the graph key and the keys that ran each way.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from airgraph.boxed import boxed
from airgraph.kernels.build import outside_compilation, tensor_outputs
from airgraph.kernels.shapes import Bindings, VaryingKey, bind, concrete
from airgraph.lowering import backends
from airgraph.lowering.layouts import propagate, same_layout
from airgraph.lowering.request import LowerRequest

if TYPE_CHECKING:
    from airgraph.lowering.select import Impl

__all__ = ["RECHECK_SECONDS", "LoadedKernel", "StaticKernelSegment"]

RECHECK_SECONDS = 1.0


@dataclasses.dataclass
class LoadedKernel:
    """A static kernel loaded from the library: ``run(tensors) -> tensor outputs`` (boxed: the list is taken)."""

    kid: str
    run: Callable[[list], list]
    model: Any  # what keeps the loaded code alive


class KernelSource(Protocol):
    """What a segment asks its library (kernels/static.py's StaticKernels)."""

    def load(self, graph_key: str, sid: str, device: torch.device) -> LoadedKernel | None: ...

    def building_elsewhere(self, graph_key: str, sid: str) -> bool: ...


class StaticKernelSegment:
    """A segment's callable: a static kernel per shape key from the library, else its dynamic kernel (lazily)."""

    def __init__(self, source: KernelSource, request: LowerRequest, fallback: Impl, graph_key: str) -> None:
        boxed(self)
        self.source, self.request, self.fallback, self.graph_key = source, request, fallback, graph_key
        inputs = request.example_inputs
        self.varying = VaryingKey(inputs)
        self._key = self.varying.key
        self._tensors = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        gm = request.gm
        self._tensor_outputs = tensor_outputs(gm)
        self._expected = _expected_outputs(gm, inputs)
        self._runs: dict[tuple, Callable[[list], Any]] = {}
        self._waiting: set[tuple] = set()
        self._next_check = 0.0
        self._dynamic: Callable[[list], Any] | None = None
        self.static_keys: dict[str, str] = {}  # label -> shape id, keys that ran a static kernel
        self.dynamic_keys: dict[str, str] = {}
        self._report: tuple[Any, int] | None = None

    def __repr__(self) -> str:
        return f"StaticKernelSegment(graph {self.graph_key[:12]}, {len(self.static_keys)} static key(s))"

    # -- calls -------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> Any:
        key = self._key(args)
        run = self._runs.get(key)
        if run is None or (self._waiting and key in self._waiting):
            run = self._resolve(key, args)
        return run(args)

    def _resolve(self, key: tuple, args: list) -> Callable[[list], Any]:
        if key in self._waiting:  # running dynamic kernels while another process builds the static one
            now = time.monotonic()
            if now < self._next_check or self._capturing():
                return self._runs[key]
            self._next_check = now + RECHECK_SECONDS
        sid, label = self.varying.shape_id_of(args), self.varying.label(args)
        bindings = bind(self.request.example_inputs, args)
        kernel = self.source.load(self.graph_key, sid, self.request.device)
        if kernel is not None:
            run = self._static(kernel, bindings)
            self._waiting.discard(key)
            self.dynamic_keys.pop(label, None)
            self.static_keys[label] = sid
        else:
            if key not in self._runs and self.source.building_elsewhere(self.graph_key, sid):
                self._waiting.add(key)
            run = self._dynamic_kernel()
            self.dynamic_keys[label] = sid
        self._update_report()
        self._runs[key] = checked = self._first_run(key, run, bindings)
        return checked

    def _capturing(self) -> bool:
        return self.request.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _static(self, kernel: LoadedKernel, bindings: Bindings) -> Callable[[list], Any]:
        tensors, run_kernel = self._tensors, kernel.run
        positions = self._tensor_outputs
        count = len(self._expected)
        if len(positions) == count:

            def run(args: list) -> Any:
                inputs = [args[i] for i in tensors]
                args.clear()
                return run_kernel(inputs)

            return run
        constants = [concrete(v, bindings) for v in self._expected]  # sizes computed from the key

        def run_with_values(args: list) -> Any:
            inputs = [args[i] for i in tensors]
            args.clear()
            outputs = list(constants)
            for position, value in zip(positions, run_kernel(inputs), strict=True):
                outputs[position] = value
            return outputs

        return run_with_values

    def _dynamic_kernel(self) -> Callable[[list], Any]:
        if self._dynamic is None:
            lower = backends.get(self.fallback.backend)
            with outside_compilation():
                self._dynamic = lower(dataclasses.replace(self.request, options=self.fallback.options))
        return self._dynamic

    def _first_run(self, key: tuple, run: Callable[[list], Any], bindings: Bindings) -> Callable[[list], Any]:
        """``run``, checking on its first call that outputs have the promised layouts (module docstring)."""

        def first(args: list) -> Any:
            outputs = run(args)
            fixes = self._layout_fixes(outputs, bindings)
            if not fixes:
                self._runs[key] = run
                return outputs
            self._runs[key] = _restriding(run, fixes)
            return _restride(outputs, fixes)

        return first

    def _layout_fixes(self, outputs: Any, bindings: Bindings) -> dict[int, tuple[list, list]]:
        fixes = {}
        for i, (out, expected) in enumerate(zip(outputs, self._expected, strict=True)):
            if not isinstance(out, torch.Tensor) or not isinstance(expected, torch.Tensor) or out.numel() <= 1:
                continue
            shape = [concrete(d, bindings) for d in expected.shape]
            stride = [concrete(d, bindings) for d in expected.stride()]
            if None not in stride and None not in shape and list(out.stride()) != stride:
                fixes[i] = (shape, stride)
        return fixes

    # -- reports -----------------------------------------------------------------------------------------
    def label(self, specs: list[dict[str, Any]]) -> str:
        """The label of a key given as specs (kernels/shapes.py), as the reports list the keys that ran."""
        return self.varying.spec_label(specs)

    def attach(self, report: Any, index: int) -> None:
        """Keep ``report.segments[index]`` (a GraphReport's, filled after lowering) saying what ran."""
        self._report = (report, index)

    def _update_report(self) -> None:
        if self._report is None:
            return
        report, index = self._report
        if index >= len(report.segments):
            return
        segment = report.segments[index]
        if self.static_keys:
            segment.backend, segment.chosen_by = "static_kernels", "static_kernels"
        else:
            segment.backend, segment.chosen_by = self.fallback.backend, self.fallback.chosen_by
        segment.source = {
            "graph_key": self.graph_key,
            "static_keys": sorted(self.static_keys),
            "dynamic_keys": sorted(self.dynamic_keys),
        }


def _expected_outputs(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[Any]:
    """The (symbolic) values the segment's outputs must have: traced, or propagated through the graph's own ops
    when an input's layout differs from the traced one (what lowering/layouts.py told the next segments)."""
    traced = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    if not all(same_layout(a, b) for a, b in zip(inputs, traced, strict=True)):
        propagated = propagate(gm, inputs)
        if propagated is not None:
            return propagated
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    return [o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in outputs]


def _restride(outputs: Any, fixes: dict[int, tuple[list, list]]) -> list[Any]:
    outputs = list(outputs)
    for i, (shape, stride) in fixes.items():
        out = outputs[i]
        outputs[i] = torch.empty_strided(shape, stride, dtype=out.dtype, device=out.device).copy_(out)
    return outputs


def _restriding(run: Callable[[list], Any], fixes: dict[int, tuple[list, list]]) -> Callable[[list], Any]:
    def restrided(args: list) -> Any:
        return _restride(run(args), fixes)

    return restrided
