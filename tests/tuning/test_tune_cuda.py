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


def test_device_time_hides_the_hosts_launching_as_a_replay_does(cuda_device):
    """CudaRuntime.time counts the host launching a call's kernels; device_time (the tuner's clock for a graph
    reduce-overhead replays) hides it behind a spinning stream, and may overwrite the L2 cache first."""
    import time

    from airgraph.runtime.device import CUDA

    x = torch.randn(1 << 16, device=cuda_device)

    def host_bound(args):  # the host takes 2 ms before it launches one tiny kernel
        time.sleep(0.002)
        return args[0].add(1)

    assert CUDA.time(host_bound, [x], 5) > 1.5e-3
    assert CUDA.device_time(host_bound, [x], 5) < 0.5e-3
    assert CUDA.device_time(host_bound, [x], 5, flush_l2=True) < 0.5e-3
    assert CUDA.l2_bytes(cuda_device) >= 1 << 20


def _decode_mlp(x, w1, w2, b2):
    return F.linear(F.relu(F.linear(x, w1)), w2, b2)  # mm(x, t(w1)), addmm(b2, h, t(w2)): a decode step's GEMMs


@pytest.mark.parametrize("rows", [1, 4])
def test_every_cuda_gemm_candidate_matches_eager_at_decode_shapes(cuda_device, rows):
    """The 1B preset's MLP shapes (hidden 2048, intermediate 8192) in bfloat16: every candidate CUDA offers (cuBLAS
    or cuBLASLt, split-K, a pre-transposed weight) equals eager within the tuner's tolerance."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from airgraph.lowering.aten import compile_aten
    from airgraph.tuning.candidates import op_candidates
    from airgraph.tuning.measure import TOLERANCES
    from airgraph.tuning.operators import apply_op_choices, find_units

    torch.manual_seed(0)
    w1, w2 = torch.randn(8192, 2048) / 2048**0.5, torch.randn(2048, 8192) / 8192**0.5
    args = [t.to(cuda_device, torch.bfloat16) for t in (torch.randn(rows, 2048), w1, w2, torch.randn(2048))]
    gm = make_fx(lambda *a: (_decode_mlp(*a),), tracing_mode="fake")(*args)
    expected = _decode_mlp(*args)
    offered = set()
    for unit in find_units(gm):
        for cand in op_candidates(unit, cuda_device, inference=True):
            if cand["name"] == "template":  # the first test's (a template that fails to compile is dropped)
                continue
            offered.add(cand["name"])
            out = compile_aten(apply_op_choices(gm, {unit.node.name: cand}))(list(args))[0]
            torch.testing.assert_close(out, expected, **TOLERANCES[torch.bfloat16], msg=cand["name"])
    assert {"pretransposed", "cublas", "split-k 2", "split-k 4", "split-k 8"} <= offered
    assert ("cublaslt" in offered) == (rows > 1)


def test_decode_gemms_tune_in_reduce_overhead_on_the_replay_clock(tmp_path, cuda_device, monkeypatch):
    """A decode step's GEMMs (one row, bfloat16), tuned where reduce-overhead replays the graph: each unit measured
    with its CUDA candidates on the replay clock, the bank written, and a later compile runs the bank's choices
    inside its CUDA graph, equal to eager."""
    from airgraph.tuning import measure

    monkeypatch.setattr(measure, "NOISY", float("inf"))  # every measurement a verdict: the bank file is written
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 8192, bias=False), torch.nn.SiLU(), torch.nn.Linear(8192, 2048, bias=False)
    )
    model = model.to(cuda_device, torch.bfloat16).eval()
    x = torch.randn(1, 2048, device=cuda_device, dtype=torch.bfloat16)
    config = make_config(mode="reduce-overhead")
    report = airgraph.tune(model, x, mode="op", bank_dir=tmp_path / "bank", work_path=tmp_path, config=config)
    validate(json.loads(report.path.read_text()), "op")
    assert len(report.outcomes) == 2 and {o.status for o in report.outcomes} <= {"add", "unsatisfied"}
    for outcome in report.outcomes:
        assert {"default", "split-k 2", "split-k 4", "split-k 8"} <= set(outcome.measured), outcome.name
    torch._dynamo.reset()
    later = make_config(mode="reduce-overhead", **{"tuning.bank_dir": str(tmp_path / "bank")})
    compiled = torch.compile(model, backend=airgraph.get_backend(later))
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):
            assert_close(compiled(x), expected)
