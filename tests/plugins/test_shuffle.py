"""The --shuffle plugin (tests/plugins/shuffle.py): one order per seed, modules kept together, and pytest-xdist's
workers agreeing on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.plugins.shuffle import shuffled

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [SimpleNamespace(nodeid=f"tests/test_{m}.py::test_{t}") for m in "abcd" for t in range(6)]


def ids(items) -> list[str]:
    return [item.nodeid for item in items]


def test_a_seed_gives_one_order_of_the_same_tests_with_each_module_together():
    order = ids(shuffled(ITEMS, 1234))
    assert order == ids(shuffled(list(ITEMS), 1234))
    assert sorted(order) == sorted(ids(ITEMS)) and order != ids(ITEMS)
    modules = [nodeid.split("::")[0] for nodeid in order]
    assert [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m] == list(dict.fromkeys(modules))
    assert len({tuple(ids(shuffled(ITEMS, seed))) for seed in range(5)}) == 5


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "pytest", "-p", "tests.plugins.shuffle", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_xdist_workers_collect_the_seeds_order_and_the_seed_is_printed(tmp_path):
    for module in "ab":
        body = "".join(f"def test_{t}():\n    pass\n\n\n" for t in range(6))
        (tmp_path / f"test_{module}.py").write_text(body)
    listed = _pytest(tmp_path, "--collect-only", "-q", "--shuffle=7")
    order = [line for line in listed.stdout.splitlines() if "::" in line]
    expected = ids(shuffled([SimpleNamespace(nodeid=f"test_{m}.py::test_{t}") for m in "ab" for t in range(6)], 7))
    assert order == expected and sorted(order) != order
    done = _pytest(tmp_path, "-q", "-n", "2", "--shuffle=7")
    assert done.returncode == 0, done.stdout + done.stderr  # xdist refuses workers that collected different orders
    assert "12 passed" in done.stdout and "--shuffle=7 (make test SHUFFLE=7)" in done.stdout
    plain = _pytest(tmp_path, "--collect-only", "-q")
    assert [line for line in plain.stdout.splitlines() if "::" in line] == sorted(order)
