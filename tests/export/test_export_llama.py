"""The tiny LLaMA (micro preset, prefill from empty caches) exported static and dynamic, equal to eager."""

from __future__ import annotations

import pytest
import torch

from airgraph import cli
from airgraph.export.runner import run_export
from airgraph.models import build_tiny_llama, prefill_inputs
from tests.export.export_models import read_metadata, run_without_torch, save_npz

pytestmark = pytest.mark.slow  # multi-process exports / Inductor compiles of the tiny LLaMA

SIZES = [(1, 3), (3, 5), (4, 16)]  # (batch, seq_len) other than the example's (2, 8)


def eager_prefill(model: torch.nn.Module, batch: int, seq_len: int, seed: int) -> tuple[dict, torch.Tensor]:
    tokens, pos = prefill_inputs(model.config, batch, seq_len, seed=seed)
    with torch.no_grad():
        model.reset_caches()
        logits = model(tokens, pos)
        model.reset_caches()
    return {"tokens": tokens.numpy(), "input_pos": pos.numpy()}, logits


@pytest.fixture(scope="module")
def dynamic_export(tmp_path_factory):
    """`airgraph export tiny-llama --dynamic`, example batch 2, seq_len 8, caches for 4 rows."""
    out = tmp_path_factory.mktemp("llama") / "dyn"
    args = ["export", "tiny-llama", "--preset", "micro", "--phase", "prefill", "--batch", "2", "--seq-len", "8"]
    code = cli.main([*args, "--max-batch-size", "4", "--dynamic", "--export-path", str(out), "--export-name", "llama"])
    assert code == 0
    return out


def test_static_export_via_cli_matches_eager(tmp_path, capsys):
    args = ["export", "tiny-llama", "--preset", "micro", "--batch", "1", "--seq-len", "8"]
    assert cli.main([*args, "--export-path", str(tmp_path), "--export-name", "static"]) == 0
    text = capsys.readouterr().out
    assert "static.onnx" in text and "tokens int64[1, 8]" in text and "airgraph run" in text
    meta = read_metadata(tmp_path)
    assert meta["model_file"] == "static.onnx" and meta["dynamic_dims"] == {}
    assert meta["inputs"] == [
        {"name": "tokens", "dtype": "int64", "shape": [1, 8]},
        {"name": "input_pos", "dtype": "int64", "shape": [8]},
    ]
    assert meta["outputs"] == [{"name": "output", "dtype": "float32", "shape": [1, 8, 64]}]
    # the KV caches are baked in as they were at export time: empty
    assert "layers.0.attention.kv_cache.k_cache" in meta["state"]["buffers"]
    model = build_tiny_llama("micro", max_batch_size=1)
    feeds, logits = eager_prefill(model, 1, 8, seed=0)
    got = run_export(tmp_path, feeds)["output"]
    torch.testing.assert_close(torch.from_numpy(got), logits, rtol=1e-4, atol=1e-5)
    assert cli.main(["run", str(tmp_path), "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


def test_dynamic_export_metadata(dynamic_export):
    meta = read_metadata(dynamic_export)
    assert meta["dynamic"] is True
    assert [i["shape"] for i in meta["inputs"]] == [["batch", "seq"], ["seq"]]
    assert meta["outputs"][0]["shape"] == ["batch", "seq", 64]
    dims = meta["dynamic_dims"]
    assert dims["batch"] == {"min": 2, "max": 4, "example": 2, "axes": ["tokens[0]"]}  # max: the cache rows
    assert dims["seq"]["axes"] == ["tokens[1]", "input_pos[0]"] and dims["seq"]["max"] == 32  # max_seq_len
    assert meta["pinned_dims"] == {}


@pytest.mark.parametrize(("batch", "seq_len"), SIZES)
def test_dynamic_export_runs_at_other_sizes(dynamic_export, batch, seq_len):
    model = build_tiny_llama("micro", max_batch_size=4)
    feeds, logits = eager_prefill(model, batch, seq_len, seed=batch * 100 + seq_len)
    got = run_export(dynamic_export, feeds)["output"]
    assert got.shape == (batch, seq_len, 64)
    torch.testing.assert_close(torch.from_numpy(got), logits, rtol=1e-4, atol=1e-5)


def test_dynamic_export_checked_without_torch(dynamic_export, tmp_path):
    model = build_tiny_llama("micro", max_batch_size=4)
    feeds, logits = eager_prefill(model, 3, 11, seed=7)
    inputs, expected = save_npz(tmp_path / "in.npz", feeds), save_npz(tmp_path / "out.npz", {"output": logits})
    done = run_without_torch(str(dynamic_export), "--inputs", str(inputs), "--expected", str(expected), "--check")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "output  float32[3, 11, 64]" in done.stdout
    # a sequence length that disagrees between the inputs is refused before onnxruntime runs
    bad = save_npz(tmp_path / "bad.npz", {**feeds, "input_pos": feeds["input_pos"][:5]})
    done = run_without_torch(str(dynamic_export), "--inputs", str(bad))
    assert done.returncode == 2 and "dynamic dim 'seq'" in done.stderr
