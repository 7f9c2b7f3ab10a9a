"""`make setup` (scripts/setup_env.py): with every requirement installed, as on the GPU machine, which has no package
registry, nothing is downloaded and airgraph is still the `airgraph` backend and command of the new environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parent.parent


def _setup_env():
    return load_script("setup_env")


@pytest.mark.slow
def test_with_everything_installed_the_venv_links_airgraph_without_pip(tmp_path):
    venv = tmp_path / "venv"
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "setup_env.py"), str(venv)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)},  # no registry
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "airgraph linked from the checkout (no pip)" in out.stdout
    python = venv / "bin" / "python"
    check = (
        "import torch, airgraph; assert 'airgraph' in torch._dynamo.list_backends();"
        "f = torch.compile(lambda x: x * 2 + 1, backend='airgraph'); x = torch.randn(3);"
        "torch.testing.assert_close(f(x), x * 2 + 1); print(airgraph.__file__)"
    )
    ran = subprocess.run([str(python), "-c", check], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert Path(ran.stdout.strip()) == ROOT / "airgraph" / "__init__.py"
    cli = subprocess.run([str(venv / "bin" / "airgraph"), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0 and "usage: airgraph" in cli.stdout


def test_a_missing_requirement_sends_setup_to_pip(monkeypatch):
    setup_env = _setup_env()
    project = setup_env._project()
    project["dependencies"] = [*project["dependencies"], "airgraph-no-such-package>=1", "torch>=999"]
    monkeypatch.setattr(setup_env, "_project", lambda: project)
    missing = setup_env.missing_requirements(Path(sys.executable))
    assert missing[0] == "airgraph-no-such-package>=1"
    assert missing[1].startswith("torch>=999 (found 2.")
    assert len(missing) == 2  # everything else is installed here


def _offline_main(monkeypatch, tmp_path, missing: list[str], linked: list[Path] | None = None) -> list[Path]:
    """setup_env.main where pip cannot reach an index and ``missing`` is what the venv lacks; the venvs linked (also
    into ``linked``, for a main that raises)."""
    setup_env = _setup_env()
    linked = [] if linked is None else linked
    monkeypatch.setattr(setup_env, "make_venv", lambda path: path / "bin" / "python")
    monkeypatch.setattr(setup_env, "missing_requirements", lambda python: list(missing))

    def no_index(python):
        raise subprocess.CalledProcessError(1, ["pip", "install"])

    monkeypatch.setattr(setup_env, "pip_install", no_index)
    monkeypatch.setattr(setup_env, "link_airgraph", linked.append)
    assert setup_env.main(["setup_env.py", str(tmp_path / "venv")]) == 0
    return linked


def test_extras_pip_cannot_install_leave_airgraph_linked(monkeypatch, tmp_path, capsys):
    # The GPU machine: every dependency installed, ruff and mpich (test extras) not, no package index.
    linked = _offline_main(monkeypatch, tmp_path, ["ruff>=0.6", "mpich"])
    assert linked == [tmp_path / "venv" / "bin" / "python"]
    assert "pip could not install the extras ruff>=0.6, mpich" in capsys.readouterr().out


def test_a_missing_dependency_pip_cannot_install_fails_setup(monkeypatch, tmp_path):
    linked: list[Path] = []
    with pytest.raises(subprocess.CalledProcessError, match=r"\['pip', 'install'\]"):
        _offline_main(monkeypatch, tmp_path, ["rich>=13 (found 12.0)", "mpich"], linked)
    assert linked == []  # airgraph is not linked into a venv that lacks a dependency
