"""Divergences made before the kernels (a wrong decomposition, a wrong airgraph pass), planted here: compare names
what made them, with the user's line, and ``report.fallback()`` gives a config with which compare says ok."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._inductor import decomposition as inductor_decomposition

import airgraph
from airgraph.passes import pipeline
from airgraph.passes.base import PassResult
from airgraph.precision.fallback import call_times
from tests.helpers import make_config

aten = torch.ops.aten
_LINES = Path(__file__).read_text().splitlines()


def _line(marker: str) -> str:
    return f"{__file__}:{next(i for i, line in enumerate(_LINES, 1) if marker in line)}"


class MLP(torch.nn.Module):
    """Two blocks of Linear, LayerNorm and SiLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm1 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)
        self.fc2, self.norm2 = torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.norm1(self.fc1(x)))  # the first silu
        return torch.nn.functional.silu(self.norm2(self.fc2(h)))


def _wrong_silu(x):
    return x * torch.sigmoid(1.05 * x)


def _wrong_silu_backward(grad_output, x):
    sigmoid = torch.sigmoid(x)
    return grad_output * sigmoid * (1 + x * (1 - sigmoid)) * 1.01


def _inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),)


@pytest.mark.slow
def test_a_wrong_decomposition_is_named_with_its_line_and_the_fallback_makes_compare_ok(monkeypatch):
    monkeypatch.setitem(inductor_decomposition.decompositions, aten.silu.default, _wrong_silu)
    config = make_config(kernel_backend="inductor", compile_cache=False)
    with torch.no_grad():
        report = airgraph.compare(MLP(), *_inputs(), config=config)
    assert not report.ok and not report.divergences  # no kernel leaves the graph it was given
    before = report.before
    assert (before.stage, before.what, before.op) == ("decomposition", "aten.silu", "aten.silu.default")
    assert before.source == _line("# the first silu") and "torch.nn.functional.silu" in before.code
    text = str(report)
    assert "the decomposition of aten.silu (decomposition)" in text and _line("# the first silu") in text
    assert report.to_dict()["before_kernels"]["what"] == "aten.silu"
    fix = report.fallback()
    assert fix.fallback.keep_ops == ("aten.silu",) and config.fallback.keep_ops == ()
    with torch.no_grad():
        fixed = airgraph.compare(MLP(), *_inputs(), config=fix)
        explained = airgraph.explain(MLP(), *_inputs(), config=fix)
    assert fixed.ok
    silu_segments = {n.segment for g in explained.graphs for n in g.nodes if n.target == "aten.silu.default"}
    chosen = {s.id: s.chosen_by for g in explained.graphs for s in g.segments}
    assert len(silu_segments) == 2 and {chosen[s] for s in silu_segments} == {"compare"}
    times = call_times(MLP(), *_inputs(), config=config, fallback=fix, min_run_time=0.01)
    assert set(times) == {"without_s", "with_s"} and all(t > 0 for t in times.values())


@pytest.mark.slow
def test_a_wrong_decomposition_of_a_backward_only_op_is_named(monkeypatch):
    monkeypatch.setitem(inductor_decomposition.decompositions, aten.silu_backward.default, _wrong_silu_backward)
    config = make_config(kernel_backend="inductor", compile_cache=False)
    report = airgraph.compare(MLP(), *_inputs(), config=config)
    assert all(d.ok for d in report.values if d.kind == "output")
    assert not report.ok and not report.divergences
    assert (report.before.stage, report.before.what) == ("decomposition", "aten.silu_backward")
    assert report.before.graph.startswith("backward graph")
    assert airgraph.compare(MLP(), *_inputs(), config=report.fallback()).ok


def _bias_dropping(real):
    """``real`` (the remove_noops pass), then the first add of a bias dropped: the planted bug."""

    def planted(gm, ctx):
        result = real(gm, ctx)
        for node in gm.graph.find_nodes(op="call_function", target=aten.addmm.default):
            with gm.graph.inserting_before(node):
                mm = gm.graph.call_function(aten.mm.default, node.args[1:])
            mm.meta = dict(node.meta)
            node.replace_all_uses_with(mm)
            gm.graph.erase_node(node)
            result.note(f"{mm.name}: dropped the bias of {node.name}")
            return result
        return PassResult()

    return planted


