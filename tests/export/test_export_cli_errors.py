"""What a new user hits at the command line: refused paths before any work, missing extras, missing folders,
one graph dump per failure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airgraph import cli
from airgraph.cli import export as cli_export


def test_an_export_path_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    target = tmp_path / "model.onnx"
    target.write_text("not a folder")

    def no_tracing():
        raise AssertionError("the exporter was loaded before the path was checked")

    monkeypatch.setattr(cli_export, "_exporter", no_tracing)
    assert cli.main(["export", "tiny-llama", "--export-path", str(target)]) == 2
    assert f"export_path {target} exists and is not a folder" in capsys.readouterr().err
    assert target.read_text() == "not a folder"


def test_running_a_missing_directory_says_so(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cli.main(["run", str(missing)]) == 2
    assert f"{missing}: no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["onnxscript", "onnx"])
def test_export_without_the_export_extra_names_it(tmp_path, module):
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"  # the package is not installed
        "from airgraph.cli import main\n"
        f"raise SystemExit(main(['export', 'tiny-llama', '--export-path', {str(tmp_path / 'out')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"needs the {module!r} package" in done.stderr and "pip install 'airgraph[export]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_api_names_the_extra_too():
    script = (
        "import sys, torch; sys.modules['onnxscript'] = None\n"
        "import airgraph\n"
        "try:\n"
        "    airgraph.dynamo_export(torch.ones(2), model=torch.nn.ReLU())\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "needs the 'onnxscript' package: pip install 'airgraph[export]'" in done.stdout, done.stderr[-2000:]


def test_a_data_dependent_failure_prints_the_partial_graph_once(tmp_path, capsys):
    source = tmp_path / "branchy.py"
    source.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.sum() > 0:\n"
        "            return x * 2\n"
        "        return x - 1\n"
        "def airgraph_example():\n"
        "    return M(), (torch.randn(4),)\n"
    )
    assert cli.main(["export", str(source), "--export-path", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("class GraphModule") == 1
    assert f"data-dependent control flow at {source}:4" in err
