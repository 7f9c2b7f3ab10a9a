"""The `airgraph` command line, called in-process (and once as `python -m airgraph`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airgraph.cli import main

FAST_BENCH = ["--preset", "micro", "--steps", "3", "--warmup", "1", "--kernel-backend", "aten", "--no-progress"]


def test_python_dash_m_help():
    done = subprocess.run([sys.executable, "-m", "airgraph", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert all(cmd in done.stdout for cmd in ("demo", "bench", "inspect"))


def test_bench_writes_json_with_every_mode(tmp_path, capsys):
    out = tmp_path / "bench.json"
    modes = "eager,airgraph max-autotune,airgraph reduce-overhead"
    code = main(["bench", *FAST_BENCH, "--modes", modes, "--device", "cpu", "--output", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert {"device", "torch", "airgraph", "commit", "settings", "results"} <= set(data)
    assert [r["mode"] for r in data["results"]] == modes.split(",")
    for r in data["results"]:
        assert r["ok"] is True
        assert isinstance(r["speedup_vs_eager"], float) and r["speedup_vs_eager"] > 0
    airgraph_rows = [r for r in data["results"] if r["mode"].startswith("airgraph")]
    assert all(r["segments"] >= 1 for r in airgraph_rows)
    printed = capsys.readouterr().out
    assert "airgraph" in printed and "speedup" in printed


def test_bench_with_inductor_compares_against_torch_compile(tmp_path):
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "--preset", "micro", "--steps", "2", "--warmup", "1", "--no-progress", "--device", "cpu",
         "--modes", "eager,torch.compile,airgraph max-autotune", "--output", str(out)]
    )  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    assert all(r["ok"] for r in data["results"])
    assert data["settings"]["kernel_backend"] == "inductor"


def test_bench_rejects_unknown_mode(capsys):
    assert main(["bench", *FAST_BENCH, "--modes", "warp-speed"]) == 2
    assert "warp-speed" in capsys.readouterr().err


def test_inspect_tiny_llama_tables_and_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(
        [
            "inspect",
            "tiny-llama",
            "--preset",
            "micro",
            "--kernel-backend",
            "aten",
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "remove_noops" in printed and "dead_code_elimination" in printed  # passes table
    assert "placement" in printed and "segment" in printed  # nodes / segments tables
    data = json.loads(out.read_text())
    (graph,) = data["graphs"]
    assert {"nodes", "segments", "passes", "captured"} <= set(graph)
    assert all({"name", "target", "stream", "placement", "segment"} <= set(n) for n in graph["nodes"])
    assert any(n["target"].startswith("aten.") for n in graph["nodes"])


def test_inspect_a_script_file(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(
        "import torch\n"
        "def airgraph_example():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())\n"
        "    return model, (torch.randn(2, 4),)\n"
    )
    assert main(["inspect", str(script), "--kernel-backend", "aten"]) == 0
    assert "aten.tanh.default" in capsys.readouterr().out


def test_inspect_script_without_example_function(tmp_path, capsys):
    script = tmp_path / "empty.py"
    script.write_text("x = 1\n")
    assert main(["inspect", str(script)]) == 2
    err = capsys.readouterr().err
    assert "airgraph_example" in err and "does not define" in err


def test_inspect_bad_mode_is_a_usage_error(capsys):
    assert main(["inspect", "tiny-llama", "--mode", "fast"]) == 2
    assert "CompilerConfig.mode: invalid value 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["frobnicate"], ["bench", "--steps", "many"], []])
def test_argparse_errors_exit_2(argv):
    assert main(argv) == 2
