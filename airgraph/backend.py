"""The torch.compile entry: Dynamo graph -> AOTAutograd -> passes -> partition -> choose -> lower -> executor
-> capture.

``get_backend(config)`` returns an :class:`AirgraphBackend`; ``torch.compile(model, backend="airgraph")``
reaches :func:`airgraph_backend` through the ``torch_dynamo_backends`` entry point.

AOTAutograd turns each Dynamo graph into functional ATen graphs: one inference graph, or a forward and
a backward graph for training. With Inductor kernels (the default), Inductor's own graph passes run where
torch.compile runs them (lowering/inductor_passes.py): pre-grad on the Dynamo graph, joint-graph before the
partitioner splits a training graph, or first thing on an inference graph. Each ATen graph goes through
:meth:`AirgraphBackend.compile_graph`, which reads top to bottom:

1. passes (airgraph/passes): the pipeline edits and annotates the graph (streams, host placement, ...);
2. capture plan (lowering/capture_plan.py): in reduce-overhead, whether the graph can be captured and, when it
   has host work, how that work splits off around the replay (the host plan); made once and handed on;
3. host split (lowering/host_split.py), only with a host plan: the host work is lowered as a prologue around the
   replay and the rest becomes the device program, which steps 4 to 7 compile as they compile any graph;
4. partition (lowering/partition.py): segments, runs of nodes sharing placement and stream;
5. choose and lower (lowering/select.py, the seam; lowering/lower.py): each segment's implementation and who
   chose it, compiled by its kernel backend for the strides its inputs really have;
6. executor (runtime/executor.py): the segments in order, on their streams; with ``config.tuning.mode`` set, the
   graph's first run tunes its segments or operators into the tuning bank and re-lowers them (airgraph/tuning);
   with a host split, runtime/host.py runs the prologue around it;
7. capture (runtime/capture.py): in reduce-overhead, ``GraphCapture`` records and replays the executor's run as
   CUDA graphs, one per input-shape key.

``plan_only=True`` (what ``airgraph.explain`` uses for fake inputs, e.g. ``device="cuda"`` tensors faked on a
machine without a GPU) runs steps 1, 2 and 4 and chooses, but lowers nothing and captures nothing: the compiled
callable returns fake outputs shaped like the traced ones, so no kernel is generated or launched, and every report
is ``planned``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import time
from collections.abc import Callable
from typing import Any

import torch

from airgraph.boxed import boxed
from airgraph.config import CompilerConfig
from airgraph.graph.analysis import mutated_nodes, target_name, views_of_inputs
from airgraph.graph.meta import SEGMENT, STREAM, placement
from airgraph.graph.program import Segment
from airgraph.kernels.static import StaticKernels
from airgraph.kernels.warm import WarmGraph
from airgraph.log import warn_once
from airgraph.lowering import inductor_passes
from airgraph.lowering.capture_plan import CapturePlan, plan_capture
from airgraph.lowering.host_split import split_host_work
from airgraph.lowering.layouts import Layouts
from airgraph.lowering.lower import lower_segments
from airgraph.lowering.partition import partition
from airgraph.lowering.select import GraphRequest, ImplSource, choose
from airgraph.passes import CompileContext, run_pipeline
from airgraph.report.schema import GraphReport, NodeReport, SegmentReport, next_graph_id
from airgraph.runtime.capture import GraphCapture, MemoryPool, ObservedRun, ShapeKeyObserver
from airgraph.runtime.device import DeviceRuntime, runtime_for
from airgraph.runtime.executor import build_executor
from airgraph.runtime.fastpath import Direct, FastPath
from airgraph.runtime.host import HostSplit
from airgraph.tuning.source import BankSource
from airgraph.tuning.tuner import Tuner

__all__ = ["AirgraphBackend", "airgraph_backend", "compile_model", "get_backend"]


class AirgraphBackend:
    """A torch.compile backend. Holds its own copy of the config and a report per compiled ATen graph."""

    def __init__(
        self,
        compiler_config: CompilerConfig | None = None,
        *,
        plan_only: bool = False,
        runtime: DeviceRuntime | None = None,
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
        # The seam's stores (lowering/select.py): the installed static kernels and the tuning bank, when in use.
        self.static_kernels: ImplSource | None = None
        self.tuning: ImplSource | None = BankSource(self.config)
        # config.tuning.mode: each graph's first run tunes it (airgraph/tuning/tuner.py), then it runs tuned.
        self.tuner: Tuner | None = Tuner(self.config) if self.config.tuning.mode and not plan_only else None
        # Told of each new input-shape key of each compiled graph (static kernels record shapes there).
        self.shape_observers: list[Callable[[GraphReport, list[Segment]], ShapeKeyObserver | None]] = []
        if self.config.static_kernels.enabled:  # seed 000: airgraph/kernels
            self.static_kernels = StaticKernels(self.config)
            self.shape_observers.append(self.static_kernels.observer)
        self._pool = MemoryPool(runtime_for(torch.device("cuda"), runtime))
        self.direct = False  # wrap each compiled graph in fastpath.Direct (compile_model(..., fast_path=True))

    def __repr__(self) -> str:
        return f"AirgraphBackend(mode={self.config.mode!r}, kernel_backend={self.config.kernel_backend!r})"

    # -- Dynamo entry ------------------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        dynamo_graph = self.dynamo_graphs
        self.dynamo_graphs += 1
        kernels = self.static_kernels
        if isinstance(kernels, StaticKernels) and not self.plan_only and self.runtime is None:  # kernels/warm.py
            warm = kernels.warm_start(gm, example_inputs)
            if warm is not None:
                self.reports.append(_warm_report(warm, self.config.mode, dynamo_graph))
                return Direct(warm, "inference") if self.direct else warm
        compile_as = functools.partial(self.compile_graph, dynamo_graph=dynamo_graph)
        if self.config.kernel_backend == "inductor":
            from torch._inductor import config as inductor_config
            from torch._inductor.decomposition import select_decomp_table

            # Some of Inductor's decompositions ask its lowering module whether to decompose (max_pool2d with
            # indices): imported by Inductor itself before it traces, so here too.
            importlib.import_module("torch._inductor.lowering")
            # Random ops stay ATen's (lowering/inductor.py: fallback_random): the table without Inductor's
            # "fast random" decompositions, which draw other numbers than eager.
            with inductor_config.patch(fallback_random=True):
                decompositions = select_decomp_table()
            # Inductor's graph passes where torch.compile runs them (lowering/inductor_passes.py): pre-grad on
            # the Dynamo graph; joint-graph passes before the partitioner (and on inference graphs, compile_graph)
            gm = inductor_passes.pre_grad_passes(gm, example_inputs)
            partition_fn = inductor_passes.partition_joint
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
        runtime = runtime_for(device, self.runtime)
        report = GraphReport(
            id=next_graph_id(),
            mode=config.mode,
            kind=kind,
            device=str(device),
            dynamo_graph=dynamo_graph,
            planned=self.plan_only,
        )
        request = GraphRequest(kind, device, config, static_kernels=self.static_kernels, tuning=self.tuning)
        if kind == "inference" and config.kernel_backend == "inductor":
            # Inductor's joint-graph passes, which a training graph got before its partitioner (__call__)
            gm = inductor_passes.inference_passes(gm, example_inputs)
        placeholders = gm.graph.find_nodes(op="placeholder")
        outputs = list(gm.graph.find_nodes(op="output")[0].args[0])
        layouts = Layouts(placeholders, example_inputs)  # the strides values really have (lowering/layouts.py)

        # 1. passes
        ctx = CompileContext(config=config, report=report, kind=kind, device=device, example_inputs=example_inputs)
        report.passes = run_pipeline(gm, ctx)
        # 2. capture plan: made once, handed on
        plan = plan_capture(gm, mode=config.mode, device=device, can_capture=runtime.can_capture)
        report.uncaptured_reason = plan.uncapturable if self.plan_only or not plan.capture else None
        if plan.split:
            report.host_prologue = plan.host.describe()
        # 3. host split: the host work lowered around the replay, and the device program that steps 4-7 compile
        program = split_host_work(gm, plan.host, request) if plan.split and not self.plan_only else None
        graph, graph_layouts, split = gm, layouts, None
        if program is not None:  # the device program: the graph's inputs, then the host values it reads
            graph = program.device_gm
            graph_placeholders = graph.graph.find_nodes(op="placeholder")
            graph_layouts = Layouts(graph_placeholders, [p.meta.get("val") for p in graph_placeholders])
        # 4. partition
        segments = partition(graph, streams=runtime.has_streams)
        if program is not None:
            segments = program.adopt(segments)
        if self.plan_only:  # 5. choose only: nothing is lowered or run
            for seg in segments:
                seg.impl = None if seg.sync else choose(seg, request)
            run = _planned_run(gm)
        else:
            # 5. choose and lower
            device_segments = segments if program is None else program.device_segments
            donors = placeholders if program is None else None  # a backward's donated inputs: the graph's own
            lower_segments(device_segments, request, layouts=graph_layouts, placeholders=donors)
            # 6. executor, tuned on its first run when tuning is on
            run = build_executor(graph, device_segments, device, runtime=runtime, priorities=report.stream_priorities)
            if self.tuner is not None:
                run = self.tuner.wrap(run, graph, device_segments, request, graph_layouts, report, runtime)
            if program is not None:  # the host work around it
                run = split = HostSplit(program, run, runtime)
        layouts.report(outputs)
        # 7. capture (reduce-overhead), or the shape-key observers of an uncaptured run
        observer = self._observer(report, segments)
        if plan.capture and not self.plan_only:
            run = self._capture(run, gm, device, kind, report, plan, views_of_inputs(graph), split, observer)
        elif not self.plan_only:
            if config.mode == "reduce-overhead" and not runtime.can_capture:
                _warn_uncaptured(device)
            if observer is not None:
                run = ObservedRun(run, observer, _static_input_indices(kind))

        report.nodes = [
            NodeReport(
                name=node.name,
                target=target_name(node),
                stream=node.meta.get(STREAM),
                placement=placement(node),
                segment=node.meta.get(SEGMENT),
                device=str(val.device) if isinstance(val := node.meta.get("val"), torch.Tensor) else None,
            )
            for node in gm.graph.nodes
        ]
        report.segments = [
            SegmentReport(
                id=s.id,
                stream=s.stream,
                placement=s.placement,
                backend=s.backend,
                num_nodes=len(s.nodes),
                chosen_by=s.impl.chosen_by if s.impl is not None else None,
                source=dict(s.impl.source) if s.impl is not None else {},
            )
            for s in segments
        ]
        report.compile_seconds = time.perf_counter() - start
        self.reports.append(report)
        return Direct(run, kind) if self.direct and not self.plan_only else run

    def _capture(
        self,
        run: Callable[[list], Any],
        gm: torch.fx.GraphModule,
        device: torch.device,
        kind: str,
        report: GraphReport,
        plan: CapturePlan,
        input_views: dict[int, int],
        split: HostSplit | None,
        observer: ShapeKeyObserver | None,
    ) -> GraphCapture:
        placeholders = gm.graph.find_nodes(op="placeholder")
        mutated = mutated_nodes(gm.graph)
        return GraphCapture(
            run,
            device=device,
            static_indices=_static_input_indices(kind),
            mutated_indices=[i for i, p in enumerate(placeholders) if p in mutated],
            pool=self._pool,
            capture_limit=self.config.reduce_overhead.capture_limit,
            warmup_iters=self.config.reduce_overhead.warmup_iters,
            report=report,
            uncapturable=plan.uncapturable,
            input_views=input_views,
            host_split=split,
            observer=observer,
            hand_out=kind == "inference",
            in_graph_copies=self.config.reduce_overhead.input_copies == "in-graph",
        )

    def _observer(self, report: GraphReport, segments: list[Segment]) -> ShapeKeyObserver | None:
        observers = [o for factory in self.shape_observers if (o := factory(report, segments)) is not None]
        if not observers:
            return None
        if len(observers) == 1:
            return observers[0]

        def observe(key: tuple, args: list) -> None:
            for observer in observers:
                observer(key, args)

        return observe


def _warm_report(warm: WarmGraph, mode: str, dynamo_graph: int) -> GraphReport:
    """A warm-started graph (airgraph/kernels/warm.py) was not traced to ATen: one segment, its static kernels."""
    report = GraphReport(id=next_graph_id(), mode=mode, kind="inference", device="cpu", dynamo_graph=dynamo_graph)
    segment = SegmentReport(0, None, "device", "static_kernels", warm.num_nodes, "static_kernels", warm.source)
    report.segments = [segment]
    return report


def _warn_uncaptured(device: torch.device) -> None:
    warn_once(
        "reduce-overhead without capture",
        "airgraph: reduce-overhead captures CUDA graphs; on %s the executor runs uncaptured "
        "(results are the same; there is no graph to replay)",
        device.type,
    )


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

    return boxed(run)


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


def compile_model(
    model: Any,
    compiler_config: CompilerConfig | None = None,
    *,
    fast_path: bool = False,
    runtime: DeviceRuntime | None = None,
    **compile_kwargs: Any,
) -> Any:
    """``torch.compile(model, backend=airgraph.get_backend(compiler_config), **compile_kwargs)`` (``airgraph.compile``).

    ``fast_path=True``: calls whose argument signature was seen before go straight to the compiled graph, past
    Dynamo's guards and AOTAutograd's wrapper (runtime/fastpath.py: what it checks and what it does not: Python
    state the forward reads besides its arguments, parameters and buffers). Returns a
    :class:`airgraph.runtime.fastpath.FastPath` (``.compiled``: the torch.compile'd model, ``.backend``).
    ``runtime`` (tests): the simulator."""
    backend = AirgraphBackend(compiler_config, runtime=runtime)
    compiled = torch.compile(model, backend=backend, **compile_kwargs)
    if not fast_path:
        return compiled
    backend.direct = True
    fast = FastPath(model, compiled)
    fast.backend = backend
    return fast


def get_backend(compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """A torch.compile backend configured by ``compiler_config`` (a copy is taken)."""
    return AirgraphBackend(compiler_config)


def airgraph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(model, backend="airgraph")``: the default configuration."""
    return AirgraphBackend()(gm, example_inputs, **kwargs)
