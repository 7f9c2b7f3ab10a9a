"""The torch.compile entry: Dynamo graph -> AOTAutograd -> pass pipeline -> segments -> executor.

``get_backend(config)`` returns an :class:`AirgraphBackend`; ``torch.compile(model, backend="airgraph")``
reaches :func:`airgraph_backend` through the ``torch_dynamo_backends`` entry point.

AOTAutograd turns each Dynamo graph into functional ATen graphs: one inference graph, or a forward and
a backward graph for training. Each of those goes through :meth:`AirgraphBackend.compile_graph`:

1. the pass pipeline (airgraph/passes) edits and annotates the graph;
2. the graph is partitioned into segments (runs of nodes sharing placement and stream);
3. each segment is lowered by the configured kernel backend (Inductor or direct ATen calls);
4. the executor runs the segments in order; in reduce-overhead on CUDA, ``GraphCapture`` records and
   replays the executor's run as CUDA graphs (host work split off around the replay: runtime/capture.py).

``plan_only=True`` (what ``airgraph.explain`` uses for fake inputs, e.g. ``device="cuda"`` tensors faked on a
machine without a GPU) runs steps 1 and 2 and names each segment's kernel backend, but lowers nothing and
captures nothing: the compiled callable runs the ATen graph on the fake inputs, so no kernel is generated or
launched, and every report is marked ``planned``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from airgraph.config import CompilerConfig
from airgraph.lowering import Layouts, backend_for, lower_segments, partition
from airgraph.lowering.partition import HOST
from airgraph.passes import CompileContext, run_pipeline
from airgraph.passes.base import mutated_nodes, target_name
from airgraph.report import GraphReport, NodeReport, SegmentReport, next_graph_id
from airgraph.runtime.capture import GraphCapture, MemoryPool, find_uncapturable, views_of_inputs
from airgraph.runtime.device import CUDA
from airgraph.runtime.executor import build_executor
from airgraph.runtime.host import build_host_split, describe_host_split

__all__ = ["AirgraphBackend", "airgraph_backend", "get_backend"]

log = logging.getLogger("airgraph")


class AirgraphBackend:
    """A torch.compile backend. Holds its own copy of the config and a report per compiled ATen graph."""

    def __init__(
        self, compiler_config: CompilerConfig | None = None, *, plan_only: bool = False, runtime: Any = None
    ) -> None:
        """``runtime`` (tests): a device runtime that runs CPU graphs as if they were CUDA graphs, with side
        streams and capture (``airgraph.runtime.simulated.SimulatedCuda``); None: CUDA graphs use CUDA."""
        if compiler_config is not None and not isinstance(compiler_config, CompilerConfig):
            raise TypeError(
                f"compiler_config must be an airgraph.CompilerConfig, not {type(compiler_config).__name__}; "
                "create one with airgraph.CompilerConfig() and set its options"
            )
        self.config = copy.deepcopy(compiler_config) if compiler_config is not None else CompilerConfig()
        self.reports: list[GraphReport] = []
        self.plan_only = plan_only
        self.dynamo_graphs = 0
        self.runtime = runtime
        self._pool = MemoryPool(runtime or CUDA)
        self._cpu_capture_noted = False

    def __repr__(self) -> str:
        return f"AirgraphBackend(mode={self.config.mode!r}, kernel_backend={self.config.kernel_backend!r})"

    # -- Dynamo entry ------------------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        dynamo_graph = self.dynamo_graphs
        self.dynamo_graphs += 1
        compile_as = functools.partial(self.compile_graph, dynamo_graph=dynamo_graph)
        if self.config.kernel_backend == "inductor":
            from torch._functorch.partitioners import min_cut_rematerialization_partition
            from torch._inductor.decomposition import select_decomp_table

            # Some of Inductor's decompositions ask its lowering module whether to decompose (max_pool2d with
            # indices): imported by Inductor itself before it traces, so here too.
            importlib.import_module("torch._inductor.lowering")
            decompositions = select_decomp_table()
            partition_fn = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
        else:
            from torch._functorch.partitioners import default_partition

            decompositions, partition_fn = {}, default_partition
        aot = aot_autograd(
            fw_compiler=functools.partial(compile_as, kind="forward"),
            bw_compiler=functools.partial(compile_as, kind="backward"),
            inference_compiler=functools.partial(compile_as, kind="inference"),
            decompositions=decompositions,
            partition_fn=partition_fn,
            keep_inference_input_mutations=self.config.experimental_config.keep_inference_input_mutations,
        )
        return aot(gm, example_inputs, **kwargs)

    # -- one ATen graph ----------------------------------------------------------------------------------
    def compile_graph(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], *, kind: str, dynamo_graph: int = 0
    ) -> Callable[[list], Any]:
        start = time.perf_counter()
        config = self.config
        device = graph_device(gm, example_inputs)
        report = GraphReport(
            id=next_graph_id(),
            mode=config.mode,
            kind=kind,
            device=str(device),
            dynamo_graph=dynamo_graph,
            planned=self.plan_only,
        )
        ctx = CompileContext(config=config, report=report, kind=kind, device=device, example_inputs=example_inputs)
        report.passes = run_pipeline(gm, ctx)

        runtime = self._runtime_for(device)
        segments = partition(gm, streams=runtime is not None)
        placeholders = gm.graph.find_nodes(op="placeholder")
        outputs = list(gm.graph.find_nodes(op="output")[0].args[0])
        layouts = Layouts(placeholders, example_inputs)  # the strides values really have (lowering/layouts.py)
        requested = "interpreter" if config.debug.run_eagerly else config.kernel_backend
        split, uncapturable = self._plan_capture(gm, device, report)
        if self.plan_only or split:  # name the backends; this partition is not lowered
            for seg in segments:
                seg.backend = seg.kind if seg.kind != "compute" else backend_for(seg, requested)
        if self.plan_only:
            run = _planned_run(gm)
        elif split:  # reduce-overhead with host work: lowered piecewise, host work around the replay
            run = build_host_split(gm, requested, kind=kind, priorities=report.stream_priorities)
            layouts.report(outputs)
        else:
            lower_segments(segments, requested, kind=kind, placeholders=placeholders, layouts=layouts)
            run = build_executor(gm, segments, device, runtime=runtime, priorities=report.stream_priorities)
            layouts.report(outputs)
        if config.mode == "reduce-overhead" and not self.plan_only:
            run = self._capture(run, gm, device, kind, report, uncapturable)
        report.nodes = [
            NodeReport(
                name=node.name,
                target=target_name(node),
                stream=node.meta.get("stream"),
                placement=node.meta.get("placement", "device"),
                segment=node.meta.get("segment"),
                device=str(val.device) if isinstance(val := node.meta.get("val"), torch.Tensor) else None,
            )
            for node in gm.graph.nodes
        ]
        report.segments = [
            SegmentReport(id=s.id, stream=s.stream, placement=s.placement, backend=s.backend, num_nodes=len(s.nodes))
            for s in segments
        ]
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return run

    def _plan_capture(
        self, gm: torch.fx.GraphModule, device: torch.device, report: GraphReport
    ) -> tuple[bool, str | None]:
        """reduce-overhead: whether host work is split off around the CUDA graph replay (runtime/capture.py),
        and why the graph cannot be captured (None when it can; computed once, used by ``_capture`` too).

        When planning, also records what capture would do: why the graph would run uncaptured, if it would.
        """
        if self.config.mode != "reduce-overhead":
            return False, None
        if device.type == "cpu" and self.runtime is not None and not self.plan_only:  # the CUDA simulator
            return False, find_uncapturable(gm, simulated=True)
        if device.type != "cuda":
            if self.plan_only:
                report.uncaptured_reason = f"reduce-overhead captures CUDA graphs; this graph runs on {device.type}"
            return False, None
        reason = find_uncapturable(gm)
        if self.plan_only:
            report.uncaptured_reason = reason
        has_host = any(n.meta.get("placement") == HOST for n in gm.graph.nodes)  # host ops or CPU inputs
        if reason is not None or not has_host:
            return False, reason
        report.host_prologue = describe_host_split(gm)
        return True, reason

    def _capture(
        self,
        run: Callable[[list], Any],
        gm: torch.fx.GraphModule,
        device: torch.device,
        kind: str,
        report: GraphReport,
        uncapturable: str | None,
    ) -> Callable[[list], Any]:
        if self._runtime_for(device) is None:
            report.uncaptured_reason = f"reduce-overhead captures CUDA graphs; this graph runs on {device.type}"
            if not self._cpu_capture_noted:
                self._cpu_capture_noted = True
                log.info("airgraph: reduce-overhead on %s runs the executor uncaptured (CUDA graphs need CUDA)", device)
            return run
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        mutated = mutated_nodes(gm.graph)
        capture = GraphCapture(
            run,
            device=device,
            static_indices=_static_input_indices(kind),
            mutated_indices=[i for i, p in enumerate(placeholders) if p in mutated],
            pool=self._pool,
            capture_limit=self.config.reduce_overhead.capture_limit,
            warmup_iters=self.config.reduce_overhead.warmup_iters,
            report=report,
            uncapturable=uncapturable,
            input_views=views_of_inputs(gm),
        )
        return capture

    def _runtime_for(self, device: torch.device) -> Any:
        """The device runtime a graph on ``device`` runs its streams and captures with, or None (the CPU)."""
        if device.type == "cuda":
            return self.runtime or CUDA
        return self.runtime if device.type == "cpu" else None


def graph_device(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.device:
    """The graph's accelerator device if it touches one, else the CPU."""
    values = [*example_inputs, *(n.meta.get("val") for n in gm.graph.nodes)]
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.device
    return torch.device("cpu")


