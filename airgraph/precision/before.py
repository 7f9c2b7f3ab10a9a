"""Find a divergence made before the kernels: by one of the decompositions AOTAutograd applied, or by a pass.

The kernel-level locator (precision/locate.py) checks segments against the ATen graph interpreted op by op; that
graph already holds the decompositions and the passes, so a wrong one is in the reference too. Here each suspect is
switched off in turn and the whole model compared with eager again (PyTorch's accuracy minifier bisects the same
way): first every pass that changed a graph (``config.passes.<name> = False``), then every op that eager ran and
the backend's table decomposes (``config.fallback.keep_ops``; eager's ops are recorded under a dispatch mode, the
backward's too). When switching a group off brings every value within tolerance, halves of it are tried until one
suspect is left, which then alone must bring it within tolerance. A suspect found is reported with the first node
it concerns (a kept op's node in the graph compiled without its decomposition; a pass's node from its report), its
user's line and module. Each trial compiles a fresh copy of the model on a fresh backend (Dynamo's recompile limit
raised for it); a trial that fails to compile counts as not fixing it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from airgraph.config import CompilerConfig
from airgraph.passes.fallback import PER_NODE, op_names
from airgraph.precision.record import Recorder
from airgraph.precision.source import module_path, node_source

__all__ = ["BeforeKernels", "EagerOps", "locate_before", "raised_recompile_limits"]


@dataclass(frozen=True)
class BeforeKernels:
    """What changed the ATen graph away from eager: ``stage`` "decomposition" (``what``: the op decomposed) or
    "pass" (``what``: the pass); the first node it concerns and where the user's code made it."""

    stage: str
    what: str
    graph: str | None
    node: str | None
    op: str | None
    source: str | None
    code: str
    module: str | None
    detail: str  # the pass's line about the node, or the decomposed op's overload
    trials: int  # compiles the search took
    pass_node: str | None = None  # the one node the pass changed wrongly, where the pass can leave it (PER_NODE)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        by = f"the decomposition of {self.what}" if self.stage == "decomposition" else f"airgraph's {self.what} pass"
        where = f" at {self.source}" + (f" `{self.code}`" if self.code else "") if self.source else ""
        node = f": node {self.node} ({self.op}) in {self.graph}" if self.node else ""
        module = f" in {self.module}" if self.module else ""
        if self.pass_node:
            by += f" on node {self.pass_node}"
        return (
            f"first divergence before the kernels: {by} ({self.stage}){node}{where}{module}; without it every value "
            f"is within tolerance (found in {self.trials} compiles)"
        )


Trial = Callable[[CompilerConfig], "tuple[bool, Recorder | None]"]


def locate_before(config: CompilerConfig, recorder: Recorder, trial: Trial, eager_ops: list[Any]) -> tuple:
    """``(found or None, notes, the recorder of the trial without it or None)``. ``trial(config)``: whether
    compiling with ``config`` is within tolerance, and its recorder; ``eager_ops``: the ATen ops eager dispatched,
    in order."""
    counter = [0]

    def counted(candidate: CompilerConfig) -> tuple[bool, Recorder | None]:
        counter[0] += 1
        with raised_recompile_limits():
            try:
                return trial(candidate)
            except Exception:
                return False, None

    passes = _changed_passes(recorder)
    found = _search(passes, lambda names: _passes_off(config, names), counted)
    if found is not None:
        name, fixed = found
        node = None
        if name in PER_NODE:  # which of its changes: the nodes its report names, left as they are in halves
            words = [d.split()[0].rstrip(",:") for d in _details(recorder, name) if d.split()]
            changed = list(dict.fromkeys(w for w in words if w.isidentifier()))
            one = _search(changed, lambda nodes: _pass_nodes(config, name, nodes), counted)
            if one is not None:
                node, fixed = one
        return _pass_finding(name, recorder, fixed, counter[0], node), [], fixed
    decomposed = _decomposed_ops(config, eager_ops)
    found = _search(list(decomposed), lambda names: _kept(config, names), counted)
    if found is not None:
        name, fixed = found
        return _decomposition_finding(name, decomposed[name], fixed, counter[0]), [], fixed
    tried = f"{len(passes)} pass(es) and {len(decomposed)} decomposition(s) switched off"
    return None, [f"neither a decomposition nor an airgraph pass made it ({tried}, in {counter[0]} compiles)"], None


