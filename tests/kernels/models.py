"""Small models for the static-kernel tests: a decode-like step with a cache updated in place."""

from __future__ import annotations

import torch
from torch import nn


class Step(nn.Module):
    """x [B, 16] -> y [B, 16]; writes its first row into a cache at ``pos`` (an in-place update of a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.proj = nn.Linear(16, 16)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(16, 16, generator=generator) * 0.2)
            self.proj.bias.copy_(torch.randn(16, generator=generator) * 0.1)
        self.register_buffer("cache", torch.zeros(8, 16))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.proj(x))
        self.cache.index_copy_(0, pos, y[:1])
        return y * self.cache.sum(0) + x


def inputs(batch: int, pos: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 16, generator=generator), torch.tensor([pos])
