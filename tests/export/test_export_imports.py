"""Optional dependencies stay behind the shim; the runner side never imports torch; the CLI exports user modules."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from airgraph import cli
from tests.export.export_models import read_metadata

SNIPPET = """
import sys
import airgraph, airgraph.export, airgraph.export.runner, airgraph.cli
heavy = {"torch", "onnx", "onnxruntime", "onnxscript"}
assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))
airgraph.get_backend  # the backend loads torch on first use, still not onnx
assert "torch" in sys.modules and not {"onnx", "onnxruntime", "onnxscript"} & set(sys.modules)
assert callable(airgraph.dynamo_export) and "dynamo_export" in airgraph.__all__
print("ok")
"""


def test_import_airgraph_imports_neither_torch_nor_onnx():
    done = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


MODULE = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 4)
        self.emb = torch.nn.Embedding(10, 16)

    def forward(self, x, ids):
        return self.proj(x) + self.proj(self.emb(ids)).sum(1, keepdim=True)
"""


def test_cli_exports_a_user_module_with_input_shapes(tmp_path, capsys):
    script = tmp_path / "user_model.py"
    script.write_text(MODULE)
    out = tmp_path / "out"
    args = ["export", f"{script}:Tiny", "--input", "2x3x16:float32", "--input", "2x5:int64", "--int-high", "10"]
    assert cli.main([*args, "--dynamic", "--export-path", str(out), "--export-name", "tiny"]) == 0
    text = capsys.readouterr().out
    assert "tiny.onnx" in text and "x float32[batch, seq, 16]" in text and "ids int64[batch, seq_2]" in text
    meta = read_metadata(out)
    assert [i["name"] for i in meta["inputs"]] == ["x", "ids"]
    assert set(meta["dynamic_dims"]) == {"batch", "seq", "seq_2"}
    assert cli.main(["run", str(out), "--check", "--output", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as got, np.load(out / "reference_outputs.npz") as ref:
        np.testing.assert_allclose(got["output"], ref["output"], rtol=1e-5, atol=1e-6)
        assert ref["output"].shape == (2, 3, 4)


EXAMPLE = """
import torch

def scaled(x, y, scale=1.0):
    return torch.relu(x @ y) * scale

def airgraph_example():
    return scaled, (torch.randn(4, 4), torch.randn(4, 4)), {"scale": 2.0}
"""


def test_cli_exports_a_function_example(tmp_path, capsys):
    """Without --input, MODEL is loaded as in `airgraph inspect`: airgraph_example() -> (fn, args, kwargs)."""
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE)
    out = tmp_path / "out"
    assert cli.main(["export", str(script), "--dynamic", "--export-path", str(out)]) == 0
    assert "args_0 float32[batch, seq]" in capsys.readouterr().out
    assert cli.main(["run", str(out), "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out