def test_a_wrong_airgraph_pass_is_named_and_switched_off_by_the_fallback(monkeypatch, tmp_path):
    planted = [(name, _bias_dropping(fn) if name == "remove_noops" else fn) for name, fn in pipeline.PIPELINE]
    monkeypatch.setattr(pipeline, "PIPELINE", planted)
    config = make_config(kernel_backend="aten", compile_cache=False)
    with torch.no_grad():
        eager = MLP()(*_inputs())
        report = airgraph.compare(MLP(), *_inputs(), config=config, dump_dir=tmp_path)
    assert not report.ok and not report.divergences
    before = report.before
    assert (before.stage, before.what) == ("pass", "remove_noops") and "dropped the bias" in before.detail
    assert before.source == _line("# the first silu")  # fc1's addmm, as the graph without the pass has it
    assert "airgraph's remove_noops pass (pass)" in str(report)
    index = json.loads((tmp_path / "index.json").read_text())  # both stages: without the pass, and with it
    assert index["before_kernels"]["what"] == "remove_noops"
    (output,) = index["tensors"]
    load = {which: torch.load(tmp_path / name, weights_only=True) for which, name in output["files"].items()}
    assert set(load) == {"eager", "compiled", "original"}
    torch.testing.assert_close(load["original"], eager)
    torch.testing.assert_close(load["eager"], eager)
    assert not torch.allclose(load["compiled"], eager, rtol=1e-4, atol=1e-4)
    fix = report.fallback()
    assert fix.passes.remove_noops is False and config.passes.remove_noops is True
    with torch.no_grad():
        assert airgraph.compare(MLP(), *_inputs(), config=fix).ok


def test_a_kernels_divergence_is_still_found_at_its_node_and_its_fallback_runs_it_as_aten(wrong_backend):
    backend = wrong_backend(aten.silu.default, aten.relu.default)
    config = make_config(kernel_backend=backend, compile_cache=False)
    with torch.no_grad():
        report = airgraph.compare(MLP(), *_inputs(), config=config)
    assert report.first is not None and report.first.op == "aten.silu.default" and report.before is None
    assert report.first.source == _line("# the first silu")
    fix = report.fallback()
    assert fix.fallback.aten_nodes == ("inference:aten.silu.default",)
    with torch.no_grad():
        assert airgraph.compare(MLP(), *_inputs(), config=fix).ok


def test_compare_write_config_writes_the_fallback_and_checks_it(monkeypatch, tmp_path, capsys):
    from airgraph.cli import main

    planted = [(name, _bias_dropping(fn) if name == "remove_noops" else fn) for name, fn in pipeline.PIPELINE]
    monkeypatch.setattr(pipeline, "PIPELINE", planted)
    example = tmp_path / "example.py"
    example.write_text(
        "import torch\n\n"
        "def airgraph_example():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU()), (torch.randn(2, 8),)\n"
    )
    path = tmp_path / "fix.json"
    argv = ["compare", str(example), "--kernel-backend", "aten", "--write-config", str(path)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "airgraph's remove_noops pass" in out and "compare with it: ok" in out
    assert "ms without the fallback" in out and "ms with it" in out
    stored = json.loads(path.read_text())
    assert stored["passes"]["remove_noops"] is False and stored["kernel_backend"] == "aten"
    monkeypatch.setenv("AIRGRAPH_CONFIG", str(path))
    assert main(["compare", str(example)]) == 0


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x).view(4, 8)  # a real no-op view, which remove_noops rightly removes
        return torch.tanh(torch.relu(h) * 2)  # the doubled node


def test_a_wrong_rule_of_a_pass_is_switched_off_for_its_node_only(monkeypatch):
    from airgraph.passes import remove_noops

    monkeypatch.setitem(remove_noops._IDENTITY_SCALAR, aten.mul.Tensor, 2)  # the planted bug: x * 2 "is" x
    config = make_config(kernel_backend="aten", compile_cache=False)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        report = airgraph.compare(Scaled(), x, config=config)
    before = report.before
    assert (before.stage, before.what, before.pass_node, before.op) == (
        "pass",
        "remove_noops",
        "mul",
        "aten.mul.Tensor",
    )
    assert before.source == _line("# the doubled node")
    assert "airgraph's remove_noops pass on node mul" in str(report)
    fix = report.fallback()
    assert fix.fallback.pass_nodes == ("remove_noops:mul",) and fix.passes.remove_noops is True
    with torch.no_grad():
        assert airgraph.compare(Scaled(), x, config=fix).ok
        explained = airgraph.explain(Scaled(), x, config=fix)
    (noops,) = [p for g in explained.graphs for p in g.passes if p.name == "remove_noops"]
    assert noops.changed == 1 and noops.details[0].startswith("view")  # the right change stays
