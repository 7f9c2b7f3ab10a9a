"""External weights past the threshold, and module paths recorded only when asked."""

from __future__ import annotations

import onnx
import pytest
import torch
from google.protobuf import text_format

import airgraph
from airgraph.export.check import load_export
from airgraph.export.layout import weight_file_names
from airgraph.export.runner import run_export
from tests.export.export_models import Stacked

TORCH_NODE_KEYS = ("namespace", "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy")


@pytest.fixture(scope="module")
def stacked_external(tmp_path_factory):
    """Stacked exported with module paths recorded and the threshold lowered to 0 (weights external)."""
    out = tmp_path_factory.mktemp("ext")
    config = airgraph.CompilerConfig()
    config.export.external_weights_threshold = 0
    config.export.experimental.enable_record_nn_module_stack = True
    model, x = Stacked().eval(), torch.randn(3, 64)
    result = airgraph.dynamo_export(x, model=model, export_path=out, export_name="stacked", config=config)
    return out, model, x, result


def test_one_file_per_weight_named_after_it(stacked_external):
    out, model, _, result = stacked_external
    meta = result.metadata
    assert meta["weights"]["external"] is True and meta["weights"]["threshold_bytes"] == 0
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    assert set(tensors) <= set(meta["weights"]["files"])
    for name, tensor in tensors.items():
        file = out / meta["weights"]["files"][name]
        assert file.name == name  # "layers.0.attn.wq.weight" is a safe file name already
        assert file.stat().st_size == tensor.numel() * tensor.element_size()
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    model_file = out / "stacked.onnx"
    assert model_file.stat().st_size < total / 2  # the graph only
    proto = onnx.load(str(model_file), load_external_data=False)
    external = {t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert set(tensors) <= external
    onnx.checker.check_model(str(model_file))


def test_external_weights_run_in_onnxruntime(stacked_external):
    out, model, x, _ = stacked_external
    got = run_export(out, {"x": x.numpy()})["output"]
    torch.testing.assert_close(torch.from_numpy(got), model(x).detach(), rtol=1e-4, atol=1e-5)


def test_pbtxt_names_weight_files(stacked_external):
    out = stacked_external[0]
    text = (out / "dynamo.pbtxt").read_text()
    proto = text_format.Parse(text, onnx.ModelProto())
    wq = next(t for t in proto.graph.initializer if t.name == "layers.0.attn.wq.weight")
    assert "float32[64, 64], 16384 bytes" in wq.doc_string and "data in layers.0.attn.wq.weight" in wq.doc_string
    assert {e.key for e in wq.external_data} >= {"location", "length"}
    assert not wq.raw_data


def test_module_paths_recorded_when_asked(stacked_external):
    out = stacked_external[0]
    proto = onnx.load(str(out / "stacked.onnx"), load_external_data=False)
    paths = []
    for node in proto.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        assert "module_path" in props, node  # every node
        assert not any(key in props for key in TORCH_NODE_KEYS)  # normalized to one key
        paths.append(props["module_path"])
    assert {"layers.0.attn.wq", "layers.0.attn.wo", "layers.1.attn.wq", "layers.1.norm"} <= set(paths)
    assert load_export(out).metadata["module_paths"] == {"recorded": True, "key": "module_path"}


def test_module_paths_absent_by_default_and_weights_inline(tmp_path):
    model, x = Stacked().eval(), torch.randn(3, 64)
    result = airgraph.dynamo_export(x, model=model, export_path=tmp_path)
    assert result.metadata["weights"]["external"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(result.files)  # no weight files
    proto = onnx.load(str(tmp_path / "export.onnx"))
    for node in proto.graph.node:
        keys = {p.key for p in node.metadata_props}
        assert "module_path" not in keys and not keys & set(TORCH_NODE_KEYS)
        assert not any(k.startswith("pkg.torch.onnx") for k in keys)


def test_weight_file_names_are_safe_and_unique():
    names = ["a.weight", "A.WEIGHT", "x/y:z", "../up", ".hidden", "export.json", "n" * 300, ""]
    files = weight_file_names(names, reserved={"export.json", "export.onnx"})
    assert files["a.weight"] == "a.weight" and files["A.WEIGHT"] == "A.WEIGHT_2"  # case-insensitive file systems
    assert files["x/y:z"] == "x_y_z" and files["../up"] == "_._up" and files[".hidden"] == "_hidden"
    assert files["export.json"] == "export.json_2" and len(files["n" * 300]) <= 200 and files[""] == "_"
    assert len(set(files.values())) == len(names)
    assert all("/" not in f and "\\" not in f and not f.startswith(".") for f in files.values())
