"""airgraph.compare: a planted divergence is found at its node and line; a correct model is ok; dumps; training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.precision.api import compare_with
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import make_config

aten = torch.ops.aten


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return F.gelu(h)  # the planted node


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = Block()
        self.out = torch.nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)  # a buffer updated in place: must not leak from one run into the other
        return self.out(self.block(x)).sin() * self.calls


_LINES = Path(__file__).read_text().splitlines()
GELU_LINE = f"{__file__}:{next(i for i, line in enumerate(_LINES, 1) if '# the planted node' in line)}"


def inputs() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_a_correct_model_is_ok_with_its_outputs_and_gradients_compared():
    report = airgraph.compare(Net(), inputs(), config=make_config(kernel_backend="aten"))
    assert report.ok and report.first is None and report.divergences == []
    names = {d.name for d in report.values}
    assert names == {"output", "grad block.fc.weight", "grad block.fc.bias", "grad out.weight", "grad out.bias"}
    assert report.tolerances == ["rtol=1.3e-06 atol=1e-05 (torch.testing (float32))"]
    assert [g["graph"].split()[0] for g in report.graphs] == ["forward", "backward"]
    assert "airgraph compare: ok" in str(report)


def test_a_wrong_lowering_is_found_at_its_node_module_and_line(wrong_backend):
    config = make_config(kernel_backend=wrong_backend(aten.gelu.default, aten.relu.default))
    x = inputs()
    with torch.no_grad():
        report = airgraph.compare(Net(), x, config=config)
    assert not report.ok
    first = report.first
    assert (first.op, first.source, first.module) == ("aten.gelu.default", GELU_LINE, "block (Block)")
    assert first.graph.startswith("inference graph") and first.backend == "wrong" and first.chosen_by == "config"
    with torch.no_grad():  # the node's inputs are eager's: the difference is gelu's against relu's on them
        h = Net().block.fc(x)
        expected = (F.gelu(h) - F.relu(h)).abs().max().item()
    assert first.max_abs == pytest.approx(expected, rel=1e-6)
    assert first.tolerance.by == "torch.testing (float32)" and not first.diff.ok
    text = str(report)
    assert "DIVERGES" in text and f"at {GELU_LINE}" in text and "aten.gelu.default" in text


def test_given_tolerances_are_used_and_a_wide_one_hides_the_divergence(wrong_backend):
    config = make_config(kernel_backend=wrong_backend(aten.gelu.default, aten.relu.default))
    with torch.no_grad():
        report = airgraph.compare(Net(), inputs(), config=config, rtol=10.0, atol=10.0)
    assert report.ok and report.tolerances == ["rtol=10 atol=10 (given)"]
    with pytest.raises(ValueError, match="give both rtol and atol"):
        airgraph.compare(Net(), inputs(), config=config, rtol=1e-3)


def test_a_divergence_in_the_backward_is_found_in_the_backward_graph(wrong_backend):
    config = make_config(kernel_backend=wrong_backend(aten.gelu_backward.default, aten.mul.Tensor))
    report = airgraph.compare(Net(), inputs(), config=config)
    assert not report.ok
    outputs = [d for d in report.values if d.kind == "output"]
    assert all(d.ok for d in outputs)  # the forward is right; gradients are not
    assert {d.name for d in report.values if not d.ok} == {"grad block.fc.weight", "grad block.fc.bias"}
    first = report.first
    assert first.graph.startswith("backward graph") and first.op == "aten.gelu_backward.default"
    assert first.source == GELU_LINE


def test_dumps_parse_and_match_their_index(tmp_path, wrong_backend):
    config = make_config(kernel_backend=wrong_backend(aten.gelu.default, aten.relu.default))
    with torch.no_grad():
        report = airgraph.compare(Net(), inputs(), config=config, dump_dir=tmp_path / "dumps")
    index = json.loads((tmp_path / "dumps" / "index.json").read_text())
    assert index["version"] == 1
    entries = index["tensors"]
    assert {e["kind"] for e in entries} == {"output", "node"}
    (first,) = [e for e in entries if e.get("first")]
    assert (first["node"], first["op"], first["source"]) == (report.first.node, "aten.gelu.default", GELU_LINE)
    for entry in entries:
        eager = torch.load(tmp_path / "dumps" / entry["files"]["eager"], weights_only=True)
        compiled = torch.load(tmp_path / "dumps" / entry["files"]["compiled"], weights_only=True)
        assert list(eager.shape) == list(compiled.shape) == entry["shape"]
        assert str(eager.dtype) == f"torch.{entry['dtype']}"
        assert (compiled - eager).abs().max().item() == pytest.approx(entry["max_abs"], rel=1e-6, abs=1e-12)
        assert entry["ok"] == bool(((compiled - eager).abs() <= 1e-5 + 1.3e-6 * eager.abs()).all())
    bad = [e for e in entries if not e["ok"]]
    assert {e["kind"] for e in bad} == {"output", "node"}


def test_reduce_overhead_on_the_simulated_runtime_is_compared_captured(wrong_backend):
    config = make_config(mode="reduce-overhead", kernel_backend="aten")
    with torch.no_grad():
        report = compare_with(AirgraphBackend(config, runtime=SimulatedCuda()), Net(), (inputs(),), {})
    assert report.ok and [g["captured"] for g in report.graphs] == [True]
    config = make_config(mode="reduce-overhead", kernel_backend=wrong_backend(aten.gelu.default, aten.relu.default))
    with torch.no_grad():
        report = compare_with(AirgraphBackend(config, runtime=SimulatedCuda()), Net(), (inputs(),), {})
    assert [g["captured"] for g in report.graphs] == [True]
    assert not report.ok and (report.first.op, report.first.source) == ("aten.gelu.default", GELU_LINE)


def _bank_every_segment(config, backend_name: str) -> list[str]:
    """A real bank entry for each compute segment of Net's graph choosing ``backend_name`` (as a bank tuned on
    another build could hold it); returns the bank keys."""
    from airgraph.tuning.bank import TUNED, Bank, Entry
    from airgraph.tuning.candidates import version
    from airgraph.tuning.source import bank_file, segment_key

    segments = []
    backend = AirgraphBackend(config)
    backend.shape_observers.append(lambda report, segs: segments.extend(s for s in segs if s.gm is not None))
    with torch.no_grad():
        torch.compile(Net(), backend=backend)(inputs())
    file, digest = bank_file(Bank(config.tuning.resolved_bank_dir()), torch.device("cpu"))
    keys = []
    for segment in segments:
        base, key = segment_key(segment, digest, "cpu")
        choice = {"tune_mode": "Subgraph", "name": backend_name, "options": {"backend": backend_name}}
        name = f"segment {segment.id}"
        file.commit(Entry(key, "subgraph", TUNED, base, name, "", version("subgraph", "cpu"), choice, 2.0, 1.0))
        keys.append(key)
    return keys


def test_a_bank_choice_that_moves_numbers_is_named_as_the_tunings(wrong_backend, tmp_path):
    config = make_config(kernel_backend="aten", **{"tuning.bank_dir": str(tmp_path)})
    keys = _bank_every_segment(config, wrong_backend(aten.gelu.default, aten.relu.default))
    with torch.no_grad():
        report = compare_with(AirgraphBackend(config), Net(), (inputs(),), {})
    first = report.first
    assert (first.chosen_by, first.op, first.source) == ("tuning", "aten.gelu.default", GELU_LINE)
    assert first.bank_source["bank key"] in keys
    assert f"chosen by tuning {first.bank_source}" in str(report)
