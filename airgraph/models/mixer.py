"""An MLP mixer (Tolstikhin et al., 2021) from a few blocks: the warm-start benchmark's reduce-overhead case.

Each block mixes tokens, then channels, each with a pre-norm two-layer MLP (GELU, or ReLU) and a residual add; a
final norm, a mean over tokens and a linear head give the logits. The input is already patch-embedded:
``(batch, tokens, channels)``. Weights are drawn from ``seed`` (the global generator is left as it was).
"""

from __future__ import annotations

import torch
from torch import nn


class MixerBlock(nn.Module):
    def __init__(
        self, tokens: int, channels: int, token_hidden: int, channel_hidden: int, activation: str = "gelu"
    ) -> None:
        super().__init__()
        act = {"gelu": nn.GELU, "relu": nn.ReLU}[activation]
        self.norm1 = nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), act(), nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(channels)
        self.channel_mlp = nn.Sequential(
            nn.Linear(channels, channel_hidden), act(), nn.Linear(channel_hidden, channels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MlpMixer(nn.Module):
    def __init__(
        self,
        *,
        blocks: int = 2,
        tokens: int = 16,
        channels: int = 64,
        token_hidden: int = 32,
        channel_hidden: int = 256,
        classes: int = 10,
        activation: str = "gelu",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if min(blocks, tokens, channels, token_hidden, channel_hidden, classes) < 1:
            raise ValueError("MlpMixer: every size must be >= 1")
        if activation not in ("gelu", "relu"):
            raise ValueError(f"MlpMixer: activation {activation!r}; use 'gelu' or 'relu'")
        self.tokens, self.channels = tokens, channels
        with torch.random.fork_rng(devices=[]):  # the weights from ``seed``; the caller's generator untouched
            torch.manual_seed(seed)
            self.blocks = nn.ModuleList(
                MixerBlock(tokens, channels, token_hidden, channel_hidden, activation) for _ in range(blocks)
            )
            self.norm = nn.LayerNorm(channels)
            self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))

    def example_input(self, batch: int = 4, seed: int = 1) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(batch, self.tokens, self.channels, generator=generator)
