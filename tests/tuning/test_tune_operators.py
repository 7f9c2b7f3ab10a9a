"""Operator tuning's units and choices: every implementation a choice puts in a graph computes what eager does,
keeps the node's layout, and prepared weights follow in-place updates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.lowering.aten import compile_aten
from airgraph.tuning import linear
from airgraph.tuning.candidates import op_candidates
from airgraph.tuning.measure import TOLERANCES
from airgraph.tuning.operators import apply_op_choices, find_units, op_graph
from tests.helpers import assert_close

CPU = torch.device("cpu")


def aten_graph(fn, *args):
    """``fn`` traced to ATen with fake values in node.meta, returning a tuple (as a segment's graph has them)."""
    return make_fx(lambda *a: (fn(*a),), tracing_mode="fake")(*args)


def run(gm, *args):
    return compile_aten(gm)(list(args))


def mlp(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2)  # addmm(b1, x, t(w1)), then mm(h, t(w2))


@pytest.fixture
def mlp_args():
    torch.manual_seed(0)
    return torch.randn(8, 32), torch.randn(64, 32), torch.randn(64), torch.randn(16, 64)


def test_weight_gemms_are_found_with_their_real_shapes(mlp_args):
    gm = aten_graph(mlp, *mlp_args)
    units = find_units(gm)
    assert [(u.category, u.op_type) for u in units] == [("linear", "addmm"), ("linear", "mm")]
    op_gm = op_graph(units[0])
    assert [n.op for n in op_gm.graph.nodes] == ["placeholder"] * 3 + ["call_function"] * 2 + ["output"]
    x, w1, b1, _ = mlp_args
    assert_close(run(op_gm, x, w1, b1)[0], F.linear(x, w1, b1))
    assert not find_units(aten_graph(lambda a, b: a @ b, torch.randn(4, 8), torch.randn(8, 4)))  # contiguous: none


@pytest.mark.parametrize("impl", ["onednn-packed", "mkl-packed", "pretransposed"])
def test_each_weight_gemm_implementation_matches_eager(mlp_args, impl):
    if not linear.available(impl, torch.device("cpu"), torch.float32):
        pytest.skip(f"{impl} is not in this build of PyTorch")
    gm = aten_graph(mlp, *mlp_args)
    choice = {"tune_mode": "Impl", "name": impl, "options": {"impl": impl}}
    tuned = apply_op_choices(gm, {u.node.name: choice for u in find_units(gm)})
    targets = [n.target for n in tuned.graph.nodes if n.op == "call_function"]
    assert targets.count(linear.TUNED_LINEAR) == 2 and torch.ops.aten.addmm.default not in targets
    assert_close(run(tuned, *mlp_args)[0], mlp(*mlp_args))


def test_prepared_weights_follow_in_place_updates(mlp_args):
    x, w1, b1, _ = mlp_args
    w = w1.clone()
    first = linear.tuned_linear(x, w, b1, "onednn-packed", "")
    assert_close(first, F.linear(x, w, b1))
    with torch.no_grad():
        w.mul_(2)  # an optimizer step, a load_state_dict: the packed copy must not go stale
    assert_close(linear.tuned_linear(x, w, b1, "onednn-packed", ""), F.linear(x, w, b1))
    assert_close(linear.tuned_linear(x, w1, b1, "pretransposed", ""), F.linear(x, w1, b1))  # another tensor


def decode_mlp(x, w1, w2, b2):
    return F.linear(F.relu(F.linear(x, w1)), w2, b2)  # mm(x, t(w1)), then addmm(b2, h, t(w2))


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cuda_candidates_are_offered_where_they_differ_and_match_eager(rows, dtype):
    """cuBLAS, cuBLASLt and split-K (linear.py) are plain ATen calls: checked here on the CPU against eager, in the
    dtypes decode runs in; offered on CUDA only, each where it differs from what ATen does by itself."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(512, 1024) / 1024**0.5, torch.randn(1024, 512) / 512**0.5  # nn.Linear's scale
    args = tuple(a.to(dtype) for a in (torch.randn(rows, 1024), w1, w2, torch.randn(1024)))
    gm = aten_graph(decode_mlp, *args)
    up, down = find_units(gm)
    assert (up.op_type, down.op_type) == ("mm", "addmm")
    cuda = torch.device("cuda")
    names = [[c["name"] for c in op_candidates(unit, cuda, inference=True)] for unit in (up, down)]
    lt = ["cublaslt"] if rows > 1 else []  # ATen sends a one-row addmm to cuBLAS, not cuBLASLt
    assert names == [["pretransposed", *lt, "split-k 2", "split-k 4"], ["pretransposed", "cublas", "split-k 2"]]
    assert all(c["name"] not in ("cublas", "cublaslt", "split-k 2") for c in op_candidates(up, CPU, True))
    if dtype == torch.float32:  # the CPU's set stays as it was
        assert [c["name"] for c in op_candidates(up, CPU, True)][:2] == ["onednn-packed", "mkl-packed"]
    expected = decode_mlp(*args)
    for unit, cands in ((up, op_candidates(up, cuda, True)), (down, op_candidates(down, cuda, True))):
        for cand in cands:  # within the tolerance the tuner checks candidates with
            tuned = apply_op_choices(gm, {unit.node.name: cand})
            torch.testing.assert_close(run(tuned, *args)[0], expected, **TOLERANCES[dtype], msg=cand["name"])


def test_split_k_refuses_a_reduction_it_cannot_cut():
    x, w = torch.randn(1, 1000), torch.randn(8, 1000)
    with pytest.raises(ValueError, match=r"split-k: 3 slices of a \(1, 1000\) x \(1000, 8\) GEMM need K divisible"):
        linear.tuned_linear(x, w, None, "split-k", '{"splits": 3}')
    assert linear.split_k_shape(1, 8192, 8) and not linear.split_k_shape(32, 8192, 8)  # skinny only
    assert not linear.split_k_shape(1, 2048, 16)  # slices of 128: too short


def test_unknown_implementation_is_refused(mlp_args):
    x, w1, b1, _ = mlp_args
    with pytest.raises(ValueError, match="unknown implementation 'fast'; known: onednn-packed"):
        linear.tuned_linear(x, w1, b1, "fast", "")


def test_attention_kernels_match_and_keep_the_layout():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16).transpose(1, 2) for _ in range(3))  # (B, S, H, D) memory, as models have
    mask = torch.randn(2, 1, 8, 8) > 0

    def attention(q, k, v, mask):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)

    gm = aten_graph(attention, q, k, v, mask)
    (unit,) = find_units(gm)
    assert unit.category == "attention" and unit.current == "flash"
    (cand,) = op_candidates(unit, torch.device("cpu"), inference=True)
    assert cand["name"] == "math"
    tuned = apply_op_choices(gm, {unit.node.name: cand})
    out = run(tuned, q, k, v, mask)[0]
    expected = attention(q, k, v, mask)
    assert_close(out, expected)
    assert out.stride() == run(gm, q, k, v, mask)[0].stride()  # the graph's layout, whatever the kernel's


def test_conv_channels_last_matches_and_returns_the_traced_layout():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 8, 10, 10), torch.randn(4, 8, 3, 3), torch.randn(4)
    gm = aten_graph(lambda x, w, b: F.conv2d(x, w, b, padding=1), x, w, b)
    (unit,) = find_units(gm)
    (cand,) = op_candidates(unit, torch.device("cpu"), inference=True)
    tuned = apply_op_choices(gm, {unit.node.name: cand})
    assert any(n.kwargs.get("memory_format") == torch.channels_last for n in tuned.graph.nodes)
    out = run(tuned, x, w, b)[0]
    assert_close(out, F.conv2d(x, w, b, padding=1))
    assert out.is_contiguous()


def test_non_contiguous_matmul_operands_made_contiguous():
    a, b = torch.randn(3, 16, 8), torch.randn(3, 16, 8)
    gm = aten_graph(lambda a, b: torch.bmm(a, b.transpose(1, 2)), a, b)
    (unit,) = find_units(gm)
    assert unit.category == "matmul"
    tuned = apply_op_choices(gm, {unit.node.name: op_candidates(unit, torch.device("cpu"), True)[0]})
    assert_close(run(tuned, a, b)[0], torch.bmm(a, b.transpose(1, 2)))


def test_training_graphs_get_no_weight_choices(mlp_args):
    (unit, _) = find_units(aten_graph(mlp, *mlp_args))
    assert op_candidates(unit, torch.device("cpu"), inference=False) == []


def test_choices_for_nodes_that_are_not_tunable_are_refused(mlp_args):
    gm = aten_graph(mlp, *mlp_args)
    with pytest.raises(ValueError, match="not tunable here: gelu"):
        apply_op_choices(gm, {"gelu": {"tune_mode": "Impl", "name": "x", "options": {}}})


@pytest.mark.slow
def test_the_gemm_template_matches_eager(mlp_args):
    gm = aten_graph(mlp, *mlp_args)
    units = find_units(gm)
    choice = {
        "tune_mode": "Schedule",
        "name": "t",
        "options": {"impl": "template", "schedule": '{"cpp.gemm_max_k_slices": 0}'},
    }
    tuned = apply_op_choices(gm, {units[0].node.name: choice})
    assert_close(run(tuned, *mlp_args)[0], mlp(*mlp_args))
