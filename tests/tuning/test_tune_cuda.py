"""Tuning on CUDA (the GPU machine): operator candidates (SDPA kernels, the Triton GEMM template), subgraph
candidates, and reduce-overhead capture of a tuned graph."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import airgraph
from airgraph.tuning.bank import BankFile
from tests.helpers import assert_close, make_config
from tests.tuning.seed_format import validate

pytestmark = pytest.mark.cuda


class Block(torch.nn.Module):
    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.out(y)
        return x + self.mlp(x)


@pytest.mark.parametrize("mode", ["op", "subgraph"])
def test_tuning_on_cuda_is_checked_and_reused(tmp_path, mode, cuda_device, monkeypatch):
    from airgraph.tuning import measure

    monkeypatch.setattr(measure, "NOISY", float("inf"))  # every measurement a verdict: the bank file is written
    torch.manual_seed(0)
    model = Block().to(cuda_device).eval().half()
    x = torch.randn(4, 64, 256, device=cuda_device, dtype=torch.half)
    report = airgraph.tune(model, x, mode=mode, bank_dir=tmp_path / "bank", work_path=tmp_path)
    validate(json.loads(report.path.read_text()), mode)
    (task,) = report.tasks
    assert task.outcomes and {o.status for o in task.outcomes} <= {"add", "unsatisfied"}
    for outcome in task.outcomes:
        if outcome.status == "add":
            assert outcome.after_us < outcome.before_us * 0.97
    (file,) = (tmp_path / "bank").glob("*.jsonl")
    assert BankFile(file).env["device_type"] == "cuda" and BankFile(file).env["capability"]
    torch._dynamo.reset()
    config = make_config(mode="reduce-overhead", **{"tuning.bank_dir": str(tmp_path / "bank")})
    compiled = torch.compile(model, backend=airgraph.get_backend(config))
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):
            assert_close(compiled(x), expected)
    keys = {o.key for o in task.outcomes if o.status == "add"}
    torch._dynamo.reset()
    with torch.no_grad():
        report = airgraph.explain(model, x, config=make_config(**{"tuning.bank_dir": str(tmp_path / "bank")}))
    used = {k for s in report.graphs[0].segments for k in s.source.get("bank key", "").split(", ") if k}
    assert used == keys
