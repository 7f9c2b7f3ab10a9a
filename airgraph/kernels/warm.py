"""Warm start: a Dynamo graph whose static kernels are all installed runs them without AOTAutograd or lowering.

Where a Dynamo graph's ATen graph is one static-kernel segment, a later process can skip AOTAutograd's trace
(the design, and why: docs/design/compile.md, "Warm starts"):

- **recorded** by the process that built the kernels (:func:`graph_record`): an inference graph whose single
  segment reads only graph inputs and returns the graph's outputs in order, with nothing left to AOTAutograd's
  runtime wrappers (lowering/aot.py); the package says which Dynamo graph the kernels serve and which inputs
  they read. A restart Dynamo made (``TensorifyScalarRestartAnalysis``) is recorded too, and asked for before
  Dynamo's first trace (:func:`prespecialize`; at once, where that trace came first);
- **used** by a later process (:func:`warm_start`, before AOTAutograd): on the CPU, without autograd, for a
  recorded graph whose current shape key has a kernel that runs here, a :class:`WarmGraph` calls the kernels
  directly, guarded on the installed keys' symbol values; other shapes compile again on the ordinary path.

Invariants: never on CUDA or the simulator (the ordinary path captures the kernels there); a damaged or missing
key is left out of the guard so that it is built again; a kernel that cannot be loaded runs the Dynamo graph
eagerly, with a warning; a warm graph writes no shape records; its report has one segment, ``chosen_by:
static_kernels``, with ``warm_start`` in its source.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import warnings
from typing import TYPE_CHECKING, Any, Protocol

import torch

from airgraph.config import CompilerConfig
from airgraph.kernels import package as pkg
from airgraph.kernels.shapes import VaryingKey, shape_id
from airgraph.lowering import aot
from airgraph.lowering.keys import graph_key

if TYPE_CHECKING:
    from airgraph.graph.program import Segment
    from airgraph.kernels.dispatch import LoadedKernel


class StaticKernels(Protocol):
    """What a warm start asks of the library (kernels/static.py's StaticKernels)."""

    config: CompilerConfig
    current: tuple[str, int] | None
    builds: bool

    def graph_records(self) -> dict[str, dict]: ...

    def entries(self, graph_key: str) -> list[dict[str, Any]]: ...

    def damaged(self, graph_key: str) -> list[str]: ...

    def load(self, graph_key: str, sid: str, device: torch.device) -> LoadedKernel | None: ...


__all__ = ["WarmGraph", "dynamo_key", "graph_record", "prespecialize", "restarted_floats", "warm_start"]

try:  # how AOTAutograd makes Dynamo trace again with Python floats specialized (the same in torch 2.11 to 2.13)
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import TensorifyState
except ImportError:  # pragma: no cover - a torch without them: no shortcut, the ordinary path
    TensorifyScalarRestartAnalysis = TensorifyState = None  # type: ignore[assignment, misc]


def restarted_floats() -> list[str]:
    """The float symbols AOTAutograd asked Dynamo to specialize while compiling this frame (it raised
    ``TensorifyScalarRestartAnalysis``; Dynamo traced the frame again)."""
    return sorted(getattr(TensorifyState, "force_specializations", ()) or ())


def prespecialize(records: dict[str, dict]) -> list[str]:
    """Ask Dynamo, before it traces anything, for the float specializations the library's graphs restarted for (the
    ``restart`` records): its first trace of such a frame is then the specialized graph, which warm-starts, instead
    of a trace that :func:`_restart` throws away (a whole Dynamo trace, most of a warm start's compile). Dynamo keeps
    these names for the rest of the process after a restart anyway (``TensorifyState`` is cleared only by another
    kind of restart and by ``torch._dynamo.reset``), so this is the state a cold process ends in. Returns the names."""
    if TensorifyState is None:
        return []
    names = sorted({name for record in records.values() for name in record.get("restart", ())})
    for name in names:
        TensorifyState.specialize(name)
    return names


def _restart(names: list[str], gm: torch.fx.GraphModule) -> None:
    """Make Dynamo trace again with these floats specialized, as AOTAutograd did for this graph in the process that
    recorded it (module docstring), without tracing it through AOTAutograd first. The floats are the graph's
    SymFloats (a module's float attribute is a 0-d tensor input whose ``item()`` the graph takes)."""
    values = (n.meta.get("example_value") for n in gm.graph.nodes)
    floats = {str(v.node.expr) for v in values if isinstance(v, torch.SymFloat)}
    if TensorifyState is None or not names or not set(names) <= floats:
        return
    for name in names:
        TensorifyState.specialize(name)
    raise TensorifyScalarRestartAnalysis


def dynamo_key(gm: torch.fx.GraphModule, config: CompilerConfig) -> str:
    """A Dynamo graph's key for warm starts: its graph key and the options that shape its compilation (all but the
    static kernels' own and debugging ones)."""
    options = {k: v for k, v in config.as_dict().items() if k not in ("static_kernels", "debug", "trusted_folders")}
    text = graph_key(gm) + json.dumps(options, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def graph_record(current: tuple[str, int] | None, segments: list[Segment]) -> dict[str, Any] | None:
    """How the Dynamo graph being compiled (``current``: its warm-start key and number of inputs) is served by its one
    segment's kernels: ``{"graph_key": the segment's, "inputs": the graph inputs it reads, its order}``, when its
    ATen graph qualifies for warm starts (module docstring); called while AOTAutograd compiles it (its metadata is
    in the tracing context). None when it does not qualify."""
    if current is None or len(segments) != 1 or segments[0].sync or segments[0].gm is None:
        return None
    (segment,) = segments
    graph = segment.nodes[0].graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    outputs = list(graph.find_nodes(op="output")[0].args[0])
    if segment.outputs != outputs or len(set(outputs)) != len(outputs):
        return None
    if any(not isinstance(o, torch.fx.Node) or not isinstance(o.meta.get("val"), torch.Tensor) for o in outputs):
        return None
    position = {node: i for i, node in enumerate(placeholders)}
    inputs = [position.get(node, -1) for node in segment.inputs]
    if -1 in inputs:  # the segment reads graph inputs only (in the order it first uses them)
        return None
    if not aot.no_runtime_wrappers(current[1]) or len(placeholders) != current[1]:
        return None
    key = getattr(segment.compiled, "graph_key", None)
    return {"graph_key": key, "inputs": inputs} if key is not None else None


def _hint(value: Any) -> Any:
    """The value a traced size has in this call (None when it is data-dependent); tensors: (sizes, strides)."""
    if isinstance(value, torch.SymInt):
        return value.node.hint
    if isinstance(value, torch.Tensor):
        dims = tuple(_hint(d) for d in value.shape), tuple(_hint(d) for d in value.stride())
        return None if None in dims[0] + dims[1] else dims
    return value


def _symbols(example_inputs: list[Any]) -> list[tuple[int, int | None, torch.SymInt]]:
    """(input, dim or None for a SymInt input, the SymInt) of every size that is a plain symbol."""
    found = []
    for i, value in enumerate(example_inputs):
        dims = list(enumerate(value.shape)) if isinstance(value, torch.Tensor) else [(None, value)]
        for d, size in dims:
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                found.append((i, d, size))
    return found


def warm_start(kernels: StaticKernels, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> WarmGraph | None:
    """A WarmGraph for this Dynamo graph when the library can serve it (module docstring), else None; either way,
    the graph's warm-start key is left in ``kernels.current`` for the ordinary compile that follows to record."""
    kernels.current = None
    values = [_hint(v) for v in example_inputs]
    devices = {v.device.type for v in example_inputs if isinstance(v, torch.Tensor)}
    grad = torch.is_grad_enabled() and any(getattr(v, "requires_grad", False) for v in example_inputs)
    if devices != {"cpu"} or grad or any(v is None for v in values):
        return None
    key = dynamo_key(gm, kernels.config)
    kernels.current = (key, len(example_inputs))
    record = kernels.graph_records().get(key)
    traced = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    if record is None or len(traced) != len(example_inputs):
        return None
    if "restart" in record:
        _restart(record["restart"], gm)
        return None
    segment_key, positions = record["graph_key"], record["inputs"]
    if any(p >= len(example_inputs) for p in positions):
        return None
    inputs = [traced[p] for p in positions]  # Dynamo hands its backend real inputs; traced values are its nodes'
    concrete = tuple(
        (str(v.dtype).removeprefix("torch."), *values[p]) if isinstance(v, torch.Tensor) else values[p]
        for p, v in zip(positions, inputs, strict=True)
    )
    damaged = set(kernels.damaged(segment_key)) if kernels.builds else set()
    if pkg.kernel_id(segment_key, shape_id(concrete)) in damaged:  # the ordinary compile builds it again
        return None
    if kernels.load(segment_key, shape_id(concrete), torch.device("cpu")) is None:
        return None
    symbols = _symbols(inputs)
    choices = []  # per installed key of this graph: the value of each symbol
    for entry in kernels.entries(segment_key):
        if pkg.kernel_id(entry["graph_key"], entry["shape_id"]) in damaged:
            continue  # not guarded in: its shapes compile the ordinary way, which builds it again
        spec = entry["shape_key"]
        if len(spec) == len(concrete):
            choice = [spec[i][1][d] if d is not None else spec[i] for i, d, _ in symbols]
            if all(isinstance(c, int) for c in choice):
                choices.append(choice)
    if symbols:  # guard: other shapes recompile the graph (the ordinary path); these stay here
        terms = [
            functools.reduce(operator.and_, [s == c for (_, _, s), c in zip(symbols, choice, strict=True)])
            for choice in choices
        ]
        if not terms or not bool(functools.reduce(operator.or_, terms)):
            return None
    return WarmGraph(kernels, gm, segment_key, key, traced, positions)


class WarmGraph:
    """The compiled Dynamo graph of a warm start: per shape key, the installed static kernel.

    ``source`` is what its report's one segment says (the backend makes the report); it lists the keys run."""

    def __init__(
        self,
        kernels: StaticKernels,
        gm: torch.fx.GraphModule,
        segment_key: str,
        key: str,
        traced: list,
        positions: list[int],
    ) -> None:
        """``traced``: the graph's inputs as traced (symbolic sizes show what varies); ``positions``: those the
        segment's kernels read, in order."""
        self.kernels, self.gm, self.segment_key, self.positions = kernels, gm, segment_key, positions
        self.tensors = [p for p in positions if isinstance(traced[p], torch.Tensor)]
        self.varying = VaryingKey(traced, positions)
        self._key = self.varying.key
        self.runs: dict[tuple, Any] = {}
        self.source: dict[str, Any] = {
            "graph_key": segment_key,
            "static_keys": [],
            "dynamic_keys": [],
            "warm_start": key,
        }
        self.num_nodes = len(gm.graph.nodes)

    def __call__(self, *args: Any) -> Any:
        key = self._key(args)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = self._resolve(args)
        return run(args)

    def _resolve(self, args: tuple) -> Any:
        sid = self.varying.shape_id_of(args)
        kernel = self.kernels.load(self.segment_key, sid, torch.device("cpu"))
        if kernel is None:
            warnings.warn(
                f"airgraph: static kernel {pkg.kernel_id(self.segment_key, sid)} of a warm-started graph cannot be "
                "loaded; this shape runs the Dynamo graph eagerly",
                stacklevel=3,
            )
            return lambda a: self.gm(*a)
        self.source["static_keys"] = sorted({*self.source["static_keys"], self.varying.label(args)})
        tensors, run_kernel = self.tensors, kernel.run
        return lambda a: run_kernel([a[i] for i in tensors])
