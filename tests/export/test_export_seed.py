"""The seed's single-card example: exported, then run by onnxruntime in processes that never import torch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format

import airgraph
from airgraph.compat import torchair as tng
from airgraph.store import file_digest
from tests.export.export_models import SeedModel, read_metadata, run_without_torch, save_npz

EXPECTED_FILES = {"export.onnx", "dynamo.pbtxt", "export.json", "reference_inputs.npz", "reference_outputs.npz"}


@pytest.fixture(scope="module")
def seed_export(tmp_path_factory):
    """The seed example, the TorchAir way: compat name, default export_path 'export_file' in the working dir."""
    workdir = tmp_path_factory.mktemp("seed")
    torch.manual_seed(0)
    model, x, y = SeedModel(), torch.randn(2, 2), torch.randn(2, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        result = tng.dynamo_export(x, y, model=model, dynamic=False)
    return workdir / "export_file", model, (x, y), result


def test_layout_and_result(seed_export):
    export_dir, _, _, result = seed_export
    assert {p.name for p in export_dir.iterdir()} == EXPECTED_FILES  # no weight files: under the threshold
    assert sorted(result.files) == sorted(EXPECTED_FILES)
    assert result.model_path == export_dir / "export.onnx"
    assert not [p for p in export_dir.parent.iterdir() if "staging" in p.name]


def test_runs_without_torch_and_matches_eager(seed_export, tmp_path):
    export_dir, model, (x, y), _ = seed_export
    out = tmp_path / "out.npz"
    done = run_without_torch(str(export_dir), "--check", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert "check: ok" in done.stdout and "output  float32[2, 2]" in done.stdout
    with np.load(out) as got:
        torch.testing.assert_close(torch.from_numpy(got["output"]), model(x, y).detach())


def test_airgraph_run_dispatches_before_torch(seed_export):
    export_dir = seed_export[0]
    done = run_without_torch("run", str(export_dir), "--check", module="airgraph")
    assert done.returncode == 0, done.stderr
    assert "check: ok" in done.stdout


def test_run_check_other_inputs_and_mismatch(seed_export, tmp_path):
    export_dir, model, _, _ = seed_export
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    inputs = save_npz(tmp_path / "in.npz", {"x": x, "y": y})
    good = save_npz(tmp_path / "good.npz", {"output": model(x, y).detach()})
    bad = save_npz(tmp_path / "bad.npz", {"output": model(x, y).detach() + 1e-2})
    done = run_without_torch(str(export_dir), "--inputs", str(inputs), "--expected", str(good), "--check")
    assert done.returncode == 0, done.stderr
    done = run_without_torch(str(export_dir), "--inputs", str(inputs), "--expected", str(bad), "--check")
    assert done.returncode == 1 and "FAILED" in done.stdout and "max abs diff 0.01" in done.stdout
    # --check with other inputs needs the outputs they should give
    done = run_without_torch(str(export_dir), "--inputs", str(inputs), "--check")
    assert done.returncode == 2 and "--expected" in done.stderr


def test_metadata_fields(seed_export):
    export_dir = seed_export[0]
    meta = read_metadata(export_dir)
    assert (meta["format"], meta["format_version"], meta["export_name"], meta["rank"]) == (
        "airgraph-export",
        1,
        "export",
        None,
    )
    assert meta["model_file"] == "export.onnx" and meta["opset"] >= 18
    assert meta["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [2, 2]},
        {"name": "y", "dtype": "float32", "shape": [2, 2]},
    ]
    assert meta["outputs"] == [{"name": "output", "dtype": "float32", "shape": [2, 2]}]
    assert meta["dynamic"] is False and meta["dynamic_dims"] == {}
    assert meta["weights"]["external"] is False and meta["weights"]["files"] == {}
    assert meta["versions"]["torch"] == torch.__version__ and meta["versions"]["airgraph"] == airgraph.__version__
    assert meta["module_paths"] == {"recorded": False, "key": "module_path"}
    assert set(meta["files"]) == EXPECTED_FILES - {"export.json"}
    for rel, entry in meta["files"].items():
        assert entry["bytes"] == (export_dir / rel).stat().st_size and entry["sha256"] == file_digest(export_dir / rel)
    assert meta["timings_s"]["total"] > 0
    onnx.checker.check_model(str(export_dir / "export.onnx"))


def test_pbtxt_parses_and_summarizes_weights(seed_export):
    text = (seed_export[0] / "dynamo.pbtxt").read_text()
    proto = text_format.Parse(text, onnx.ModelProto())
    assert {n.op_type for n in proto.graph.node} >= {"Gemm", "Add"}
    weights = {t.name: t for t in proto.graph.initializer}
    assert set(weights) == {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}
    for tensor in weights.values():
        assert not tensor.raw_data and not tensor.float_data  # summarized, not dumped
        assert tensor.doc_string.startswith("airgraph summary: float32[") and "sha256" in tensor.doc_string
    assert "float32[2, 2], 16 bytes" in weights["linear1.weight"].doc_string
    assert "raw_data" not in text and "float_data" not in text
    # the model itself does hold the weights
    model = onnx.load(str(seed_export[0] / "export.onnx"))
    assert all(t.raw_data or t.float_data for t in model.graph.initializer)


def test_dynamic_seed_pins_feature_dim(tmp_path):
    """dynamic=True: dim 0 is symbolic, dim 1 is pinned by Linear(2, 2) and says so."""
    model, x, y = SeedModel(), torch.randn(3, 2), torch.randn(3, 2)
    result = airgraph.dynamo_export(x, y, model=model, export_path=tmp_path, dynamic=True)
    meta = result.metadata
    assert meta["inputs"][0]["shape"] == ["batch", 2] and meta["outputs"][0]["shape"] == ["batch", 2]
    assert meta["dynamic_dims"]["batch"]["axes"] == ["x[0]", "y[0]"]
    assert meta["pinned_dims"] == {"x[1]": 2, "y[1]": 2}
    x5, y5 = torch.randn(5, 2), torch.randn(5, 2)
    inputs = save_npz(tmp_path / "in5.npz", {"x": x5, "y": y5})
    expected = save_npz(tmp_path / "out5.npz", {"output": model(x5, y5).detach()})
    done = run_without_torch(str(tmp_path), "--inputs", str(inputs), "--expected", str(expected), "--check")
    assert done.returncode == 0, done.stderr + done.stdout
