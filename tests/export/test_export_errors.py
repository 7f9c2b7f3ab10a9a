"""Each refusal and failure of dynamo_export, and that a failed export leaves nothing that looks complete."""

from __future__ import annotations

import json
import os

import pytest
import torch

import airgraph
from airgraph import cli
from airgraph.export import ExportError, ExportPathError, exporter, layout
from airgraph.export.runner import RunError, load_export
from tests.export import export_models
from tests.export.export_models import DataDependent, GraphBreak, SeedModel, Unlowerable, line_of

MODELS_FILE = export_models.__file__


def _export(tmp_path, model=None, **kwargs):
    model = model or SeedModel()
    return airgraph.dynamo_export(torch.randn(2, 2), torch.randn(2, 2), model=model, **kwargs)


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if "staging" in p.name]


def test_graph_break_names_it_and_the_line(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="graph break") as info:
        airgraph.dynamo_export(torch.randn(3, 4), model=GraphBreak(), export_path=out)
    assert info.value.reason == "graph break"
    assert info.value.source == f"{MODELS_FILE}:{line_of('GRAPH_BREAK_LINE')}"
    assert info.value.source in str(info.value) and "graph_break()" in str(info.value)
    assert not out.exists() and not _leftovers(tmp_path)  # nothing written, not even the folder


def test_data_dependent_control_flow_names_it_and_the_line(tmp_path):
    with pytest.raises(ExportError, match="data-dependent control flow") as info:
        airgraph.dynamo_export(torch.randn(3, 4), model=DataDependent(), export_path=tmp_path / "out")
    assert info.value.source == f"{MODELS_FILE}:{line_of('DATA_DEPENDENT_LINE')}"
    assert "if x.sum() > 0:" in str(info.value) and "torch.where" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_unsupported_op_names_it_and_the_line(tmp_path):
    with pytest.raises(ExportError, match=r"unsupported op airgraph_export_test\.mystery") as info:
        airgraph.dynamo_export(torch.randn(3, 4), model=Unlowerable(), export_path=tmp_path / "out")
    assert info.value.reason == "unsupported op" and info.value.op == "airgraph_export_test.mystery.default"
    assert info.value.source == f"{MODELS_FILE}:{line_of('UNLOWERABLE_LINE')}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["", "  ", "a/b", "..", ".", "a\\b", "/abs", "../up"])
def test_export_name_with_a_path_is_refused(tmp_path, name):
    with pytest.raises(ExportPathError, match="export_name"):
        _export(tmp_path, export_path=tmp_path / "out", export_name=name)
    assert not (tmp_path / "out").exists()


def test_symlinked_export_path_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ExportPathError, match="symbolic link"):
        _export(tmp_path, export_path=tmp_path / "link")
    assert list(real.iterdir()) == []


def test_symlinked_target_file_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "precious.bin"
    out.mkdir()
    elsewhere.write_bytes(b"do not overwrite")
    (out / "export.onnx").symlink_to(elsewhere)
    with pytest.raises(ExportPathError, match="is a symbolic link"):
        _export(tmp_path, export_path=out)
    assert elsewhere.read_bytes() == b"do not overwrite"
    assert sorted(p.name for p in out.iterdir()) == ["export.onnx"]


def test_failed_write_keeps_the_previous_export_and_user_files(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    first = _export(tmp_path, export_path=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(exporter, "render_pbtxt", broken)
    with pytest.raises(OSError, match="disk full"):
        _export(tmp_path, export_path=out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched, still the first export
    assert not _leftovers(tmp_path) and load_export(out).metadata["created"] == first.metadata["created"]


def test_failed_commit_does_not_look_complete(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _export(tmp_path, export_path=out)
    real_replace = os.replace

    def fail_on_model(src, dst):
        if str(dst).endswith(".onnx"):
            raise OSError("interrupted")
        real_replace(src, dst)

    monkeypatch.setattr(layout.os, "replace", fail_on_model)
    with pytest.raises(OSError, match="interrupted"):
        _export(tmp_path, export_path=out)
    monkeypatch.undo()
    assert not (out / "export.json").exists()  # the old metadata went first: no complete-looking mix
    with pytest.raises(RunError, match="incomplete"):
        load_export(out)
    assert not _leftovers(tmp_path)
    _export(tmp_path, export_path=out)  # a new export into the same folder repairs it
    assert json.loads((out / "export.json").read_text())["model_file"] == "export.onnx"


def test_cli_export_errors(tmp_path, capsys):
    script = tmp_path / "breaks.py"
    script.write_text(
        "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        if x.sum() > 0:\n"
        "            return x\n        return -x\n"
    )
    out = tmp_path / "out"
    assert cli.main(["export", f"{script}:M", "--input", "2x3", "--export-path", str(out)]) == 1
    err = capsys.readouterr().err
    assert "data-dependent control flow" in err and f"{script}:5" in err
    assert cli.main(["export", f"{script}:M", "--input", "2x3", "--export-name", "a/b"]) == 2
    assert "export_name" in capsys.readouterr().err
    assert cli.main(["export", f"{script}:M", "--input", "2xthree"]) == 2
    assert "2x16" in capsys.readouterr().err
    assert not out.exists()
