"""The torch.compile entry: Dynamo graph -> AOTAutograd -> passes -> capture plan -> partition -> choose and lower
-> executor -> capture (the design, step by step: docs/design/compile.md).

``get_backend(config)`` returns an :class:`AirgraphBackend`; ``torch.compile(model, backend="airgraph")``
reaches :func:`airgraph_backend` through the ``torch_dynamo_backends`` entry point. AOTAutograd turns each Dynamo
graph into one inference graph, or a forward and a backward graph; with Inductor kernels, Inductor's own graph
passes run where torch.compile runs them (lowering/inductor_passes.py).

:meth:`AirgraphBackend.compile_graph` compiles one ATen graph in named steps, read top to bottom: passes, capture
plan, host split (only with host work), partition, choose and lower, executor, capture. Invariants:

- the capture plan is made once per graph and handed on; nothing downstream asks again;
- every compiled graph appends one report (report/build.py) that says who chose each segment (``chosen_by``);
- AOTAutograd's metadata is read through lowering/aot.py only;
- ``plan_only=True`` (``airgraph.explain`` on fake inputs) chooses but lowers, runs and captures nothing: the
  callable returns fake outputs shaped like the traced ones, and every report is ``planned``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from airgraph.boxed import boxed
from airgraph.cache.compile_cache import CompileCache, Loaded, Lookup
from airgraph.cache.isa import known_isa
from airgraph.config import CompilerConfig
from airgraph.graph.analysis import mutated_nodes, views_of_inputs
from airgraph.graph.program import HostProgram, Segment
from airgraph.log import warn_once
from airgraph.lowering import aot, inductor_passes
from airgraph.lowering.capture_plan import CapturePlan, plan_capture
from airgraph.lowering.decompositions import without_kept
from airgraph.lowering.freeze import Parameter, freeze_parameters, parameter_inputs
from airgraph.lowering.host_split import split_host_work
from airgraph.lowering.layouts import Layouts
from airgraph.lowering.lower import lower_segments
from airgraph.lowering.partition import partition
from airgraph.lowering.select import GraphRequest, ImplSource, choose
from airgraph.passes import CompileContext, run_pipeline
from airgraph.report.build import capture_plan_report, finish_graph_report, graph_report, warm_report
from airgraph.report.schema import GraphReport
from airgraph.runtime.capture import GraphCapture, MemoryPool, ObservedRun, ShapeKeyObserver
from airgraph.runtime.device import DeviceRuntime, runtime_for
from airgraph.runtime.executor import build_executor
from airgraph.runtime.fastpath import Direct, FastPath
from airgraph.runtime.host import HostSplit

if TYPE_CHECKING:
    from airgraph.lowering.padding import PadPlan
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
        self.tuning: ImplSource | None = _Bank(self.config)
        # config.tuning.mode: each graph's first run tunes it (airgraph/tuning/tuner.py), then it runs tuned.
        self.tuner: Tuner | None = None
        if self.config.tuning.mode and not plan_only:
            from airgraph.tuning.tuner import Tuner

            self.tuner = Tuner(self.config)
        # Told of each new input-shape key of each compiled graph (static kernels record shapes there).
        self.shape_observers: list[Callable[[GraphReport, list[Segment]], ShapeKeyObserver | None]] = []
        if self.config.static_kernels.enabled:  # static kernels: airgraph/kernels
            from airgraph.kernels.static import StaticKernels

            self.static_kernels = StaticKernels(self.config)
            self.shape_observers.append(self.static_kernels.observer)
        # What AOTAutograd made of each Dynamo graph, for the next process (airgraph/cache).
        self.compile_cache = CompileCache(self.config) if self.config.compile_cache and not plan_only else None
        self._pool = MemoryPool(runtime_for(torch.device("cuda"), runtime))
        self.direct = False  # wrap each compiled graph in fastpath.Direct (compile_model(..., fast_path=True))
        # False: a Dynamo graph whose static kernels are all installed still goes through AOTAutograd and runs them
        # segment by segment (airgraph.compare: a warm-started graph has no ATen graph to check node by node).
        self.warm_start = True

    def __repr__(self) -> str:
        return f"AirgraphBackend(mode={self.config.mode!r}, kernel_backend={self.config.kernel_backend!r})"

    # -- Dynamo entry ------------------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        cache = self.compile_cache
        cpu = all(v.device.type == "cpu" for v in example_inputs if isinstance(v, torch.Tensor))
        inductor_cpu = cpu and self.config.kernel_backend == "inductor" and self.runtime is None
        with known_isa(cache.root if cache is not None and inductor_cpu else None):  # cache/isa.py
            return self._compile_dynamo_graph(gm, example_inputs, **kwargs)

    def _compile_dynamo_graph(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        dynamo_graph = self.dynamo_graphs
        self.dynamo_graphs += 1
        kernels = self.static_kernels
        if kernels is not None and self.warm_start and not self.plan_only and self.runtime is None and _static(kernels):
            warm = kernels.warm_start(gm, example_inputs)  # kernels/warm.py
            if warm is not None:
                self.reports.append(warm_report(warm.num_nodes, warm.source, self.config.mode, dynamo_graph))
                return Direct(warm, "inference") if self.direct else warm
        names = tuple(_argument_name(p) for p in gm.graph.find_nodes(op="placeholder"))
        # config.frozen_parameters: the module parameters among the inputs, with their real values (lowering/freeze.py)
        params = parameter_inputs(gm, example_inputs) if self.config.frozen_parameters else ()
        lookup = self.compile_cache.lookup(gm, example_inputs) if self.compile_cache is not None else None
        if lookup is not None and lookup.found is not None:  # airgraph/cache: AOTAutograd's graph, stored
            loaded = self.compile_cache.load(lookup, example_inputs)
            if loaded is not None:
                return self._from_cache(loaded, dynamo_graph, names, params)
        compile_as = functools.partial(
            self.compile_graph, dynamo_graph=dynamo_graph, arg_names=names, parameters=params
        )
        inference = functools.partial(compile_as, kind="inference")
        if lookup is not None:  # its entry is written once compiled (airgraph/cache)
            store = self._compile_and_store
            inference = functools.partial(store, lookup=lookup, compile_as=compile_as)
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
            decompositions = without_kept(decompositions, self.config)  # config.fallback.keep_ops
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
            inference_compiler=inference,
            decompositions=decompositions,
            partition_fn=partition_fn,
            keep_inference_input_mutations=self.config.experimental_config.keep_inference_input_mutations,
        )
        return aot(gm, example_inputs, **kwargs)

    def _from_cache(
        self,
        loaded: Loaded,
        dynamo_graph: int,
        names: tuple[str | None, ...],
        params: tuple[Parameter | None, ...],
    ) -> Callable[..., Any]:
        """A Dynamo graph compiled from its compile-cache entry: AOTAutograd's stored inference graph, compiled from
        airgraph's passes on (frozen parameters, too, are this call's: the entry holds none); AOTAutograd's facts
        answered from the entry (lowering/aot.py ``replaying``). Called by Dynamo with the graph's inputs as
        arguments, as AOTAutograd's own function is."""
        with aot.tracing(loaded.fake_mode, guards_to_current=True), aot.replaying(loaded.facts):
            run = self.compile_graph(
                loaded.gm,
                loaded.example_inputs,
                kind="inference",
                dynamo_graph=dynamo_graph,
                arg_names=names,
                parameters=params,
                graph_passes_done=True,
            )
        self.reports[-1].compile_cache = "hit"
        return _Unboxed(run)

    def _compile_and_store(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: list[Any],
        *,
        lookup: Lookup,
        compile_as: Callable[..., Callable[[list], Any]],
    ) -> Callable[[list], Any]:
        """AOTAutograd's inference compiler where the Dynamo graph has a compile-cache entry to write: Inductor's
        graph passes first (compile_graph's own step), the graph as they leave it kept for the entry (before
        airgraph's passes edit it and frozen parameters become its constants: weights stay inputs in an entry),
        compiled, and the entry written once it compiled; when AOTAutograd's runtime wrappers have work around the
        graph it has no entry (lowering/aot.py ``snapshot``)."""
        if self.config.kernel_backend == "inductor":
            gm = inductor_passes.inference_passes(gm, example_inputs)
        facts = aot.snapshot(len(example_inputs))
        payload, why = None, "not stored: AOTAutograd's runtime wrappers have work around this graph"
        if facts is not None and self.compile_cache is not None:
            try:
                payload = self.compile_cache.payload(gm, facts)
            except Exception as exc:  # a graph GraphPickler cannot write: compiled, not stored
                why = f"not stored: the graph cannot be written ({type(exc).__name__}: {exc})"
        run = compile_as(gm, example_inputs, kind="inference", graph_passes_done=True)
        report = self.reports[-1]
        report.compile_cache = why
        if payload is not None and self.compile_cache is not None:
            stored = self.compile_cache.store(lookup, payload, gm)
            report.compile_cache = "stored" if stored else "not stored: the folder cannot be written, or is refused"
        return run

    # -- one ATen graph ----------------------------------------------------------------------------------
    def compile_graph(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: list[Any],
        *,
        kind: str,
        dynamo_graph: int = 0,
        arg_names: tuple[str | None, ...] = (),
        parameters: tuple[Parameter | None, ...] = (),
        graph_passes_done: bool = False,
    ) -> Callable[[list], Any]:
        """One ATen graph: passes -> capture plan -> host split -> partition -> choose and lower -> executor ->
        capture (module docstring); its report is appended to ``self.reports``. ``arg_names``: the forward's
        argument name behind each input, where Dynamo knows it (capture sizes' pad values); ``parameters``: the
        module parameter behind each input, with config.frozen_parameters (lowering/freeze.py);
        ``graph_passes_done``: Inductor's graph passes already ran on ``gm`` (a compile-cache entry's graph, or one
        being stored)."""
        start = time.perf_counter()
        device = graph_device(gm, example_inputs)
        job = _Job(
            kind=kind,
            device=device,
            runtime=runtime_for(device, self.runtime),
            report=graph_report(self.config.mode, kind, device, dynamo_graph, planned=self.plan_only),
            request=GraphRequest(kind, device, self.config, static_kernels=self.static_kernels, tuning=self.tuning),
            arg_names=arg_names if kind == "inference" else (),
        )
        if kind == "inference" and self.config.kernel_backend == "inductor" and not graph_passes_done:
            gm = inductor_passes.inference_passes(gm, example_inputs)  # a training graph's ran before its partition
        placeholders = gm.graph.find_nodes(op="placeholder")
        layouts = Layouts(placeholders, example_inputs)  # the strides values really have (lowering/layouts.py)
        outputs = list(gm.graph.find_nodes(op="output")[0].args[0])
        frozen = self._freeze(job, gm, parameters) if parameters else []
        self._passes(job, gm, example_inputs)
        plan = self._plan_capture(job, gm)
        program = split_host_work(gm, plan.host, job.request) if plan.split and not self.plan_only else None
        graph, segments = _partition(job, gm, program)
        if self.plan_only:
            run = _choose_only(job, gm, segments)
        else:
            run = self._lower_and_execute(job, graph, program, segments, layouts, placeholders)
        layouts.report(outputs)
        run = self._capture_or_observe(job, run, gm, graph, plan, segments, frozen)
        finish_graph_report(job.report, gm, segments, start)
        self.reports.append(job.report)
        return Direct(run, kind) if self.direct and not self.plan_only else run

    def _freeze(self, job: _Job, gm: torch.fx.GraphModule, parameters: tuple[Parameter | None, ...]) -> list[int]:
        """config.frozen_parameters: the graph's unchanged parameters become constants (lowering/freeze.py); the
        positions of their inputs, which the graph no longer reads."""
        frozen, names, refused = freeze_parameters(
            gm, parameters, kind=job.kind, static_kernels=self.config.static_kernels.enabled
        )
        job.report.frozen_parameters, job.report.frozen_refused = names, refused
        return frozen

    def _passes(self, job: _Job, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> None:
        """The pass pipeline (airgraph/passes) edits and annotates ``gm`` in place."""
        ctx = CompileContext(
            config=self.config, report=job.report, kind=job.kind, device=job.device, example_inputs=example_inputs
        )
        job.report.passes = run_pipeline(gm, ctx)

    def _plan_capture(self, job: _Job, gm: torch.fx.GraphModule) -> CapturePlan:
        """Whether and how reduce-overhead captures the graph: decided once, handed on (lowering/capture_plan.py)."""
        plan = plan_capture(gm, mode=self.config.mode, device=job.device, can_capture=job.runtime.can_capture)
        capture_plan_report(job.report, plan)
        return plan

    def _lower_and_execute(
        self,
        job: _Job,
        graph: torch.fx.GraphModule,
        program: HostProgram | None,
        segments: list[Segment],
        layouts: Layouts,
        placeholders: list[torch.fx.Node],
    ) -> Callable[[list], Any]:
        """Lower the device segments for the strides their inputs really have, and run them in order on their
        streams (tuned on the first run when tuning is on); with a host split, the host work around them."""
        donors = placeholders  # a backward's donated inputs: the graph's own
        if program is not None:  # the device program: the graph's inputs, then the host values it reads
            segments, donors = program.device_segments, None
            device_inputs = graph.graph.find_nodes(op="placeholder")
            layouts = Layouts(device_inputs, [p.meta.get("val") for p in device_inputs])
        request, building = job.request, contextlib.nullcontext()
        if self.tuner is not None:  # airgraph.tune: a graph all in the bank is lowered as a plain compile does
            request = self.tuner.lowering_request(segments, request)
            building = self.tuner.turns.building(job.device)  # not beside another tuner's CPU measurement
        with building:
            lower_segments(segments, request, layouts=layouts, placeholders=donors)
        report, runtime = job.report, job.runtime
        run = build_executor(graph, segments, job.device, runtime=runtime, priorities=report.stream_priorities)
        if self.tuner is not None:
            run = self.tuner.wrap(run, graph, segments, job.request, layouts, report, runtime)
        return run if program is None else HostSplit(program, run, runtime)

    def _capture_or_observe(
        self,
        job: _Job,
        run: Callable[[list], Any],
        gm: torch.fx.GraphModule,
        graph: torch.fx.GraphModule,
        plan: CapturePlan,
        segments: list[Segment],
        frozen: list[int],
    ) -> Callable[[list], Any]:
        """In reduce-overhead, GraphCapture records and replays ``run``; otherwise the shape-key observers (static
        kernels record shapes there) watch it. A planned graph is returned as it is. ``frozen``: inputs the graph
        does not read (frozen parameters)."""
        observer = self._observer(job.report, segments)
        if self.plan_only:
            return run
        if plan.capture:
            split = run if isinstance(run, HostSplit) else None
            return self._capture(run, gm, job, plan, views_of_inputs(graph), split, observer, frozen)
        if self.config.mode == "reduce-overhead" and not job.runtime.can_capture:
            _warn_uncaptured(job.device)
        return run if observer is None else ObservedRun(run, observer, _static_input_indices(job.kind))

    def _capture(
        self,
        run: Callable[[list], Any],
        gm: torch.fx.GraphModule,
        job: _Job,
        plan: CapturePlan,
        input_views: dict[int, int],
        split: HostSplit | None,
        observer: ShapeKeyObserver | None,
        frozen: list[int],
    ) -> Callable[[list], Any]:
        """GraphCapture records and replays ``run``, one graph per shape key; with capture sizes, behind a
        PaddedRun that runs each batch at the next size (padding=None: unpadded, runtime/padding.py). The
        ``frozen`` inputs are static but unread: neither copied nor checked."""
        placeholders = gm.graph.find_nodes(op="placeholder")
        mutated = mutated_nodes(gm.graph)
        mutated_indices = [i for i, p in enumerate(placeholders) if p in mutated]
        static = _static_input_indices(job.kind)
        padding = self._padding(job, gm, static, plan) if not plan.uncapturable else None
        capture = GraphCapture(
            run,
            device=job.device,
            static_indices=static,
            unread_indices=frozen,
            mutated_indices=mutated_indices,
            pool=self._pool,
            capture_limit=self.config.reduce_overhead.capture_limit,
            warmup_iters=self.config.reduce_overhead.warmup_iters,
            report=job.report,
            uncapturable=plan.uncapturable,
            input_views=input_views,
            host_split=split,
            observer=observer,
            hand_out=job.kind == "inference",
            in_graph_copies=self.config.reduce_overhead.input_copies == "in-graph",
        )
        # sizes below the smallest batch the graph gets (Dynamo gives a batch of 1 a graph of its own) never replay
        smallest = padding.smallest if padding is not None else None
        sizes = [s for s in self.config.reduce_overhead.capture_sizes if smallest is not None and s >= smallest]
        if not sizes:
            return capture
        values = self.config.reduce_overhead.pad_values
        fills = {i: values[name] for i, name in enumerate(job.arg_names) if name in values}
        from airgraph.runtime.padding import PaddedRun

        return PaddedRun(
            capture,
            padding,
            sizes,
            job.report,
            mutated_indices=mutated_indices,
            fills=fills,
            record_calls=self.config.reduce_overhead.warmup_iters,
        )

    def _padding(self, job: _Job, gm: torch.fx.GraphModule, static: list[int], plan: CapturePlan) -> PadPlan | None:
        """The graph's padding plan when capture sizes are set, or None (a warning says why, once)."""
        sizes = self.config.reduce_overhead.capture_sizes
        if not sizes:
            return None
        if job.kind != "inference":
            warn_once(("capture_sizes", "training"), CAPTURE_SIZES_TRAINING)
            return None
        dim = self.config.reduce_overhead.capture_dim
        from airgraph.lowering.padding import PadRefusal, plan_padding

        padding = plan_padding(gm, dim=dim, static_indices=set(static))
        if padding is None:
            if not _batch_of_one(gm, dim, static):  # (Dynamo gives a batch of 1 a static graph of its own)
                warn_once(("capture_sizes", "static", dim), CAPTURE_SIZES_STATIC.format(dim=dim))
        elif isinstance(padding, PadRefusal):
            job.report.padding_refused = padding.reason
            where = f" at {padding.source}" if padding.source else ""
            warn_once(("capture_sizes", padding.op, padding.source), CAPTURE_SIZES_REFUSED.format(padding, where))
            return None
        return padding

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


def _static(kernels: ImplSource) -> bool:
    """Whether the seam's static-kernel store is airgraph's own (kernels/static.py; a test may plant another)."""
    from airgraph.kernels.static import StaticKernels

    return isinstance(kernels, StaticKernels)


class _Bank:
    """The seam's tuning step (tuning/source.py's BankSource), whose modules are imported once a bank folder exists:
    most processes have none, and tuning is a package of its own."""

    def __init__(self, config: CompilerConfig) -> None:
        self.config = config
        self.source: ImplSource | None = None

    def lookup(self, segment: Segment, request: GraphRequest) -> Any:
        if self.source is None:
            if not request.config.tuning.use_bank or not os.path.isdir(self.config.tuning.resolved_bank_dir()):
                return None
            from airgraph.tuning.source import BankSource

            self.source = BankSource(self.config)
        return self.source.lookup(segment, request)


class _Unboxed:
    """A boxed callable (it takes one list) called with the inputs as arguments, as Dynamo calls a backend's."""

    def __init__(self, run: Callable[[list], Any]) -> None:
        self.run = run

    def __call__(self, *args: Any) -> Any:
        return self.run(list(args))


@dataclass(frozen=True)
class _Job:
    """One ATen graph being compiled: what every step of :meth:`AirgraphBackend.compile_graph` reads."""

    kind: str  # "inference", "forward" or "backward"
    device: torch.device
    runtime: DeviceRuntime
    report: GraphReport
    request: GraphRequest
    arg_names: tuple[str | None, ...] = ()


CAPTURE_SIZES_STATIC = (
    "airgraph: config.reduce_overhead.capture_sizes is set, but this graph's dimension {dim} is static, so it is "
    "captured once per size: compile with torch.compile(..., dynamic=True) or call "
    "torch._dynamo.mark_dynamic(x, {dim}) on the batched input before the first call"
)
CAPTURE_SIZES_REFUSED = (
    "airgraph: config.reduce_overhead.capture_sizes: this graph runs unpadded, one CUDA graph per batch size: "
    "{0.reason}{1}"
)
CAPTURE_SIZES_TRAINING = (
    "airgraph: config.reduce_overhead.capture_sizes pads inference graphs only; training graphs are captured once "
    "per batch size"
)


def _batch_of_one(gm: torch.fx.GraphModule, dim: int, static: list[int]) -> bool:
    """The graph's first batched input (not static, of rank above ``dim``) has size 1 (or 0) at ``dim``: Dynamo
    specializes those sizes even where the batch is marked dynamic, so such a graph is no sign of static shapes."""
    for i, p in enumerate(gm.graph.find_nodes(op="placeholder")):
        val = p.meta.get("val")
        if i not in static and isinstance(val, torch.Tensor) and val.dim() > dim:
            return isinstance(val.shape[dim], int) and val.shape[dim] <= 1
    return False


def _argument_name(placeholder: torch.fx.Node) -> str | None:
    """The forward's argument a Dynamo graph input comes from (``L['attention_mask']`` -> ``attention_mask``)."""
    name = getattr(getattr(placeholder.meta.get("grapharg"), "source", None), "name", "")
    match = re.fullmatch(r"L\['([^']+)'\]", name() if callable(name) else str(name))
    return match.group(1) if match else None


def _partition(
    job: _Job, gm: torch.fx.GraphModule, program: HostProgram | None
) -> tuple[torch.fx.GraphModule, list[Segment]]:
    """The graph that runs on the device and the segments of the whole graph (lowering/partition.py): with a host
    split, those of its device program and the host segments the program adopts."""
    if program is None:
        return gm, partition(gm, streams=job.runtime.has_streams)
    return program.device_gm, program.adopt(partition(program.device_gm, streams=job.runtime.has_streams))


def _choose_only(job: _Job, gm: torch.fx.GraphModule, segments: list[Segment]) -> Callable[[list], Any]:
    """Planning: each compute segment's implementation is chosen, nothing is lowered or run."""
    for segment in segments:
        segment.impl = None if segment.sync else choose(segment, job.request)
    return _planned_run(gm)


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
    return aot.static_input_indices()


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
