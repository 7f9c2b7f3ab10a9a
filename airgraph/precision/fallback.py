"""The fix ``airgraph.compare`` gives: a config in which what diverged runs as eager would, and what it costs.

:func:`fallback_config` starts from the config compared and adds, for each divergence found:

- a segment's node (a kernel that left eager): ``config.fallback.aten_nodes`` gets ``kind:op``, so every node of
  that op in graphs of that kind runs alone through the aten kernel backend (passes/fallback.py, the seam's
  ``compare`` step): a segment's divergence hides those after it, and a wrong kernel is wrong for the op;
- a decomposition: ``config.fallback.keep_ops`` gets the op, which is then not decomposed and runs as aten
  (lowering/decompositions.py);
- an airgraph pass: for the one node it changed wrongly, ``config.fallback.pass_nodes`` gets ``pass:node`` where
  the pass can leave a node as it is (passes/fallback.py's ``PER_NODE``); else ``config.passes.<name> = False``.

:func:`call_times` measures the steady-state call time with the config compared and with the fallback
(``torch.utils.benchmark``, median of blocked runs), on copies of the model: the speed cost of the fix.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from airgraph.config import CompilerConfig

__all__ = ["call_times", "fallback_config"]


def fallback_config(report: Any) -> CompilerConfig:
    """``report.fallback()``: see the module docstring. A report that found nothing gives the config unchanged."""
    if report.config is None:
        raise ValueError("this CompareReport has no config: fallback() needs a report made by airgraph.compare")
    config = copy.deepcopy(report.config)
    nodes = list(config.fallback.aten_nodes)
    for divergence in report.divergences:
        kind = divergence.graph.split()[0]  # "forward graph 3" -> "forward"
        nodes.append(f"{kind}:{divergence.op}")
    config.fallback.aten_nodes = list(dict.fromkeys(nodes))
    before = report.before
    if before is not None and before.stage == "decomposition":
        config.fallback.keep_ops = list(dict.fromkeys([*config.fallback.keep_ops, before.what]))
    elif before is not None and before.stage == "pass" and before.pass_node:
        pair = f"{before.what}:{before.pass_node}"
        config.fallback.pass_nodes = list(dict.fromkeys([*config.fallback.pass_nodes, pair]))
    elif before is not None and before.stage == "pass":
        setattr(config.passes, before.what, False)
    return config


def call_times(
    model: Any, *inputs: Any, config: CompilerConfig, fallback: CompilerConfig, min_run_time: float = 0.2, **kwargs: Any
) -> dict[str, float]:
    """``{"without_s": ..., "with_s": ...}``: the median seconds of one call of ``model`` compiled with ``config``
    and with ``fallback``, each on its own copy of the model, after the calls that reach its steady state."""
    from torch.utils import benchmark

    from airgraph.backend import AirgraphBackend
    from airgraph.precision.before import raised_recompile_limits
    from airgraph.precision.run import compiled_calls

    times = {}
    threads = torch.get_num_threads()  # the timer sets it: another count would make Dynamo recompile
    for name, chosen in (("without_s", config), ("with_s", fallback)):
        with raised_recompile_limits():
            compiled = torch.compile(copy.deepcopy(model), backend=AirgraphBackend(chosen))
            for _ in range(compiled_calls(chosen) + 1):
                compiled(*inputs, **kwargs)
            timer = benchmark.Timer(
                stmt="fn(*args, **kwargs)",
                globals={"fn": compiled, "args": inputs, "kwargs": kwargs},
                num_threads=threads,
            )
            times[name] = timer.blocked_autorange(min_run_time=min_run_time).median
    return times
