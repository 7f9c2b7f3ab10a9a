"""Static kernels for one backend: the seam's static_kernels step, the shape recorder, the builder, the loader.

``AirgraphBackend`` makes one :class:`StaticKernels` when ``config.static_kernels.enabled``; it is

- the seam's ``static_kernels`` store (:meth:`lookup`): for every compute segment of an inference graph that it
  can cover, it answers ``Impl("static_kernels", "static_kernels")``, carrying the segment's graph key and the
  implementation the rest of the seam would choose (the dynamic kernel, compiled only if a key needs it);
- a shape observer (:meth:`observer`), told of each new input-shape key of each graph, captured or not, before
  the key first runs: it records every operator at the key's shapes (kernels/records.py) and, for each covered
  segment whose kernel the library lacks, or whose installed files are damaged or gone, claims it on the node and
  builds it (kernels/build.py) with a progress bar; the kernels built go into this process's package, which is
  then installed (kernels/library.py; a rebuilt kernel as a repair of its damaged entry), so the key's first run
  already uses them;
- the loader of installed kernels (:meth:`load`), which refuses, with one warning each, an entry built for
  another torch or airgraph version, CPU instruction set or CUDA architecture (kernels/machine.py), or whose
  files are gone or do not match their digests; and loads nothing where loading a package crashed a probe's child
  process (kernels/probe.py: the first load in an environment is a child's);
- the warm start (:meth:`warm_start`, kernels/warm.py): asked by the backend before AOTAutograd whether the
  installed kernels can run a Dynamo graph as it is; the building process records which graphs can.

A segment is covered unless its graph is a training graph (forward or backward: TorchAir's feature is for
inference), a value in it has a data-dependent size, an output is a view of an input (a separately compiled
kernel would return a copy), or it holds no operator with a kernel of its own.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from airgraph.config import CompilerConfig
from airgraph.graph.analysis import views_of_inputs
from airgraph.kernels import package as pkg
from airgraph.kernels.build import build_kernel
from airgraph.kernels.dispatch import LoadedKernel, StaticKernelSegment
from airgraph.kernels.library import KernelLibrary, library_path
from airgraph.kernels.machine import build_record, describe, mismatch
from airgraph.kernels.node import register_process
from airgraph.kernels.probe import LoadProbes, open_package
from airgraph.kernels.records import Recorder, is_view
from airgraph.kernels.shapes import bind, data_dependent, shape_id, shape_key_of, spec
from airgraph.kernels.warm import WarmGraph, graph_record, prespecialize, restarted_floats, warm_start
from airgraph.lowering.keys import graph_key
from airgraph.lowering.request import LowerRequest
from airgraph.lowering.select import GraphRequest, Impl, choose

if TYPE_CHECKING:
    from airgraph.graph.program import Segment

__all__ = ["StaticKernels"]

log = logging.getLogger("airgraph")


@dataclasses.dataclass
class _Job:
    segment: StaticKernelSegment
    specs: list[dict[str, Any]]
    shape_key: tuple
    sid: str

    @property
    def kid(self) -> str:
        return pkg.kernel_id(self.segment.graph_key, self.sid)


class StaticKernels:
    """One backend's static kernels (module docstring)."""

    def __init__(self, config: CompilerConfig) -> None:
        options = config.static_kernels
        self.config = config
        self.build_dir = Path(options.build_dir or os.getcwd()).resolve()
        self.library = KernelLibrary(library_path(config))
        self.probes = LoadProbes(self.library.root)
        self.recorder = Recorder(self.build_dir)
        self.builds = options.build
        register_process(
            self.recorder.root,
            local_world_size=options.local_world_size,
            local_rank=options.local_rank,
            world_size=options.world_size,
        )
        self.built: list[pkg.KernelFiles] = []  # this process's package
        self._failed: set[str] = set()
        self._repairs: dict[str, str] = {}  # kernel id -> package of its damaged entry, being built again
        self._loaded: dict[str, LoadedKernel] = {}
        self._refused: dict[str, str] = {}  # kernel id -> package whose entry was refused (warned once)
        self._index: dict[str, Any] = {"kernels": {}, "graphs": {}}
        self._stamp: Any = ()
        self.current: tuple[str, int] | None = None  # the Dynamo graph being compiled: warm-start key, inputs
        self.records: dict[str, dict] = {}  # Dynamo graphs compiled here that can warm-start (kernels/warm.py)
        self._abandoned: str | None = None  # a graph of the frame being compiled that Dynamo traced again
        prespecialize(self.graph_records())  # the floats the library's graphs restarted for (kernels/warm.py)

    def __repr__(self) -> str:
        return f"StaticKernels(library={str(self.library.root)!r}, build_dir={str(self.build_dir)!r})"

    # -- the seam ----------------------------------------------------------------------------------------
    def lookup(self, segment: Segment, request: GraphRequest) -> Impl | None:
        if request.kind != "inference" or segment.sync or segment.gm is None:
            return None
        gm = segment.gm
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        if not any(not is_view(n) for n in nodes) or views_of_inputs(gm):
            return None
        if data_dependent(n.meta.get("val") for n in gm.graph.nodes):
            return None
        fallback = choose(segment, dataclasses.replace(request, static_kernels=None))
        key = graph_key(gm)
        return Impl(
            "static_kernels",
            "static_kernels",
            options={"kernels": self, "fallback": fallback, "graph_key": key},
            source={"graph_key": key, "static_keys": [], "dynamic_keys": []},
        )

    def segment(self, request: LowerRequest) -> StaticKernelSegment:
        """The "static_kernels" kernel backend's answer for a segment :meth:`lookup` answered for."""
        return StaticKernelSegment(self, request, request.options["fallback"], request.options["graph_key"])

    # -- the library -------------------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        """The library's index, read again when it changed."""
        stamp = self.library.stamp()
        if stamp != self._stamp:
            self._index, self._stamp = self.library.read_index(), stamp
        return self._index

    def _entry(self, kid: str) -> dict[str, Any] | None:
        return self._read()["kernels"].get(kid)

    def entries(self, graph_key: str) -> list[dict[str, Any]]:
        """The installed kernels of a segment graph key."""
        return [e for e in self._read()["kernels"].values() if e["graph_key"] == graph_key]

    def damaged(self, graph_key: str) -> list[str]:
        """The installed kernels of a segment graph key whose files are damaged or gone (to build again)."""
        entries = self.entries(graph_key)
        return [pkg.kernel_id(e["graph_key"], e["shape_id"]) for e in entries if self.library.damage(e) is not None]

    def graph_records(self) -> dict[str, dict]:
        """Dynamo graphs (warm-start keys) the library can warm-start -> how (kernels/warm.py's graph_record)."""
        return self._read()["graphs"]

    def warm_start(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> WarmGraph | None:
        """Before AOTAutograd: the installed kernels themselves for a Dynamo graph they serve (kernels/warm.py)."""
        if self.current is not None:  # the previous graph never finished compiling: Dynamo restarted the frame
            self._abandoned = self.current[0]
        warm = warm_start(self, gm, example_inputs)
        if warm is not None:  # compiled (warm): not abandoned when the frame compiles again for another key
            self.current = None
        return warm

    def load(self, graph_key: str, sid: str, device: torch.device) -> LoadedKernel | None:
        """The installed kernel of (graph key, shape id) for ``device``, loaded; None when there is none that this
        machine can run (each refused entry is warned about once)."""
        kid = pkg.kernel_id(graph_key, sid)
        if kid in self._loaded:
            return self._loaded[kid]
        entry = self._entry(kid)
        if entry is None or self._refused.get(kid) == entry["package"]:
            return None
        reason = mismatch(entry["build"], describe(device))
        folder = self.library.folder(entry)
        if reason is None:
            reason = self.library.damage(entry)
            if reason is not None and self._entry(kid) != entry:  # replaced since read (its old package collected)
                return self.load(graph_key, sid, device)
        if reason is None:  # no process is the first to load a package in an environment (kernels/probe.py)
            built_with = entry["build"].get("compiler")
            verdict = self.probes.check(folder / "kernel.pt2", entry["shape_key"], device, kid, built_with)
            if verdict.status == "crashed":  # the probe warned, once per process
                self._refused[kid] = entry["package"]
                return None
            if verdict.status == "failed":
                reason = f"loading it in a child process failed ({verdict.cause})"
        if reason is None:
            try:
                kernel = _load_aoti(kid, folder / "kernel.pt2", device)
            except Exception as exc:  # a package torch cannot load is refused like a mismatched one
                reason = f"torch could not load it ({type(exc).__name__}: {exc})"
        if reason is not None:
            self._refused[kid] = entry["package"]
            warnings.warn(
                f"airgraph: static kernel {kid} (package {entry['package']} in {self.library.root}) not used: "
                f"{reason}; the segment runs its dynamic kernels",
                stacklevel=2,
            )
            return None
        self._loaded[kid] = kernel
        return kernel

    def building_elsewhere(self, graph_key: str, sid: str) -> bool:
        """Whether another live process on the node has claimed this kernel to build it."""
        return self.library.held_by_other(pkg.kernel_id(graph_key, sid))

    # -- recording and building --------------------------------------------------------------------------
    def observer(self, report: Any, segments: list[Segment]) -> Any:
        """A shape observer for one compiled graph (``AirgraphBackend.shape_observers``)."""
        covered = [(i, s) for i, s in enumerate(segments) if isinstance(s.compiled, StaticKernelSegment)]
        for index, seg in covered:
            seg.compiled.attach(report, index)
        current, self.current = self.current, None  # told by warm_start for this graph only
        abandoned, self._abandoned = self._abandoned, None
        record = graph_record(current, segments) if covered else None
        if record is not None and current is not None:
            self.records[current[0]] = record
            floats = restarted_floats()
            if abandoned is not None and floats:  # the first graph of this frame made AOTAutograd restart it
                self.records[abandoned] = {"graph_key": record["graph_key"], "restart": floats}
        graphs = list({id(n.graph): n.graph for s in segments for n in s.nodes[:1]}.values())
        owners = {n: (seg.compiled.graph_key, seg.id) for _, seg in covered for n in seg.nodes}

        def observe(key: tuple, args: list) -> None:
            bindings: dict = {}
            for graph in graphs:
                bind([p.meta.get("val") for p in graph.find_nodes(op="placeholder")], args, bindings)

            def covering(node: torch.fx.Node) -> dict[str, Any] | None:
                owner = owners.get(node)
                return None if owner is None else {"graph_key": owner[0], "segment": owner[1]}

            self.recorder.record((n for g in graphs for n in g.nodes), bindings, covering)
            jobs = []
            for _, seg in covered:
                job = self._job(seg.compiled, bindings)
                if job is not None:
                    jobs.append(job)
            if jobs:
                self.build(jobs)

        return observe

    def _job(self, segment: StaticKernelSegment, bindings: dict) -> _Job | None:
        found = [spec(v, bindings) for v in segment.request.example_inputs]
        specs = [s for s in found if s is not None]
        if not self.builds or len(specs) != len(found):
            return None
        key = shape_key_of(specs)
        job = _Job(segment, specs, key, shape_id(key))
        if job.kid in self._failed:
            return None
        entry = self._entry(job.kid)
        if entry is not None:  # installed: built again only when its files are damaged (as the loader refuses them)
            damage = self.library.damage(entry)
            if damage is None:
                return None
            if self.library.claim(job.kid, replacing=entry["package"]) != "claimed":
                return None  # another process is building it again, or has installed it again
            warnings.warn(
                f"airgraph: static kernel {job.kid} (package {entry['package']} in {self.library.root}): {damage}; "
                "building it again",
                stacklevel=3,
            )
            self._repairs[job.kid] = entry["package"]
            return job
        return job if self.library.claim(job.kid) == "claimed" else None

    def build(self, jobs: list[_Job]) -> Path | None:
        """Build ``jobs`` (claimed kernels) with a progress bar, write this process's package with them and
        install it; returns the package's path (None when every build failed)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        built = 0
        try:
            with Progress(*columns, console=Console(stderr=True)) as progress:
                task = progress.add_task("building static kernels", total=len(jobs))
                for job in jobs:
                    what = f"graph {job.segment.graph_key[:12]} {job.segment.label(job.specs)}"
                    progress.update(task, description=f"building static kernel: {what}")
                    built += self._build_one(job)
                    progress.advance(task)
            if not built:
                return None
            path = self.recorder.package_path()
            served = {k.graph_key for k in self.built}
            graphs = {key: record for key, record in self.records.items() if record["graph_key"] in served}
            pkg.write_package(path, self.built, build_record(jobs[0].segment.request.device), graphs)
            result = self.library.install(path, repairs=self._repairs)
            log.info(
                "airgraph: static kernels: package %s (%d kernels) written and installed into %s (%d new)",
                path,
                len(self.built),
                self.library.root,
                len(result.added),
            )
            return path
        finally:
            for job in jobs:
                self.library.release(job.kid)

    def _build_one(self, job: _Job) -> int:
        segment = job.segment
        request = segment.request
        folder = self.recorder.outputs / ".build" / segment.graph_key / job.sid
        options = segment.fallback.options.get("inductor_config", {}) if segment.fallback.backend == "inductor" else {}
        try:
            seconds = build_kernel(
                request.gm, job.specs, request.device, folder / "kernel.pt2", inductor_config=options
            )
        except Exception as exc:
            self._failed.add(job.kid)
            warnings.warn(
                f"airgraph: static kernel {job.kid} could not be built ({type(exc).__name__}: {exc}); the segment "
                "runs its dynamic kernels for that shape",
                stacklevel=2,
            )
            return 0
        ops = [str(n.target) for n in request.gm.graph.nodes if n.op == "call_function" and not is_view(n)]
        self.built.append(
            pkg.KernelFiles(
                graph_key=segment.graph_key,
                shape_key=[list(k) if isinstance(k, tuple) else k for k in job.shape_key],
                shape_id=job.sid,
                files={"kernel.pt2": folder / "kernel.pt2"},
                info={
                    "label": segment.label(job.specs),
                    "ops": len(ops),
                    "first_ops": ops[:5],
                    "build_seconds": round(seconds, 3),
                    "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
                },
            )
        )
        return 1


def _load_aoti(kid: str, path: Path, device: torch.device) -> LoadedKernel:
    """An AOTInductor package (kernels/build.py made it) loaded to run on ``device`` (kernels/probe.py's
    ``open_package``: the loader call its probe makes in a child process first)."""
    loader = open_package(path, device)
    return LoadedKernel(kid, loader.boxed_run, loader)
