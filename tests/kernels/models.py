"""A small decode-like step for the static-kernel tests: an embedding, a cache updated in place, a projection."""

from __future__ import annotations

import torch
from torch import nn


class Step(nn.Module):
    """tokens [B] -> y [B, 16]; writes its first row into a cache at ``pos`` (an in-place update of a buffer).

    The embedding's float attribute (``norm_type``) makes Dynamo's graph with ``dynamic=True`` take it as an input,
    which AOTAutograd then specializes by restarting the trace, as in the tiny LLaMA (kernels/warm.py)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(32, 16)
        self.proj = nn.Linear(16, 16)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(32, 16, generator=generator))
            self.proj.weight.copy_(torch.randn(16, 16, generator=generator) * 0.2)
            self.proj.bias.copy_(torch.randn(16, generator=generator) * 0.1)
        self.register_buffer("cache", torch.zeros(8, 16))

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        y = torch.relu(self.proj(x))
        self.cache.index_copy_(0, pos, y[:1])
        return y * self.cache.sum(0) + x


def inputs(batch: int, pos: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    return torch.randint(0, 32, (batch,), generator=generator), torch.tensor([pos])
