"""``airgraph.tune``: compile a model with airgraph, tune it on its example inputs, return the report."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from airgraph.backend import AirgraphBackend
from airgraph.config import CompilerConfig
from airgraph.tuning.report import TuneReport
from airgraph.tuning.tuner import Progress

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
    **kwargs: Any,
) -> TuneReport:
    """Tune ``model`` (a module or function) for ``example_inputs`` (and ``kwargs``) and return the report.

    The model is compiled with airgraph (``config`` if given, with its ``tuning`` options set from the arguments)
    and run once, under ``torch.no_grad()`` (an inference graph; to tune a training step, set
    ``config.tuning.mode`` and run the step): that run tunes every graph (tuning/tuner.py), records the choices in
    the bank (``bank_dir``, default ``config.tuning.bank_dir`` or the user cache), and writes the seed-format report
    into ``work_path`` (default the working directory). ``mode``: "op" (AOE's OPAT, also "2") or "subgraph" (SGAT,
    "1"); ``ops``: only these op types or node names; ``repeat``: re-tune what the bank already has.
    ``progress(event, **info)`` is told of each unit and candidate (the CLI's progress bar).
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
    backend = AirgraphBackend(config)
    assert backend.tuner is not None
    backend.tuner.name = getattr(type(model), "__name__", "model") if isinstance(model, torch.nn.Module) else "model"
    backend.tuner.progress = progress
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(*example_inputs, **kwargs)
    return backend.tuner.report
