"""Where a compare run's values live: copies of the caller's values and calls of the compiled model on the backend's
device runtime.

On CUDA and the CPU a copy is a copy and a call is a call. On the simulated CUDA runtime (``SimulatedCuda``,
airgraph/runtime/simulated.py), a tensor placed on its device stands for a CUDA tensor: a copy of a placed tensor
is placed too, and each compiled call runs under ``runtime.call()``, so every run traces the graph the caller's
values would (host placement moves work to the host; the checker sees every access). The locator runs the
reference's ops and the segments it compiles through the graph's runtime (``run_op``, ``wrap_segment``), as the
executor does, so the simulator runs them on its device too.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RunDevice"]


@dataclass(frozen=True)
class RunDevice:
    """The backend's runtime override (``AirgraphBackend.runtime``: None, or the simulator)."""

    runtime: Any = None

    def copy_tensor(self, source: torch.Tensor, copied: torch.Tensor) -> torch.Tensor:
        """``copied`` (a copy of ``source``), placed where ``source`` is."""
        placement = getattr(self.runtime, "placement", None)
        if placement is not None and placement.placed(source):
            self.runtime.to_device(copied)
        return copied

    def copy_model(self, model: Any) -> Any:
        """A deep copy of ``model``, each parameter and buffer placed where the original's is."""
        if not isinstance(model, torch.nn.Module):
            return model
        copied = copy.deepcopy(model)
        for source, twin in zip(_tensors(model), _tensors(copied), strict=True):
            self.copy_tensor(source, twin)
        return copied

    def call(self) -> contextlib.AbstractContextManager:
        """Around one compiled call."""
        call = getattr(self.runtime, "call", None)
        return call() if call is not None and hasattr(self.runtime, "placement") else contextlib.nullcontext()


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]
