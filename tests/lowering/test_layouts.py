"""Strides travel with values: a layout a kernel backend chose (Inductor's channels-last convolutions on the CPU)
reaches the next segment's compile and the backward's compile, as AOTAutograd and Inductor agree on."""

from __future__ import annotations

import copy

import pytest
import torch

from airgraph import scope
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import compile_with

pytestmark = pytest.mark.slow


class ConvBlock(torch.nn.Module):
    """Conv -> BatchNorm (train) -> ReLU -> Conv -> BatchNorm(momentum=None) -> ReLU -> mean -> Linear, with a
    scale parameter registered last but read first: the graph reads its inputs out of placeholder order, so the
    executor wraps even a single segment."""

    def __init__(self, side_stream: bool = False) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8, momentum=None)
        self.head = torch.nn.Linear(8, 4)
        self.scale = torch.nn.Parameter(torch.full((1, 3, 1, 1), 0.5))
        self.side_stream = side_stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x * self.scale)))
        if self.side_stream:  # a segment boundary right after a channels-last activation
            with scope.stream_switch("side"):
                h = self.conv2(h)
        else:
            h = self.conv2(h)
        return self.head(torch.relu(self.bn2(h)).mean((2, 3)))


def train_steps(model: torch.nn.Module, compiled, steps: int = 2) -> None:
    """Each step compiled and eager on copies of one model: loss, every gradient, every parameter and buffer."""
    reference = copy.deepcopy(model)
    for step in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(step))
        got, expected = compiled(x), reference(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
        got.square().sum().backward()
        expected.square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
            p.grad, q.grad = None, None
        for a, b in zip(model.buffers(), reference.buffers(), strict=True):
            torch.testing.assert_close(a, b)


def test_training_a_cnn_keeps_inductors_saved_activation_layouts():
    model = ConvBlock().train()
    compiled, backend = compile_with(model)
    train_steps(model, compiled)
    forward = next(r for r in backend.reports if r.kind == "forward")
    assert len(forward.segments) == 1 and forward.segments[0].backend == "inductor"


@pytest.mark.parametrize("kernel_backend", ["inductor", "aten"])
def test_layouts_cross_segment_boundaries(kernel_backend):
    """Stream scopes split the graph (simulated CUDA): the segment after a channels-last activation is compiled for
    that layout, and the backward for the layouts every segment really returned."""
    model, sim = ConvBlock(side_stream=True).train(), SimulatedCuda()
    compiled, backend = compile_with(model, runtime=sim, kernel_backend=kernel_backend)
    with sim.call():
        train_steps(model, compiled, steps=1)
    sim.check()
    forward = next(r for r in backend.reports if r.kind == "forward")
    assert {s.stream for s in forward.segments} == {None, "side"}


class PatchEmbed(torch.nn.Module):
    """ViT's patch embedding: a strided convolution whose output is read as a sequence past a class token."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.head(torch.nn.functional.layer_norm(tokens, (16,)))[:, 1:]


def test_the_backward_gets_the_layouts_inductors_forward_converted_inputs_to():
    """Inductor's forward converts the convolution's input and weight to channels-last and returns those copies
    as the tensors saved for the backward (the forward graph returns its inputs): the backward is compiled for
    them, as under torch.compile, instead of converting the gradient back (one kernel more)."""
    from torch._inductor import metrics
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(0)
    model = PatchEmbed().train()
    kernels = {}
    for name in ("inductor", "airgraph"):
        torch._dynamo.reset()
        trained = copy.deepcopy(model)
        compiled, _ = compile_with(trained) if name == "airgraph" else (torch.compile(trained, backend=name), None)
        with fresh_cache():
            metrics.reset()
            train_steps(trained, compiled, steps=1)
            kernels[name] = metrics.generated_kernel_count
    assert kernels["airgraph"] == kernels["inductor"], kernels
