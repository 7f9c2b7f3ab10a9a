"""Layout-dependent reshapes (issue #14): views that torch.onnx's retraces disagree on export and run as eager."""

from __future__ import annotations

import onnx
import pytest
import torch

import airgraph
from airgraph.export import ExportError, convert
from airgraph.export.runner import run_export
from airgraph.export.views import contiguous_view_inputs
from airgraph.passes.base import PassResult
from tests.export import export_models
from tests.export.export_models import BiasedAttention, ReshapedThenUpdated, line_of

MERGES = ["reshape", "contiguous_view", "flatten"]


def _export_and_run(model: torch.nn.Module, x: torch.Tensor, out, **kwargs) -> tuple[dict, dict]:
    result = airgraph.dynamo_export(x, model=model, export_path=out, **kwargs)
    return result.metadata, run_export(out)


def _op_types(export_dir) -> list[str]:
    return [node.op_type for node in onnx.load(str(export_dir / "export.onnx")).graph.node]


@pytest.mark.parametrize("merge", MERGES)
def test_heads_merged_after_sdpa_export_and_match_eager(tmp_path, merge):
    model, x = BiasedAttention(merge).eval(), torch.randn(2, 7, 32)
    metadata, got = _export_and_run(model, x, tmp_path / "out")
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(torch.from_numpy(got["output"]), expected, rtol=1e-4, atol=1e-5)
    assert metadata["passes"]["contiguous_view_inputs"] >= 1
    ops = _op_types(tmp_path / "out")
    assert "Reshape" in ops and "Identity" not in ops  # the clones lowered to Identity and were optimized away


@pytest.mark.parametrize("merge", MERGES)
def test_without_the_pass_torch_onnx_refuses_the_view(tmp_path, monkeypatch, merge):
    """The failure the pass removes, named as what it is: torch.onnx failing on a view, at the user's line."""
    monkeypatch.setattr(convert, "contiguous_view_inputs", lambda gm: PassResult())
    with pytest.raises(ExportError, match="Cannot view a tensor") as info:
        airgraph.dynamo_export(torch.randn(2, 7, 32), model=BiasedAttention(merge).eval(), export_path=tmp_path)
    assert info.value.reason == "conversion failed" and "aten.view.default" in str(info.value)
    if merge == "reshape":
        assert info.value.source == f"{export_models.__file__}:{line_of('MERGE_HEADS_LINE')}"
        assert "y.reshape(b, n, -1)" in str(info.value)


def test_dynamic_batch_runs_at_other_sizes(tmp_path):
    model = BiasedAttention("reshape").eval()
    metadata, _ = _export_and_run(model, torch.randn(2, 7, 32), tmp_path / "out", dynamic=True)
    assert metadata["inputs"][0]["shape"] == ["batch", 7, 32]  # the bias pins the sequence length
    for batch in (1, 3, 5):
        x = torch.randn(batch, 7, 32)
        got = run_export(tmp_path / "out", {"x": x.numpy()})["output"]
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-4, atol=1e-5)


def test_a_reshape_updated_in_place_stays_a_view(tmp_path):
    model, x = ReshapedThenUpdated().eval(), torch.randn(3, 4)
    metadata, got = _export_and_run(model, x, tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got["output"]), model(x))
    assert metadata["passes"]["contiguous_view_inputs"] == 0


def test_pass_changes_only_computed_inputs_and_is_idempotent():
    program = torch.export.export(BiasedAttention("reshape").eval(), (torch.randn(2, 7, 32),), strict=True)
    result = contiguous_view_inputs(program.graph_module)
    changed = [line.split(" = ")[0] for line in result.details]
    targets = {n.name: n.target for n in program.graph.nodes}
    assert result.changed == len(changed) == 2  # the split of qkv's output, the merge of the heads
    assert {targets[name] for name in changed} == {torch.ops.aten.view.default, torch.ops.aten.reshape.default}
    for node in program.graph.nodes:
        if node.name in changed:
            clone = node.args[0]
            assert clone.target is torch.ops.aten.clone.default
            assert clone.kwargs == {"memory_format": torch.contiguous_format}
            assert clone.meta["val"].is_contiguous() and clone.meta["val"].shape == clone.args[0].meta["val"].shape
            assert clone.meta["nn_module_stack"] == node.meta["nn_module_stack"]
    assert contiguous_view_inputs(program.graph_module).changed == 0
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(program.module()(x), BiasedAttention("reshape").eval()(x))
