"""What a zoo entry is: a model built from a seed, its inputs per call and shape, its loss, and what it expects.

Every model is built with random weights from a fixed seed (no downloads); ``inputs(call, shape)`` gives the
keyword arguments of call number ``call`` (its own data: a kept output of one call must not equal another's)
at shape ``shape`` (0: the main shape; 1: a second one, for the reduce-overhead case's second shape key).
``train_inputs(call)`` adds what the loss needs (labels) to shape 0's inputs, and ``loss(output)`` turns the
model's output into the scalar a training step minimizes.

What a case cannot do yet is in tests/zoo/registry.py: an :class:`Xfail` (a known or found bug; strict, so
the case flips when the fix lands) or a :class:`Refused` (the exporter refuses the model by design, and the
case checks that it says so clearly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MODES", "Refused", "Spec", "Xfail", "generator"]

# The cases each model runs: inference with airgraph's default (Inductor kernels), with the aten kernel
# backend, reduce-overhead on the CPU (uncaptured) and on the simulated CUDA runtime (captured), inference with
# frozen parameters (aten kernels), one training step, training steps captured and replayed on the simulated
# runtime, and an export run in onnxruntime.
MODES = ("default", "aten", "reduce-overhead", "simulated", "frozen", "train", "train-simulated", "export")


@dataclass(frozen=True)
class Xfail:
    """A case that fails today: ``reason`` names the op or cause (and the issue)."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """An export refused by design: ``kind`` is the ExportError's kind, ``match`` a regex of its message."""

    kind: str
    match: str


@dataclass(frozen=True)
class Spec:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], dict[str, Any]]
    train_inputs: Callable[[int], dict[str, Any]]
    loss: Callable[[Any], torch.Tensor]
    # Inference runs the model in eval mode unless it is about train-mode behaviour (BatchNorm's batch statistics).
    eval_for_inference: bool = True


def generator(call: int, salt: int = 0) -> torch.Generator:
    """A generator for call ``call``'s data: each call draws its own values, reproducibly."""
    return torch.Generator().manual_seed(1000 * call + salt)
