"""A model with two independent branches of small matmuls: the multi-stream reference case.

Each branch is ``depth`` rounds of ``x @ W_i`` followed by GELU on its own input; the branches join in one
add. With ``streams=True`` the branches run under ``stream_switch("left")`` and ``stream_switch("right")``,
so a compiled (and captured) graph can overlap them; with ``streams=False`` the same math runs on one
stream. Small shapes leave most SMs idle (overlap pays); large ones saturate the GPU (overlap cannot).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from airgraph.scope import stream_switch


class TwoBranch(nn.Module):
    def __init__(self, dim: int = 256, depth: int = 4, *, streams: bool = True, seed: int = 0) -> None:
        super().__init__()
        if dim < 1 or depth < 1:
            raise ValueError(f"TwoBranch: dim={dim} and depth={depth} must be >= 1")
        generator = torch.Generator().manual_seed(seed)
        scale = dim**-0.5

        def weights() -> nn.ParameterList:
            return nn.ParameterList(
                nn.Parameter(torch.randn(dim, dim, generator=generator) * scale) for _ in range(depth)
            )

        self.left, self.right = weights(), weights()
        self.streams = streams

    def _scope(self, tag: str) -> contextlib.AbstractContextManager:
        return stream_switch(tag) if self.streams else contextlib.nullcontext()

    @staticmethod
    def _branch(x: torch.Tensor, layers: nn.ParameterList) -> torch.Tensor:
        for weight in layers:
            x = torch.nn.functional.gelu(x @ weight)
        return x

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self._scope("left"):
            a = self._branch(x, self.left)
        with self._scope("right"):
            b = self._branch(y, self.right)
        return a + b


def two_branch_inputs(batch: int, dim: int, *, seed: int = 0, device: str | torch.device = "cpu", dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, dim, generator=generator, dtype=torch.float32)
    y = torch.randn(batch, dim, generator=generator, dtype=torch.float32)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
