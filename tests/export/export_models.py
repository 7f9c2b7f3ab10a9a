"""Small models for the export tests, and helpers to run an export in a process without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class SeedModel(nn.Module):
    """The seed's single-card example: two Linear layers, parameters set to one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 2)
        for param in self.parameters():
            nn.init.ones_(param)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.linear1(x) + self.linear2(y)


class Attn(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wq = nn.Linear(dim, dim)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(torch.tanh(self.wq(x)))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = Attn(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class Stacked(nn.Module):
    """layers[0], layers[1]: module paths like ``layers.0.attn.wq``; a buffer, and a parameter name needing care."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(dim) for _ in range(2))
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x * self.scale


class GraphBreak(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()  # line GRAPH_BREAK_LINE
        return y + 1


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # line DATA_DEPENDENT_LINE
            return x * 2
        return x - 1


@torch.library.custom_op("airgraph_export_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Unlowerable(nn.Module):
    """An op with no ONNX lowering: a custom op."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.airgraph_export_test.mystery(self.lin(x)) + 1  # line UNLOWERABLE_LINE


class BiasedAttention(nn.Module):
    """Self-attention with a learned per-head bias as SDPA's float mask; ``merge`` says how heads are merged.

    The mask requires grad at capture, so torch.export traces SDPA's math kernel (a contiguous [B, H, L, D]
    output) while torch.onnx's retrace, without autograd, picks the CPU flash kernel (laid out [B, L, H, D]):
    the merge after ``transpose(1, 2)`` is a view in one trace and not in the next (airgraph/export/views.py).
    """

    def __init__(self, merge: str = "reshape", dim: int = 32, heads: int = 2, seq_len: int = 7) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.merge, self.heads = merge, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.randn(heads, seq_len, seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        mask = self.bias.expand(b, -1, -1, -1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
        if self.merge == "reshape":
            y = y.reshape(b, n, -1)  # line MERGE_HEADS_LINE
        elif self.merge == "contiguous_view":
            y = y.contiguous().view(b, n, -1)
        else:
            y = y.flatten(2)
        return self.out(y)


class ReshapedThenUpdated(nn.Module):
    """A reshape whose result is then updated in place: it must stay a view of ``h`` (the update shows in h)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x).transpose(0, 1).contiguous()
        h.view(-1).add_(1.0)
        return h * 2


def line_of(marker: str) -> int:
    """Line number of the ``# line MARKER`` comment in this file."""
    for number, line in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# line {marker}"):
            return number
    raise LookupError(marker)


def run_without_torch(*args: str, module: str = "airgraph.export.runner") -> subprocess.CompletedProcess:
    """``python -m <module> ARGS --assert-no-torch`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", module, *args, "--assert-no-torch"], capture_output=True, text=True, timeout=120
    )


def save_npz(path: Path, arrays: dict[str, np.ndarray | torch.Tensor]) -> Path:
    np.savez(path, **{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in arrays.items()})
    return path


def read_metadata(export_dir: Path) -> dict:
    return json.loads((export_dir / "export.json").read_text())
