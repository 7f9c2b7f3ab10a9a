"""``airgraph.tune``: compile a model with airgraph, tune it on its example inputs, return the report."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.utils._pytree as pytree

from airgraph.backend import AirgraphBackend
from airgraph.config import CompilerConfig
from airgraph.runtime.device import DeviceRuntime, runtime_for
from airgraph.tuning.measure import ROUNDS, decide
from airgraph.tuning.report import CallTiming, TuneReport
from airgraph.tuning.tuner import Progress
from airgraph.tuning.turns import DeviceTurns

__all__ = ["tune"]


def tune(
    model: Any,
    *example_inputs: Any,
    mode: str = "op",
    bank_dir: str | os.PathLike[str] | None = None,
    work_path: str | os.PathLike[str] | None = None,
    ops: list[str] | tuple[str, ...] | str | None = None,
    repeat: bool = False,
    config: CompilerConfig | None = None,
    progress: Progress | None = None,
    runtime: DeviceRuntime | None = None,
    **kwargs: Any,
) -> TuneReport:
    """Tune ``model`` (a module or function) for ``example_inputs`` (and ``kwargs``) and return the report.

    The model is compiled with airgraph (``config`` if given, with its ``tuning`` options set from the arguments)
    and run once, under ``torch.no_grad()`` (an inference graph; to tune a training step, set
    ``config.tuning.mode`` and run the step): that run tunes every graph (tuning/tuner.py), records the choices in
    the bank (``bank_dir``, default ``config.tuning.bank_dir`` or the user cache), and writes the seed-format report
    into ``work_path`` (default the working directory). ``mode``: "op" (AOE's OPAT, also "2") or "subgraph" (SGAT,
    "1"); ``ops``: only these op types or node names; ``repeat``: re-tune what the bank already has.
    ``progress(event, **info)`` is told of each unit and candidate (the CLI's progress bar). ``runtime`` (tests):
    the device runtime to compile and time with (``airgraph.runtime.simulated.SimulatedCuda``).

    When the run measured anything and a choice runs (else the two calls are one), the whole call is timed
    afterwards (``report.call``): the model compiled without the bank and the tuned one, called as the next run
    calls them (Dynamo's guards, AOTAutograd's wrapper and eager code between graphs included), interleaved; the
    tensors a call writes (a KV cache, the inputs) are put back as the tuning call left them. The compiled model
    only tunes: a graph whose units are all in the bank is compiled as a plain compile compiles it, nothing
    measured (Tuner.lowering_request).
    """
    config = copy.deepcopy(config) if config is not None else CompilerConfig()
    if not isinstance(config, CompilerConfig):
        raise TypeError(f"config must be an airgraph.CompilerConfig, not {type(config).__name__}")
    if mode is None:
        raise ValueError("airgraph.tune: mode must be 'op' or 'subgraph' (AOE's '2' or '1')")
    config.tuning.mode = mode
    if bank_dir is not None:
        config.tuning.bank_dir = os.fspath(bank_dir)
    if work_path is not None:
        config.tuning.work_path = os.fspath(work_path)
    if ops is not None:
        config.tuning.ops = ops
    config.tuning.repeat = repeat
    backend = AirgraphBackend(config, runtime=runtime)
    assert backend.tuner is not None
    backend.tuner.name = getattr(type(model), "__name__", "model") if isinstance(model, torch.nn.Module) else "model"
    backend.tuner.progress = progress
    backend.tuner.only_tunes = True  # the compiled model is not kept: a graph all in the bank compiles plainly
    compiled = torch.compile(model, backend=backend)
    state = _State(model, example_inputs, kwargs)
    with torch.no_grad():
        compiled(*example_inputs, **kwargs)
    report = backend.tuner.report
    if not backend.reports:
        report.call_note = "no graph was compiled"
    elif not report.measured:
        report.call_note = "nothing was measured: every unit came from the bank (see the run that measured it)"
    elif not backend.tuner.plain_graphs and not any(
        s.chosen_by == "tuning" for r in backend.reports for s in r.segments
    ):
        # The tuned call is the untuned one: timing the two would only measure the machine's noise (a busy one
        # claimed 0.67 for two compiles of the same code).
        report.call_note = "nothing but the defaults runs: the tuned call is the untuned one"
    else:
        written = state.written()
        try:
            device = torch.device(backend.reports[0].device)
            timer, turns = runtime_for(device, runtime), backend.tuner.turns
            # A graph whose units were all in the bank ran without its choices here (Tuner.lowering_request):
            # the tuned call is then the model compiled with the bank, as the next run compiles it.
            tuned = compiled if not backend.tuner.plain_graphs else _with_bank(model, config, timer)
            report.call = _time_calls(model, config, timer, tuned, example_inputs, kwargs, turns, device)
        finally:
            written.restore()
    report.write()
    return report


def _with_bank(model: Any, config: CompilerConfig, runtime: DeviceRuntime) -> Any:
    """``model`` compiled as a later run compiles it: tuning off, the bank's choices in."""
    later = copy.deepcopy(config)
    later.tuning.mode = None
    return torch.compile(model, backend=AirgraphBackend(later, runtime=runtime))


def _time_calls(
    model: Any,
    config: CompilerConfig,
    runtime: DeviceRuntime,
    tuned: Any,
    inputs: tuple,
    kwargs: dict,
    turns: DeviceTurns,
    device: torch.device,
) -> CallTiming:
    """The whole call of ``model`` compiled without the bank and of ``tuned``, timed side by side (measure.decide:
    measured again while noisy), holding the device's turn (compiled before it is asked for)."""
    untuned_config = copy.deepcopy(config)
    untuned_config.tuning.mode, untuned_config.tuning.use_bank = None, False
    untuned = torch.compile(model, backend=AirgraphBackend(untuned_config, runtime=runtime))
    with torch.no_grad(), turns.building(device):
        untuned(*inputs, **kwargs)  # compiles
        tuned(*inputs, **kwargs)  # compiled (by the tuning call, or _with_bank's first call here)
        calls = {"default": lambda _: untuned(*inputs, **kwargs), "tuned": lambda _: tuned(*inputs, **kwargs)}
        # Twice the rounds of a unit: this is the figure users compare with their next run.
        with turns.turn(device):
            timings = decide(calls, [], runtime, rounds=2 * ROUNDS).timings
    before, after = timings["default"], timings["tuned"]
    return CallTiming(before.median * 1e6, after.median * 1e6, max(before.spread, after.spread), len(before.rounds))


class _State:
    """The tensors a call may write (the inputs', the module's parameters and buffers), by their versions: what a
    call changed is copied, and put back after timing calls (:meth:`written`)."""

    def __init__(self, model: Any, inputs: tuple, kwargs: dict) -> None:
        tensors = [t for t in pytree.tree_leaves((inputs, kwargs)) if isinstance(t, torch.Tensor)]
        if isinstance(model, torch.nn.Module):
            tensors += [*model.parameters(), *model.buffers()]
        unique = {id(t): t for t in tensors}
        self._versions = {key: (t, t._version) for key, t in unique.items()}

    def written(self) -> _Saved:
        """Copies of the tensors written since this was made."""
        return _Saved([t for t, version in self._versions.values() if t._version != version])


class _Saved:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            self._copies = [(t, t.detach().clone()) for t in tensors]

    def restore(self) -> None:
        with torch.no_grad():
            for t, copy_ in self._copies:
                t.copy_(copy_)
