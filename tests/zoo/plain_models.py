"""Plain modules, each built around one feature that is hard for a graph compiler.

- ``batchnorm_train``: Conv-BatchNorm-ReLU blocks run in train mode, also for inference: batch statistics,
  and the running statistics (and ``num_batches_tracked``) updated in place on every call.
- ``graph_break``: a data-dependent Python branch (``if x.abs().amax() > 1``): Dynamo breaks the graph there;
  the calls alternate between both branches.
- ``multihead_attention``: ``nn.MultiheadAttention`` with a key padding mask (its fused fast path in eval
  mode without gradients, the composite one in training).
- ``channels_last``: convolutions (one depthwise) on channels-last weights and inputs, with a residual add;
  the output keeps the channels-last layout.
- ``tied_weights``: the output projection is the embedding's weight (one parameter used twice: its gradient
  sums both uses, and the tie survives an optimizer step).
- ``inplace_buffers``: buffers updated in place in ``forward`` (a step counter, a running mean, a ring
  of the last inputs), read by the same forward.
- ``dropout``: ``nn.Dropout`` and ``F.dropout`` in training: the compiled step must draw eager's masks
  from the same seed (the zoo's transformers models have their dropout off).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.zoo.spec import Spec, generator

__all__ = ["PLAIN_SPECS"]

BATCH = 2


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).mean((2, 3)))


class GraphBreak(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        if x.abs().amax() > 1:  # data-dependent: a graph break, and a guard on the branch taken
            h = h * x.abs().amax()
        else:
            h = h - x.mean()
        return self.second(h)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.out = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h, _ = self.attn(x, x, x, key_padding_mask=padding, need_weights=False)
        return self.out(h)


class ChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.stem(x))
        return h + self.pointwise(F.gelu(self.depthwise(h)))


class TiedWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)))


class InPlaceBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("running", torch.zeros(16))
        self.register_buffer("ring", torch.zeros(3, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.detach().mean(0)
        self.steps += 1
        self.running.mul_(0.9).add_(mean, alpha=0.1)
        self.ring.copy_(torch.roll(self.ring, 1, 0))
        self.ring[0] = mean
        return self.proj(x - self.running) + self.ring.sum(0) * self.steps


class Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.first(x)))
        return self.second(h) + F.dropout(x[:, :8], 0.5, training=self.training)


def _built(cls: type) -> nn.Module:
    torch.manual_seed(0)
    return cls()


def _mse(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()


def _images(call: int, shape: int, side: tuple[int, int] = (16, 12)) -> dict[str, Any]:
    return {"x": torch.randn(BATCH, 3, side[shape], side[shape], generator=generator(call))}


def _channels_last_inputs(call: int, shape: int) -> dict[str, Any]:
    return {"x": _images(call, shape)["x"].contiguous(memory_format=torch.channels_last)}


def _channels_last_model() -> nn.Module:
    return _built(ChannelsLast).to(memory_format=torch.channels_last)


def _vectors(call: int, shape: int) -> dict[str, Any]:
    x = torch.randn(BATCH + 2 * shape, 16, generator=generator(call))
    return {"x": x if call % 2 else x * 0.2}  # odd calls: amax > 1; even calls: amax < 1 (the other branch)


def _attention_inputs(call: int, shape: int) -> dict[str, Any]:
    seq = (8, 12)[shape]
    padding = torch.zeros(BATCH, seq, dtype=torch.bool)
    padding[1, seq - 3 :] = True  # the second sequence's last 3 keys are padding
    return {"x": torch.randn(BATCH, seq, 32, generator=generator(call)), "padding": padding}


def _ids(call: int, shape: int) -> dict[str, Any]:
    return {"ids": torch.randint(0, 64, (BATCH, (8, 12)[shape]), generator=generator(call))}


def _spec(name: str, build, inputs, **kwargs: Any) -> Spec:
    return Spec(name, build, inputs, lambda call: inputs(call, 0), _mse, **kwargs)


PLAIN_SPECS: list[Spec] = [
    _spec("batchnorm_train", lambda: _built(ConvBN), _images, eval_for_inference=False),
    _spec("graph_break", lambda: _built(GraphBreak), _vectors),
    _spec("multihead_attention", lambda: _built(Attention), _attention_inputs),
    _spec("channels_last", _channels_last_model, _channels_last_inputs),
    _spec("tied_weights", lambda: _built(TiedWeights), _ids),
    _spec("inplace_buffers", lambda: _built(InPlaceBuffers), _vectors),
    _spec("dropout", lambda: _built(Dropout), _vectors),
]
