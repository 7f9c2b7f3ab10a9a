"""Lowering a segment with the tuning bank's options: operator choices and frozen weights.

The kernel backends (lowering/backends.py) hand a request whose options carry either to :func:`lower_tuned`,
which rewrites the segment's graph, lowers it with the backend's own function and adapts the result:

- ``op_choices`` (operator tuning): node name -> choice; the nodes are replaced by their chosen implementations
  (tuning/operators.py), then the backend lowers the graph as usual;
- ``frozen`` (subgraph tuning's "freezing" candidates, inference graphs only): the positions of the segment's
  inputs that are weights (tuning/params.py). On the segment's first call (while a graph compiles its weights are
  fake; the first call has them) those inputs become constants of the graph, Inductor's freezing passes run on it
  (constant folding, weight prepacking: what ``torch._inductor.config.freezing`` does for a whole model) and it is
  compiled, so Inductor can fold transposes, prepack weights and use its C++ GEMM template (which needs constant
  weights). Inductor keeps the traced strides of a graph's outputs, so the layouts reported while compiling hold.
  The segment still receives every input; on each call it checks that the frozen ones have the storage and
  version counter it froze. A weight updated in place or replaced afterwards is seen: a warning, and the segment
  runs unfrozen from then on (compiled on first need). (A CUDA graph replay runs no Python, so reduce-overhead
  does not check: freezing choices come from inference graphs, whose weights the caller does not update.)

Imports no runtime: lowering may call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.utils._python_dispatch import _disable_current_modes

from airgraph.boxed import boxed
from airgraph.lowering import aot
from airgraph.tuning.operators import apply_op_choices

__all__ = ["compiling", "freeze_inputs", "lower_tuned"]

Lower = Callable[[Any], Callable[[list], Any]]  # a kernel backend: (LowerRequest) -> boxed callable


def lower_tuned(request: Any, lower: Lower, *, inductor: bool) -> Callable[[list], Any]:
    """``lower(request)`` for a request with ``op_choices`` and/or ``frozen`` options (see the module docstring);
    ``inductor``: ``lower`` is Inductor's (frozen graphs then go through its freezing passes)."""
    options = dict(request.options)
    choices, frozen = options.pop("op_choices", None), options.pop("frozen", None)
    gm = apply_op_choices(request.gm, choices) if choices else request.gm
    plain = dataclasses.replace(request, gm=gm, options=options)
    if not frozen:
        return lower(plain)
    return _FrozenSegment(plain, lower, frozen, inductor=inductor)


def freeze_inputs(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose placeholders at the positions of ``frozen`` are constants holding those tensors."""
    owner = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    for position, node in enumerate(placeholders):
        if position in frozen:
            name = f"_frozen_{position}"
            owner.register_buffer(name, frozen[position].detach(), persistent=False)
            env[node] = graph.get_attr(name)
        else:
            env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            owner.register_buffer(str(node.target).replace(".", "_"), value, persistent=False)
            env[node] = graph.get_attr(str(node.target).replace(".", "_"))
            env[node].meta = dict(node.meta)
        elif node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(owner, graph, class_name=type(gm).__name__)


def _freezing_passes(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """Inductor's freezing passes (constant folding, weight prepacking) on a graph whose weights are constants,
    outside any enclosing tracing context (whose parameters are the whole graph's, not this segment's)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.freezing import freeze

    with aot.tracing(None), inductor_config.patch({"freezing": True}):
        frozen_gm, _ = freeze(gm, gm, example_inputs)
    return frozen_gm


@contextlib.contextmanager
def compiling(example_inputs: list[Any]) -> Iterator[None]:
    """A tracing context for compiling a segment outside torch.compile's own (after the graph was compiled: a
    tuning candidate, a frozen segment, a fallback), in the fake mode of ``example_inputs``, which meanwhile takes
    real tensors too (a frozen graph's constants); inside a torch.compile, only the latter."""
    mode = detect_fake_mode(example_inputs) or torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
    allow, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True
    try:
        if aot.tracing_active():
            yield
        else:
            with aot.tracing(mode):
                yield
    finally:
        mode.allow_non_fake_inputs = allow


class _FrozenSegment:
    """A boxed callable: the segment with some inputs frozen, compiled on its first call (the weights' real values
    arrive then) and guarded on every call (module docstring)."""

    def __init__(self, request: Any, lower: Lower, frozen: list[int], *, inductor: bool) -> None:
        boxed(self)
        self._request, self._lower, self._inductor = request, lower, inductor
        self._frozen = sorted(frozen)
        self._keep = [i for i in range(len(request.example_inputs)) if i not in set(frozen)]
        self._stamps: list[tuple[int, int]] = []
        self._compiled: Callable[[list], Any] | None = None
        self._unfrozen: Callable[[list], Any] | None = None

    def __call__(self, args: list) -> Any:
        if self._unfrozen is None:
            if self._compiled is None:
                self._freeze(args)
            if self._compiled is not None and self._still_frozen(args):
                kept = [args[i] for i in self._keep]
                args.clear()
                return self._compiled(kept)
        return self._fallback()(args)

    def _freeze(self, args: list) -> None:
        request = self._request
        values = {i: args[i] for i in self._frozen}
        gm = freeze_inputs(request.gm, values)
        kept_inputs = [request.example_inputs[i] for i in self._keep]
        try:
            # Compiled during a call: AOTAutograd's first-call dispatch mode (and any mode of the caller's) stays
            # out of it, or Inductor's GEMM autotuning would time ATen's kernels through Python and pick another
            # kernel than the tuner measured.
            with _disable_current_modes(), compiling(request.example_inputs):
                if self._inductor:
                    gm = _freezing_passes(gm, kept_inputs)
                self._compiled = self._lower(dataclasses.replace(request, gm=gm, example_inputs=kept_inputs))
        except Exception as exc:
            warnings.warn(
                f"airgraph: a tuned segment could not be compiled with its weights frozen ({type(exc).__name__}: "
                f"{exc}); it runs unfrozen",
                stacklevel=3,
            )
            self._fallback(warn=False)
            return
        self._stamps = [(values[i].data_ptr(), values[i]._version) for i in self._frozen]

    def _still_frozen(self, args: list) -> bool:
        for position, stamp in zip(self._frozen, self._stamps, strict=True):
            value = args[position]
            if value.data_ptr() != stamp[0] or value._version != stamp[1]:
                return False
        return True

    def _fallback(self, *, warn: bool = True) -> Callable[[list], Any]:
        if self._unfrozen is None:
            if warn:
                warnings.warn(
                    "airgraph: a weight frozen into a tuned segment was updated or replaced; the segment runs "
                    "unfrozen from now on (re-tune, or keep weights fixed after compiling, to run it frozen)",
                    stacklevel=3,
                )
            with compiling(self._request.example_inputs):
                self._unfrozen = self._lower(self._request)
        return self._unfrozen
