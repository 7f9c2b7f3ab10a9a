"""``airgraph compare``: exit 0 within tolerance, 1 on a divergence (named with its line), 2 on bad input."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from airgraph.cli import main

EXAMPLE = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x)) + 1

    def airgraph_example():
        return Model(), (torch.randn(2, 8),)
    """
)


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "example.py"
    path.write_text(EXAMPLE)
    return path


def test_exit_0_when_within_tolerance(example, tmp_path, capsys):
    assert main(["compare", str(example), "--kernel-backend", "aten", "--json", str(tmp_path / "r.json")]) == 0
    assert "airgraph compare: ok" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_exit_1_on_a_divergence_named_with_its_line(example, wrong_backend, tmp_path, capsys):
    backend = wrong_backend(torch.ops.aten.gelu.default, torch.ops.aten.relu.default)
    dumps = tmp_path / "dumps"
    assert main(["compare", str(example), "--kernel-backend", backend, "--dump-dir", str(dumps)]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES" in out and f"at {example}:11 `return torch.nn.functional.gelu(self.fc(x)) + 1`" in out
    assert (dumps / "index.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "nowhere.py"], "nowhere.py: no such file"),
        (["compare", "EXAMPLE", "--rtol", "1e-3"], "give both --rtol and --atol"),
        (["compare", "EXAMPLE", "--mode", "fastest"], "mode"),
    ],
)
def test_exit_2_on_bad_input_in_one_line(argv, message, example, capsys):
    argv = [str(example) if a == "EXAMPLE" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("airgraph compare: error:")]
    assert message in line and "Traceback" not in err
