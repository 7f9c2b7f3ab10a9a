"""``airgraph tune`` and ``airgraph bank list|show|prune``, in-process through airgraph.cli.main."""

from __future__ import annotations

import json

import pytest
import torch

from airgraph import cli
from airgraph.tuning import measure
from airgraph.tuning.bank import FORMAT, Bank, BankFile, bank_file_name
from airgraph.tuning.candidates import VERSIONS
from airgraph.tuning.source import bank_file
from tests.tuning.seed_format import validate
from tests.tuning.test_tune_bank import ENV
from tests.tuning.test_tune_bank import entry as bank_entry

MODEL = """
import torch

def airgraph_example():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval()
    return model, (torch.randn(8, 32),)
"""


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def test_tune_prints_what_changed_and_the_bank_lists_it(tmp_path, example, capsys, monkeypatch):
    # Real CPU timings: on a busy machine a unit may be inconclusive and leave no bank record (measure.NOISY);
    # this test is about what the CLI prints and lists, so every measurement counts as a verdict.
    monkeypatch.setattr(measure, "NOISY", float("inf"))
    bank, work = tmp_path / "bank", tmp_path / "work"
    args = ["tune", str(example), "--mode", "2", "--bank", str(bank), "--work-path", str(work)]
    assert cli.main([*args, "--kernel-backend", "aten", "--budget", "0.01", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "tuning" in text and "0/addmm" in text and "2/addmm_1" in text and "model graph" not in text
    assert "operator (OPAT) tuning: 1 graph(s), 2 unit(s)" in text
    (report,) = work.glob("aoe_result_opat_*.json")
    assert f"report: {report}" in text and f"bank: {bank}" in text
    document = json.loads(report.read_text())
    validate(document, "op")
    (bank_file,) = bank.glob("*.jsonl")
    entries = BankFile(bank_file).entries()
    tuned = [e for e in entries.values() if e.status == "tuned"]

    assert cli.main(["bank", "list", "--bank", str(bank), "--all"]) == 0
    listing = capsys.readouterr().out
    assert f"{len(entries)} entries shown, 0 stale" in listing or f"{len(entries)} entry shown, 0 stale" in listing
    for entry in entries.values():
        assert entry.key in listing
    key = next(iter(entries))
    assert cli.main(["bank", "show", key[:8], "--bank", str(bank)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["record"]["key"] == key and shown["stale"] is False and shown["env"]["device_type"] == "cpu"
    assert len(tuned) == sum(1 for line in listing.splitlines() if "in use" in line)

    assert cli.main(["bank", "prune", "--bank", str(bank)]) == 0
    assert f"kept {len(entries)} record(s), dropped 0, removed 0 file(s)" in capsys.readouterr().out
    assert cli.main(["bank", "prune", "--all", "--bank", str(bank)]) == 0
    assert "removed 1 file(s)" in capsys.readouterr().out and not list(bank.glob("*.jsonl"))


def test_tune_and_bank_usage_errors(tmp_path, example, capsys):
    assert cli.main(["tune", str(example), "--mode", "3"]) == 2
    assert "tuning.mode: invalid value '3'" in capsys.readouterr().err
    assert cli.main(["tune", str(tmp_path / "missing.py"), "--mode", "op"]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err
    assert cli.main(["bank", "show", "--bank", str(tmp_path)]) == 2
    assert "show: give the KEY" in capsys.readouterr().err
    assert cli.main(["bank", "show", "nokey", "--bank", str(tmp_path)]) == 1
    assert "no entry with a key starting 'nokey'" in capsys.readouterr().err


def test_list_stale_bases_and_prune_agree_on_what_is_stale(tmp_path, capsys):
    """One stale rule (tuning/bank.py is_stale) for ``bank list``, the tuner's stale count and ``bank prune``."""
    folder = tmp_path / "bank"
    current, _ = bank_file(Bank(folder), torch.device("cpu"))
    current.commit(bank_entry("in-use", base="unit-1"))
    outdated = bank_entry("old-candidates", base="unit-2")
    outdated.candidates = VERSIONS["op"]["cpu"] - 1
    current.commit(outdated)
    Bank(folder).file_for({**ENV, "torch": "2.12.0"}, "other").commit(bank_entry("other-torch", base="unit-3"))
    unreadable = folder / bank_file_name(ENV, "unreadable")  # another format version: no entry is read from it
    unreadable.write_text(json.dumps({"format": FORMAT, "version": 99, "env": ENV}) + "\n")

    assert cli.main(["bank", "list", "--bank", str(folder), "--all"]) == 0
    listing = capsys.readouterr().out
    assert "3 entries shown, 2 stale" in listing
    for key, stale in (("in-use", False), ("old-candidates", True), ("other-torch", True)):
        assert cli.main(["bank", "show", key, "--bank", str(folder)]) == 0
        assert json.loads(capsys.readouterr().out)["stale"] is stale
    assert Bank(folder).stale_bases(current, VERSIONS) == {"unit-2", "unit-3"}
    assert cli.main(["bank", "prune", "--bank", str(folder)]) == 0
    assert "kept 1 record(s), dropped 2, removed 2 file(s)" in capsys.readouterr().out
    assert [p.name for p in folder.glob("*.jsonl")] == [current.path.name]