def _search(candidates: list[str], configure: Callable[[list[str]], CompilerConfig], trial: Callable) -> Any:
    """The one candidate whose switching off brings every value within tolerance, and that trial's recorder."""
    if not candidates:
        return None
    ok, recorder = trial(configure(candidates))
    if not ok:
        return None
    proven = candidates
    while len(candidates) > 1:
        half, rest = candidates[: len(candidates) // 2], candidates[len(candidates) // 2 :]
        ok, found = trial(configure(half))
        if ok:
            candidates, recorder, proven = half, found, half
        else:
            candidates = rest
    if candidates != proven:  # the other half was never tried alone
        ok, recorder = trial(configure(candidates))
        if not ok:
            return None
    return candidates[0], recorder


def _passes_off(config: CompilerConfig, names: list[str]) -> CompilerConfig:
    candidate = copy.deepcopy(config)
    candidate.compile_cache = False  # a trial leaves no entries behind
    for name in names:
        setattr(candidate.passes, name, False)
    return candidate


def _pass_nodes(config: CompilerConfig, name: str, nodes: list[str]) -> CompilerConfig:
    candidate = copy.deepcopy(config)
    candidate.compile_cache = False
    candidate.fallback.pass_nodes = [*candidate.fallback.pass_nodes, *(f"{name}:{node}" for node in nodes)]
    return candidate


def _details(recorder: Recorder, name: str) -> list[str]:
    return [d for g in recorder.graphs for r in g.report.passes if r.name == name for d in r.details]


def _kept(config: CompilerConfig, names: list[str]) -> CompilerConfig:
    candidate = copy.deepcopy(config)
    candidate.compile_cache = False
    candidate.fallback.keep_ops = [*candidate.fallback.keep_ops, *names]
    return candidate


def _changed_passes(recorder: Recorder) -> list[str]:
    changed: dict[str, None] = {}
    for graph in recorder.graphs:
        for report in graph.report.passes:
            if report.enabled and report.changed and report.name != "fallback":
                changed[report.name] = None
    return list(changed)


def _decomposed_ops(config: CompilerConfig, eager_ops: list[Any]) -> dict[str, list[Any]]:
    """Each op eager ran that the backend's table decomposes (``aten.silu`` -> its overloads ran), in order."""
    if config.kernel_backend != "inductor":
        return {}
    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import select_decomp_table

    importlib.import_module("torch._inductor.lowering")
    with inductor_config.patch(fallback_random=True):
        table = select_decomp_table()
    kept = set(config.fallback.keep_ops)
    found: dict[str, list[Any]] = {}
    for op in eager_ops:
        names = op_names(op)
        if op in table and names and not kept.intersection(names):
            found.setdefault(names[0], []).append(op)
    return found


def _pass_finding(
    name: str, recorder: Recorder, fixed: Recorder | None, trials: int, pass_node: str | None = None
) -> BeforeKernels:
    """The pass's first line about a node (about ``pass_node`` when known), and that node as the graph compiled
    without the change has it."""
    details = [
        d
        for d in _details(recorder, name)
        if pass_node is None or d.split()[:1] == [f"{pass_node}"] or d.startswith(f"{pass_node}:")
    ]
    if not details:
        return BeforeKernels("pass", name, None, None, None, None, "", None, "", trials, pass_node)
    detail = details[0]
    nodes = {n.name: (g.name, n) for g in (fixed.graphs if fixed else []) for n in _nodes(g)}
    for word in detail.replace(",", " ").replace("(", " ").split():
        if word in nodes:
            graph_name, node = nodes[word]
            return dataclasses.replace(_finding("pass", name, graph_name, node, detail, trials), pass_node=pass_node)
    return BeforeKernels("pass", name, None, None, None, None, "", None, detail, trials, pass_node)


def _decomposition_finding(name: str, ops: list[Any], fixed: Recorder | None, trials: int) -> BeforeKernels:
    for graph in fixed.graphs if fixed else []:
        for node in _nodes(graph):
            if node.target in ops:
                return _finding("decomposition", name, graph.name, node, str(node.target), trials)
    return BeforeKernels("decomposition", name, None, None, None, None, "", None, str(ops[0]), trials)


def _finding(stage: str, what: str, graph: str, node: torch.fx.Node, detail: str, trials: int) -> BeforeKernels:
    source, code = node_source(node)
    return BeforeKernels(
        stage, what, graph, node.name, str(node.target), source, code, module_path(node), detail, trials
    )


def _nodes(graph: Any) -> list[torch.fx.Node]:
    return [n for seg in graph.segments for n in seg.nodes if n.op == "call_function"]


class EagerOps(TorchDispatchMode):
    """Records each ATen op eager dispatches, once, in the order first seen."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[Any, None] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.setdefault(func, None)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def raised_recompile_limits() -> Any:
    """Dynamo's recompile limits raised: every trial compiles the same forward anew, on another backend."""
    from torch._dynamo import config as dynamo_config

    limits = {n: 1024 for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit")}
    with dynamo_config.patch({n: v for n, v in limits.items() if hasattr(dynamo_config, n)}):
        yield
