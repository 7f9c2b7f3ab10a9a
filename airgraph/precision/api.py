"""``airgraph.compare``: run a model eagerly and with airgraph, compare, and locate the first divergent node."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from airgraph.config import CompilerConfig
from airgraph.precision.before import EagerOps, locate_before
from airgraph.precision.device import RunDevice
from airgraph.precision.locate import locate_graph
from airgraph.precision.record import Recorder
from airgraph.precision.report import CompareReport
from airgraph.precision.run import compare_runs, compiled_calls, run_once
from airgraph.precision.tolerance import tolerance_for

__all__ = ["compare", "compare_with"]


def compare(
    model: Any,
    *inputs: Any,
    config: CompilerConfig | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> CompareReport:
    """Run ``model(*inputs, **kwargs)`` eagerly and compiled by airgraph with ``config``, on copies of the same
    inputs and weights, and compare every output (and, with autograd on, every gradient).

    ``rtol``/``atol``: both or neither; by default each value's tolerance follows its dtype as torch.testing
    chooses it. When a value leaves its tolerance, each segment of each compiled graph is checked on eager's
    values (airgraph/precision/locate.py) and ``report.first`` names the first node that diverged. ``dump_dir``:
    every compared tensor, eager's and compiled, with an ``index.json`` (airgraph/precision/dump.py).
    """
    from airgraph.backend import AirgraphBackend

    backend = AirgraphBackend(config)
    return compare_with(backend, model, inputs, kwargs, rtol=rtol, atol=atol, dump_dir=dump_dir)


def compare_with(
    backend: Any,
    model: Any,
    inputs: tuple,
    kwargs: dict,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    **compile_kwargs: Any,
) -> CompareReport:
    """:func:`compare` with a backend of the caller's (e.g. one on the simulated CUDA runtime);
    ``compile_kwargs`` go to ``torch.compile``."""
    tolerance_for(torch.float32, rtol, atol)  # both or neither, before anything runs
    recorder = Recorder()
    recorder.attach(backend)
    backend.warm_start = False  # installed static kernels still run, segment by segment, in a graph it can check

    def compile_fn(fn: Any) -> Any:
        return torch.compile(fn, backend=backend, **compile_kwargs)

    device = RunDevice(getattr(backend, "runtime", None))
    calls = compiled_calls(backend.config)
    eager, compiled, values = compare_runs(
        model, inputs, kwargs, compile_fn, calls, rtol=rtol, atol=atol, device=device
    )
    graphs = [_graph_summary(g.report) for g in recorder.graphs]
    report = CompareReport(values, graphs=graphs, config=copy.deepcopy(backend.config))
    original = None  # the trial without the decomposition or pass found: TorchAir's "original" stage
    if not report.ok:
        for graph in recorder.graphs:
            found, notes = locate_graph(graph, backend.config, rtol, atol, device.runtime)
            report.divergences += found
            report.notes += notes
        if not report.divergences and not report.notes:
            found = _before_kernels(backend, recorder, model, inputs, kwargs, rtol, atol, compile_kwargs)
            report.before, notes, original = found
            report.notes += notes
            if report.before is None:
                report.notes.append(
                    "no segment leaves the tolerance on eager's values: the difference comes from outside the "
                    "kernels (capture, streams or input copies)"
                )
    if dump_dir is not None:
        from airgraph.precision.dump import write_dumps

        pairs = {**eager.outputs, **eager.grads}, {**compiled.outputs, **compiled.grads}
        dumped = [(d, pairs[0].get(d.name), pairs[1].get(d.name)) for d in values]
        stage = original.outcome if original is not None and original.outcome is not None else None
        before = {**stage.outputs, **stage.grads} if stage is not None else None
        write_dumps(dump_dir, dumped, report.divergences, original=before, before=report.before)
        report.dump_dir = str(dump_dir)
    return report


def _before_kernels(
    backend: Any,
    recorder: Recorder,
    model: Any,
    inputs: tuple,
    kwargs: dict,
    rtol: Any,
    atol: Any,
    compile_kwargs: dict,
) -> tuple[Any, list[str]]:
    """Which decomposition or pass leaves eager (precision/before.py): each trial a fresh backend of the same kind."""
    device = RunDevice(getattr(backend, "runtime", None))
    ops = EagerOps()
    eager_model = device.copy_model(model)
    run_once(eager_model, eager_model, inputs, kwargs, 0, device, lambda: ops)

    def trial(config: CompilerConfig) -> tuple[bool, Recorder]:
        candidate, trial_recorder = type(backend)(config, runtime=backend.runtime), Recorder()
        trial_recorder.attach(candidate)
        candidate.warm_start = False

        def compile_fn(fn: Any) -> Any:
            return torch.compile(fn, backend=candidate, **compile_kwargs)

        calls = compiled_calls(config)
        _, trial_recorder.outcome, diffs = compare_runs(
            model, inputs, kwargs, compile_fn, calls, rtol=rtol, atol=atol, device=device
        )
        return all(d.ok for d in diffs), trial_recorder

    return locate_before(backend.config, recorder, trial, list(ops.ops))


def _graph_summary(report: Any) -> dict[str, Any]:
    return {
        "graph": f"{report.kind} graph {report.id}",
        "mode": report.mode,
        "captured": report.captured,
        "segments": [
            {"id": s.id, "backend": s.backend, "chosen_by": s.chosen_by, "nodes": s.num_nodes} for s in report.segments
        ],
    }
