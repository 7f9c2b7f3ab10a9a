"""benchmarks/llm_roofline.py (#33): the bytes a decode step reads, the decode loop, the command line's errors, a
failing variant kept in its row, and the whole run on the tiny preset in a subprocess (every field, every compiled
variant's tokens equal eager's, --append)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from airgraph.models import LlamaConfig, TinyLlama

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "llm_roofline.py"


def _load():
    spec = importlib.util.spec_from_file_location("llm_roofline_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


roofline = _load()


def assert_rounded(stored: float, low: float, high: float, digits: int) -> None:
    """``stored`` is ``round(x, digits)`` for some x in [low, high]."""
    half = 0.5 * 10**-digits
    assert low - half - 1e-12 <= stored <= high + half + 1e-12, (stored, low, high, digits)


def test_weight_bytes_count_a_tied_matrix_once_and_an_untied_embedding_by_its_rows():
    untied = TinyLlama(LlamaConfig.preset("micro"), dtype=torch.bfloat16)
    params = sum(p.numel() for p in untied.parameters()) * 2
    table = 64 * 32 * 2  # vocab x dim, bf16
    assert roofline.weight_bytes(untied, 3) == {"weight_bytes": params - table + 3 * 32 * 2, "parameter_bytes": params}
    tied = TinyLlama(LlamaConfig.preset("micro", tie_embeddings=True), dtype=torch.bfloat16)
    assert roofline.weight_bytes(tied, 3) == {"weight_bytes": params - table, "parameter_bytes": params - table}
    one_b = TinyLlama(LlamaConfig.preset("1b"), device="meta", dtype=torch.bfloat16)
    assert roofline.weight_bytes(one_b, 1)["weight_bytes"] == 1_235_814_400 * 2


def test_kv_bytes_are_keys_and_values_of_every_layer():
    config = LlamaConfig.preset("1b")  # 16 layers, 8 KV heads of 64
    assert roofline.kv_bytes(config, 1, 256, 2) == 2 * 16 * 8 * 64 * 256 * 2
    assert roofline.kv_bytes(config, 8, 256, 2) == 8 * roofline.kv_bytes(config, 1, 256, 2)


def test_copy_bandwidth_on_the_cpu():
    copy = roofline.measure_copy(torch.device("cpu"), mib=4, repeats=3)
    assert copy["copied_right"] and copy["bytes_per_copy"] == 4 * 2**20 and len(copy["samples_gbps"]) == 3
    assert copy["copy_gbps"] == max(copy["samples_gbps"]) > 0


def test_the_decode_loop_makes_the_greedy_tokens():
    """gpt-fast's loop (the step fed its last token, the position advanced on the device) makes the tokens of a
    greedy decode that recomputes the whole sequence for every token."""
    model = TinyLlama(LlamaConfig.preset("tiny", max_seq_len=16), seed=1)
    model.setup_caches(2)
    prompt = torch.randint(0, 512, (2, 5), generator=torch.Generator().manual_seed(3))
    tokens, step_ms, loop_ms = roofline.generate(model, roofline.DecodeStep(model), prompt, 7)
    assert tokens.shape == (2, 7) and len(step_ms) == 6 and all(ms > 0 for ms in step_ms) and loop_ms > 0
    assert all(len(set(row)) >= 5 for row in tokens.tolist())  # not one token over and over: the check can fail
    sequence = prompt
    with torch.no_grad():
        for _ in range(7):
            model.reset_caches()
            logits = model(sequence, torch.arange(sequence.shape[1]))
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, sequence[:, 5:])


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        roofline.parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_bad_command_lines_name_the_problem_and_the_fix(capsys):
    assert "unknown preset 'huge': use one of tiny, 1b, 8b" in _error(capsys, ["--preset", "huge"])
    assert "'0' is not a batch size: give positive integers, e.g. --batch 1 8" in _error(capsys, ["--batch", "0"])
    assert "'x' is not a batch size" in _error(capsys, ["--batch", "1", "x"])
    assert "unknown dtype 'fp8': use float32 or bfloat16" in _error(capsys, ["--dtype", "fp8"])
    err = _error(capsys, ["--variants", "eager,airgraph turbo"])
    assert "unknown variant 'airgraph turbo': give a comma-separated subset of eager, torch.compile default" in err
    assert "'1': must be an integer >= 2, e.g. --new-tokens 256" in _error(capsys, ["--new-tokens", "1"])
    if not torch.cuda.is_available():
        assert "--device cuda: CUDA is not available here" in _error(capsys, ["--device", "cuda"])


# The fast path and the levers of issue #33, each on top of airgraph reduce-overhead
OPT_IN = ("airgraph fast path", "airgraph frozen parameters", "airgraph in-graph input copies")


def test_command_line_defaults_on_the_cpu():
    args = roofline.parse_args(["--device", "cpu", "--batch", "8", "1", "8", "--variants", "airgraph fast path"])
    assert (args.preset, args.dtype, args.batch) == ("tiny", "float32", [8, 1])
    assert [v.name for v in args.variants] == ["eager", "airgraph fast path"]  # eager: the reference tokens
    assert [v.opt_in for v in args.variants] == [False, True]
    every = roofline.parse_args(["--device", "cpu"]).variants
    assert [v.name for v in every] == [v.name for v in roofline.VARIANTS]
    assert [v.name for v in every if v.opt_in] == [*OPT_IN]
    modes = [v.airgraph_mode() for v in every]  # airgraph's default configuration is max-autotune
    assert modes == [None, None, None, "max-autotune", *["reduce-overhead"] * 4]


def test_a_failing_variant_is_kept_in_its_row_and_the_run_goes_on(tmp_path, monkeypatch):
    broken = roofline.Variant("airgraph broken", "airgraph", config={"mode": "no-such-mode"}, opt_in=True)
    monkeypatch.setitem(roofline.BY_NAME, broken.name, broken)
    output = tmp_path / "out.json"
    argv = ["--device", "cpu", "--batch", "1", "--new-tokens", "4", "--prompt-len", "3", "--rounds", "1"]
    argv += ["--variants", "airgraph broken,eager", "--copy-mib", "1", "--threads", str(torch.get_num_threads())]
    dynamo = torch._dynamo.config
    # main() sets these for its whole process: the patch puts them back when it exits
    with dynamo.patch(recompile_limit=dynamo.recompile_limit, fail_on_recompile_limit_hit=False):
        assert roofline.main([*argv, "--output", str(output)]) == 1
    result = json.loads(output.read_text())
    assert result["complete"] is True
    rows = {r["variant"]: r for r in result["results"]}
    assert list(rows) == ["eager", "airgraph broken"]
    assert rows["eager"]["tokens_match"] is True and rows["eager"]["ms_per_token"] > 0
    error = rows["airgraph broken"]["error"]
    assert (error["phase"], error["type"]) == ("compile and warm-up", "builtins.ValueError")
    assert "no-such-mode" in error["message"] and "ms_per_token" not in rows["airgraph broken"]
    assert [p for p in result["problems"] if p.startswith("tiny float32 batch 1 airgraph broken: failed")]


ROW_FIELDS = {
    "preset",
    "batch",
    "dtype",
    "variant",
    "opt_in",
    "config",
    "ms_per_token",
    "tokens_per_s",
    "weight_bytes",
    "kv_bytes_per_token",
    "achieved_gbps",
    "copy_gbps",
    "fraction_of_copy",
    "tokens_match",
    "first_call_s",
    "ratio_to_torch_compile_reduce_overhead",
}


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--copy-mib", "8", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_the_tiny_preset_runs_end_to_end_and_every_compiled_variant_makes_eager_s_tokens(tmp_path):
    output = tmp_path / "llm_roofline_cpu.json"
    common = ["--new-tokens", "6", "--prompt-len", "5", "--rounds", "2", "--output", str(output)]
    done = _run("--batch", "1", "2", "--profile", *common)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "] batch 2 round 2/2: ms/token eager" in done.stdout  # timestamped progress lines
    result = json.loads(output.read_text())
    assert {"device", "torch", "commit", "copy_gbps", "model_choice", "variants", "targets", "settings"} <= set(result)
    assert result["complete"] is True and result["problems"] == []
    assert result["copy_gbps"] > 0 and "airgraph's model" in result["model_choice"]
    rows = result["results"]
    assert [(r["batch"], r["variant"]) for r in rows] == [(b, v.name) for b in (1, 2) for v in roofline.VARIANTS]
    for r in rows:
        assert set(r) >= ROW_FIELDS, ROW_FIELDS - set(r)
        assert r["tokens_match"] is True and r["tokens_verdict"] == "equal", r["variant"]
        assert r["calls_checked"] == 4 and r["steps_timed"] == 2 * 5
        # Compared at the precision they are stored with (ms 4 decimals, GB/s 2, the fraction 4): on a slow machine
        # a rounding is a larger share of a small figure than any fixed relative tolerance allows.
        moved = r["weight_bytes"] + r["kv_bytes_per_token"]
        ms_low, ms_high = r["ms_per_token"] - 5e-5, r["ms_per_token"] + 5e-5
        assert_rounded(r["achieved_gbps"], moved / (ms_high / 1e3) / 1e9, moved / (ms_low / 1e3) / 1e9, 2)
        low, high = r["achieved_gbps"] - 5e-3, r["achieved_gbps"] + 5e-3
        assert_rounded(r["fraction_of_copy"], low / result["copy_gbps"], high / result["copy_gbps"], 4)
        assert r["opt_in"] is (r["variant"] in OPT_IN)
        assert r["profile"]["top"] and r["profile"]["sorted_by"] == "self_cpu_us"
    fast = next(r for r in rows if r["variant"] == "airgraph fast path")
    assert fast["fast_path_calls"] > 0 and fast["config"] == {"mode": "reduce-overhead"}

    # --append: a later call at the same commit replaces the rows it measures again and keeps the others
    again = _run("--batch", "2", "--variants", "eager", "--append", *common)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    merged = json.loads(output.read_text())
    assert [(r["batch"], r["variant"]) for r in merged["results"]] == [
        *((b, v.name) for b in (1, 2) for v in roofline.VARIANTS if (b, v.name) != (2, "eager")),
        (2, "eager"),
    ]
    assert len(merged["runs"]) == 2 and merged["results"][-1]["run"] == merged["runs"][1]["started"]
    assert merged["results"][0]["run"] == merged["runs"][0]["started"]
