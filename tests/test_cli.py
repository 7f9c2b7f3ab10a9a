"""The `airgraph` command, called in-process through airgraph.cli.main (one subprocess run for -m)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import airgraph
from airgraph import cli
from airgraph.bench import decode as bench
from airgraph.bench import streams
from airgraph.bench.results import write_json
from airgraph.cli import bench as cli_bench

# Fast settings: the micro model, direct ATen kernels, no Inductor compile.
FAST = ["--preset", "micro", "--kernel-backend", "aten", "--device", "cpu", "--no-progress"]
FAST_MODES = "eager,airgraph max-autotune,airgraph reduce-overhead"
RESULT_KEYS = {"device", "torch", "airgraph", "commit", "python", "timestamp", "settings", "results"}
MODE_KEYS = {
    "mode",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "tokens_per_s",
    "speedup_vs_eager",
    "compile_s",
    "graphs",
    "graphs_captured",
    "capture_keys",
    "segments",
    "max_abs_diff",
    "ok",
}


def _bench(tmp_path: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "results" / "bench.json"
    code = cli.main(["bench", *FAST, "--steps", "4", "--warmup", "1", "--output", str(out), *extra])
    text = capsys.readouterr().out
    return code, json.loads(out.read_text()), text


@pytest.mark.slow
def test_bench_writes_json_with_every_mode(tmp_path, capsys):
    code, result, text = _bench(tmp_path, capsys, "--modes", FAST_MODES)
    assert code == 0
    assert result.keys() >= RESULT_KEYS
    assert result["torch"] == torch.__version__
    settings = result["settings"]
    assert settings["modes"] == FAST_MODES.split(",")
    assert (settings["preset"], settings["steps"], settings["kernel_backend"]) == ("micro", 4, "aten")
    assert [r["mode"] for r in result["results"]] == FAST_MODES.split(",")
    for r in result["results"]:
        assert r.keys() >= MODE_KEYS
        assert r["ok"] is True
        assert len(r["samples_ms"]) == 4
        assert isinstance(r["speedup_vs_eager"], float) and r["speedup_vs_eager"] > 0
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
    eager, max_autotune, reduce_overhead = result["results"]
    assert eager["max_abs_diff"] == 0.0 and eager["compile_s"] is None and eager["graphs"] is None
    # One decode graph, compiled once (no recompiles across positions), as one segment.
    assert (max_autotune["graphs"], max_autotune["segments"], max_autotune["graphs_captured"]) == (1, 1, 0)
    assert max_autotune["compile_s"] > 0
    # On the CPU, reduce-overhead runs uncaptured and says why.
    assert reduce_overhead["graphs_captured"] == 0 and reduce_overhead["capture_keys"] == 0
    assert any("cpu" in reason for reason in reduce_overhead["uncaptured_reasons"])
    for mode in ("eager", "max-autotune", "reduce-overhead", "speedup", "captured"):
        assert mode in text
    assert "✓" in text and "✗" not in text


def test_bench_wraps_positions_past_max_seq_len():
    # micro: max_seq_len 32, prompt 8 -> 24 positions per pass; 1 + 2 + 40 calls wrap once.
    result = bench.run_bench(
        preset="micro", steps=40, warmup=2, modes="eager,max-autotune", device="cpu", kernel_backend="aten"
    )
    assert result["settings"]["wraps"] == 1
    assert all(r["ok"] for r in result["results"])
    assert result["results"][1]["graphs"] == 1  # the re-prefill does not recompile the decode step


def test_parse_modes_aliases_and_errors():
    assert bench.parse_modes("eager, compile,max-autotune,eager") == (
        "eager",
        "torch.compile",
        "airgraph max-autotune",
    )
    with pytest.raises(ValueError, match="unknown benchmark mode 'fast'"):
        bench.parse_modes("eager,fast")
    assert "torch.compile reduce-overhead" not in bench.default_modes("cpu")
    assert "torch.compile reduce-overhead" in bench.default_modes("cuda")


def test_bench_usage_errors_exit_2(capsys):
    assert cli.main(["bench", *FAST, "--modes", "eager,warp-speed"]) == 2
    assert "warp-speed" in capsys.readouterr().err
    assert cli.main(["bench", *FAST, "--modes", "torch.compile reduce-overhead"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert cli.main(["bench", "--preset", "huge", "--device", "cpu", "--no-progress"]) == 2
    assert "huge" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_torch_compile_inductor(tmp_path, capsys):
    """The one Inductor compile of this file: torch.compile's default backend on the micro model."""
    code, result, _ = _bench(tmp_path, capsys, "--modes", "eager,torch.compile", "--steps", "3")
    assert code == 0
    compiled = result["results"][1]
    assert compiled["mode"] == "torch.compile" and compiled["ok"] is True
    assert compiled["compile_s"] > 0 and compiled["graphs"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_cuda_reduce_overhead_captures(tmp_path, capsys):
    out = tmp_path / "cuda.json"
    args = ["--preset", "micro", "--kernel-backend", "aten", "--no-progress", "--steps", "5", "--warmup", "2"]
    modes = "eager,airgraph reduce-overhead,torch.compile reduce-overhead"
    assert cli.main(["bench", *args, "--device", "cuda", "--modes", modes, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    ours = result["results"][1]
    assert ours["ok"] and ours["graphs_captured"] == ours["graphs"] == 1 and ours["capture_keys"] == 1
    assert result["results"][2]["ok"]


@pytest.mark.slow
def test_demo_writes_report_and_notes_cpu(tmp_path, capsys, monkeypatch):
    fast = {"preset": "micro", "steps": 3, "warmup": 1, "kernel_backend": "aten", "modes": FAST_MODES}
    monkeypatch.setattr(cli_bench, "DEMO_SETTINGS", {**cli_bench.DEMO_SETTINGS, **fast})
    monkeypatch.setattr(bench, "resolve_device", lambda device: torch.device("cpu"))
    # Where a GPU is available the demo still runs each part on the one device it names (on the GPU machine the
    # multi-stream part resolved "auto" again and ran on the GPU).
    monkeypatch.setattr(streams, "resolve_device", lambda device: torch.device("cuda" if device == "auto" else device))
    out = tmp_path / "demo.json"
    assert cli.main(["demo", "--output", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "uncaptured" in text and "airgraph reduce-overhead" in text
    result = json.loads(out.read_text())
    assert result.keys() >= RESULT_KEYS
    assert len(result["results"]) == 3 and all(r["ok"] for r in result["results"])
    assert result["multistream"]["settings"]["device_type"] == "cpu"


@pytest.mark.slow
def test_demo_exits_1_when_outputs_differ(tmp_path, capsys, monkeypatch):
    fast = {"preset": "micro", "steps": 2, "warmup": 0, "kernel_backend": "aten", "modes": "eager,max-autotune"}
    monkeypatch.setattr(cli_bench, "DEMO_SETTINGS", {**cli_bench.DEMO_SETTINGS, **fast})
    monkeypatch.setattr(bench, "resolve_device", lambda device: torch.device("cpu"))
    compile_mode = bench._compile

    def off_by_a_bit(model, mode, base):  # a compiled mode whose logits drift from eager's
        step, backend = compile_mode(model, mode, base)
        return (step if mode == "eager" else lambda *a: step(*a) + 1e-2), backend

    monkeypatch.setattr(bench, "_compile", off_by_a_bit)
    out = tmp_path / "demo.json"
    assert cli.main(["demo", "--output", str(out), "--no-progress"]) == 1
    assert "differ from eager" in capsys.readouterr().out
    eager, drifted = json.loads(out.read_text())["results"]
    assert eager["ok"] is True and drifted["ok"] is False
    assert drifted["max_abs_diff"] == pytest.approx(1e-2, rel=1e-3)


def test_inspect_tiny_llama_tables_and_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    args = ["inspect", "tiny-llama", "--preset", "micro", "--kernel-backend", "aten", "--device", "cpu"]
    assert cli.main([*args, "--mode", "reduce-overhead", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("passes", "segments", "nodes", "remove_noops", "dead_code_elimination", "placement", "uncaptured"):
        assert word in text
    data = json.loads(out.read_text())
    assert data["config"]["mode"] == "reduce-overhead" and data["config"]["kernel_backend"] == "aten"
    (graph,) = data["graphs"]
    assert graph["kind"] == "inference" and graph["captured"] is False
    assert graph["segments"] and graph["passes"]
    assert {p["name"] for p in graph["passes"]} >= {"remove_noops", "dead_code_elimination"}
    for node in graph["nodes"]:
        assert {"name", "target", "stream", "placement", "segment"} <= node.keys()
    assert "aten.index_copy.default" in {n["target"] for n in graph["nodes"]}  # the KV cache update
    # every node is listed in the table, placeholders included (long names end in an ellipsis)
    assert all(n["name"][:16] in text for n in graph["nodes"])


def test_inspect_tiny_llama_prefill(capsys):
    args = ["inspect", "tiny-llama", "--preset", "micro", "--kernel-backend", "aten", "--device", "cpu"]
    assert cli.main([*args, "--phase", "prefill", "--prompt-len", "5", "--batch", "2"]) == 0
    text = capsys.readouterr().out
    assert "inference" in text and "aten.embedding.default" in text and "aten.silu.default" in text


EXAMPLE = """
import torch

def scaled(x, y, scale=1.0):
    return torch.relu(x @ y) * scale

def airgraph_example():
    return scaled, (torch.randn(4, 4), torch.randn(4, 4)), {"scale": 2.0}

def other():
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()), [torch.randn(2, 3)]
"""


def test_inspect_python_file(tmp_path, capsys):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE)
    out = tmp_path / "example.json"
    assert cli.main(["inspect", str(script), "--kernel-backend", "aten", "--json", str(out)]) == 0
    assert "aten.relu" in capsys.readouterr().out
    targets = {n["target"] for n in json.loads(out.read_text())["graphs"][0]["nodes"]}
    assert {"aten.mm.default", "aten.relu.default"} <= targets


def test_inspect_module_attr(tmp_path, capsys, monkeypatch):
    (tmp_path / "ag_cli_example_mod.py").write_text(EXAMPLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "ag_cli_example_mod:other", "--kernel-backend", "aten"]) == 0
    assert "aten.tanh.default" in capsys.readouterr().out
    assert cli.main(["inspect", "ag_cli_example_mod:missing", "--kernel-backend", "aten"]) == 2
    assert "missing()" in capsys.readouterr().err


def test_inspect_file_without_example_exits_2(tmp_path, capsys):
    script = tmp_path / "plain.py"
    script.write_text("x = 1\n")
    assert cli.main(["inspect", str(script)]) == 2
    err = capsys.readouterr().err
    assert "airgraph_example" in err and "(fn_or_module, args)" in err


def test_inspect_bad_targets_exit_2(tmp_path, capsys):
    script = tmp_path / "wrong.py"
    script.write_text("def airgraph_example():\n    return 42\n")
    assert cli.main(["inspect", str(script)]) == 2
    assert "returned int" in capsys.readouterr().err
    assert cli.main(["inspect", str(tmp_path / "absent.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["inspect", "no_such_module_for_airgraph"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert cli.main(["inspect", "tiny-llama", "--mode", "fastest"]) == 2
    assert "CompilerConfig.mode" in capsys.readouterr().err


def test_config_from_sets_what_the_command_line_gave_and_refuses_bad_values():
    from airgraph.cli.common import CliError, config_from

    config = config_from({"mode": "reduce-overhead", "tuning.budget_s": 5.0, "kernel_backend": None})
    assert (config.mode, config.tuning.budget_s) == ("reduce-overhead", 5.0)
    assert config.kernel_backend == airgraph.CompilerConfig().kernel_backend  # None: the option's default
    with pytest.raises(CliError, match=r"tuning\.budget_s") as bad:
        config_from({"tuning.budget_s": -1.0})
    assert bad.value.code == 2


def test_argparse_errors_exit_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert cli.main(["bench", "--steps", "many"]) == 2
    assert "invalid int value" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0


def test_write_json_is_atomic_and_creates_folders(tmp_path):
    target = tmp_path / "a" / "b" / "r.json"
    assert write_json({"x": 1}, target) == target
    write_json({"x": 2}, target)
    assert json.loads(target.read_text()) == {"x": 2}
    assert [p.name for p in target.parent.iterdir()] == ["r.json"]  # no temporary file left behind


def test_python_dash_m_help_imports_no_torch():
    """`airgraph --help` answers at once: no torch (nor onnx) import, checked with python -X importtime."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "airgraph", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("demo", "bench", "inspect", "export", "run"):
        assert command in done.stdout
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "airgraph.cli" in imported
    assert not {name for name in imported if name.split(".")[0] in ("torch", "onnx", "onnxruntime", "numpy")}


@pytest.mark.slow
def test_bench_two_branch_model(tmp_path, capsys):
    out = tmp_path / "streams.json"
    code = cli.main(
        ["bench", "--model", "two-branch", "--device", "cpu", "--kernel-backend", "aten", "--steps", "3",
         "--output", str(out)]
    )  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    small = data["results"]["small"]
    assert small["ok"] is True and small["multi"]["streams"] == ["left", "right"] and small["single"]["streams"] == []
    assert "two-branch model" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="plans for CUDA only where there is no GPU")
def test_inspect_plans_for_cuda_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["inspect", "tiny-llama", "--preset", "micro", "--device", "cuda", "--kernel-backend", "aten"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    assert "planned on fake tensors" in capsys.readouterr().out
    (graph,) = json.loads(out.read_text())["graphs"]
    assert graph["planned"] is True and graph["device"].startswith("cuda")
    assert all(n["placement"] in ("device", "host") for n in graph["nodes"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans for CUDA only where there is no GPU")
def test_inspect_planning_a_data_dependent_branch_exits_1_naming_the_line(tmp_path, capsys):
    script = tmp_path / "branchy.py"
    script.write_text(
        "import torch\n\ndef branchy(x):\n    if x.sum() > 0:\n        return x + 1\n    return x - 1\n\n"
        "def airgraph_example():\n    return branchy, (torch.randn(4),)\n"
    )
    assert cli.main(["inspect", str(script), "--device", "cuda", "--kernel-backend", "aten"]) == 1
    err = capsys.readouterr().err
    assert f"data-dependent branch or value at {script}:4" in err and "--device cpu" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\ndef airgraph_example(:\n    pass\n", ":2: SyntaxError: invalid syntax"),
        ("x = 1\nraise RuntimeError('boom')\n", ":2: RuntimeError: boom (while loading the file)"),
    ],
)
def test_a_broken_example_file_is_one_line_naming_file_and_line(tmp_path, capsys, source, expected):
    script = tmp_path / "broken.py"
    script.write_text(source)
    assert cli.main(["inspect", str(script)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("usage: airgraph inspect")  # the subcommand's usage, not the top level's
    assert err.strip().splitlines()[-1] == f"airgraph inspect: error: {script}{expected}"
