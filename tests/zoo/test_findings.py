"""Failures the zoo found, each reduced to a minimal reproduction and marked ``xfail(strict=True)``: when the
fix lands the case passes, strict makes it fail as XPASS, and the mark comes off."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.report.explain import PlanError
from airgraph.runtime.simulated import SimulatedCuda
from tests.zoo.compare import assert_grads_close, assert_tensors_close


@pytest.mark.slow
def test_simulated_capture_of_a_max_pool_backward():
    """#14: the simulator recorded a graph by running it on zero-filled static buffers; Inductor's max_pool2d
    backward turns the forward's saved int8 window offsets into input indices, and offset 0 in a window over the
    padding is index -9: 'index -9 is out of bounds', so the backward ran uncaptured (a CUDA recording executes
    nothing and captures it). The recording now runs on the call's inputs. Found on HF ResNet's training step."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(3, 2, 1))

    eager, model = build(), build()
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"  # Inductor kernels (the default)
    sim = SimulatedCuda()
    backend = AirgraphBackend(config, runtime=sim)
    compiled = torch.compile(model, backend=backend)
    for step in range(3):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(step))
        for m in (eager, model):
            m.zero_grad()
        with sim.call():
            got = compiled(x.clone())
            got.sum().backward()
        want = eager(x)
        want.sum().backward()
        assert_tensors_close(got, want, f"step {step}")
        assert_grads_close(model, eager)
    sim.check()
    assert all(r.captured for r in backend.reports), [(r.kind, r.uncaptured_reason) for r in backend.reports]


def branchy(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:  # line BRANCH
        return y + 1
    return y - 1


def test_plan_names_a_data_dependent_branch():
    """#14: airgraph.plan of a function with a data-dependent Python branch raised PyTorch's bare
    DataDependentOutputException('aten._local_scalar_dense.default'), naming neither the problem nor the line
    (dynamo_export names both); found planning the zoo's graph_break model."""
    with pytest.raises(PlanError) as info:
        airgraph.plan(branchy, torch.randn(4), device="cuda")
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.endswith("# line BRANCH"))
    message = str(info.value)
    assert "data-dependent" in message.lower(), message
    assert f"{__file__}:{line}" in message, message


class CrossEntropyHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.proj(x), target)


class OneHotHead(nn.Module):
    """``full`` + ``scatter``: a pattern of Inductor's joint-graph passes (scatter_upon_const_tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        one_hot = torch.zeros(x.shape[0], 64).scatter(1, target[:, None], 1.0)
        return self.proj(x) * one_hot


def _kernels_generated(backend: Any, model: nn.Module, *, train: bool) -> int:
    """Inductor kernels generated for the graphs of one call (training: forward and backward), with cold caches
    (a cache hit generates nothing). The result is checked against eager."""
    from torch._inductor import metrics
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    generator = torch.Generator().manual_seed(0)
    x, target = torch.randn(8, 16, generator=generator), torch.randint(0, 64, (8,), generator=generator)
    with fresh_cache(), torch.set_grad_enabled(train):
        metrics.reset()
        got = compiled(x, target)
        if train:
            got.sum().backward()
        kernels = metrics.generated_kernel_count
        assert_tensors_close(got, model(x, target), "output")
    return kernels


@pytest.mark.slow
@pytest.mark.parametrize(("head", "train"), [(CrossEntropyHead, True), (OneHotHead, False)], ids=["train", "infer"])
def test_inductor_joint_graph_passes_run_as_in_torch_compile(head: type[nn.Module], train: bool):
    """#14: Inductor's joint-graph passes run under airgraph as in torch.compile: before the partitioner of a
    training graph (cross-entropy's backward: ``full`` + ``scatter`` become one ``where``, one kernel fewer) and
    on an inference graph; without them airgraph generates more kernels than torch.compile."""
    torch.manual_seed(0)
    model = head()
    want = _kernels_generated("inductor", model, train=train)
    assert _kernels_generated(airgraph.get_backend(), model, train=train) == want