def _static_input_indices(kind: str) -> list[int]:
    """Parameters and buffers among the graph inputs (AOTAutograd knows; the backward graph has none)."""
    if kind == "backward":
        return []
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    return list(getattr(metadata, "static_input_indices", None) or [])


def _planned_run(gm: torch.fx.GraphModule) -> Callable[[list], Any]:
    """The callable a planned graph returns: fake outputs shaped like the traced ones, in the inputs' fake mode.

    Nothing runs, not even the fake kernels (a data-dependent op such as ``.item()`` has no value to give when
    planning); each output is an empty fake tensor with the traced dtype, device and the sizes the traced
    SymInts have for these inputs (1 for a data-dependent size).
    """
    from torch._guards import detect_fake_mode

    outputs = list(gm.graph.nodes)[-1].args[0]
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in outputs]

    def run(args: list) -> Any:
        mode = detect_fake_mode(list(args))
        args.clear()
        if mode is None:
            raise RuntimeError(
                "airgraph: a planned graph (plan_only) runs on fake inputs only; compile with a plain "
                "AirgraphBackend to run on real tensors"
            )
        with mode:
            return [_fake_like(val) for val in vals]

    run._boxed_call = True
    return run


def _fake_like(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        sizes = [_hint(s) for s in val.shape]
        strides = [_hint(s) for s in val.stride()]
        return torch.empty_strided(sizes, strides, dtype=val.dtype, device=val.device)
    return _hint(val)


def _hint(value: Any) -> Any:
    """A SymInt's value for the inputs it was traced from (1 when data-dependent); other values unchanged."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 1
    return value


def get_backend(compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """A torch.compile backend configured by ``compiler_config`` (a copy is taken)."""
    return AirgraphBackend(compiler_config)


def airgraph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(model, backend="airgraph")``: the default configuration."""
    return AirgraphBackend()(gm, example_inputs, **kwargs)
