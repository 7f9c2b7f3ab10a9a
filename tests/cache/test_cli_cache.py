"""``airgraph cache list|clear`` on a cache a real compile filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from airgraph.cli import main
from tests.cache.common import entries, run_once

ROOT = Path(__file__).resolve().parents[2]


def test_list_and_clear(capsys, tmp_path):
    folder = os.environ["AIRGRAPH_CACHE_DIR"]
    assert main(["cache", "list"]) == 0
    assert f"no entries in {folder}" in capsys.readouterr().out
    run_once()
    run_once(blocks=3)
    assert main(["cache", "list", "--check"]) == 0
    out = capsys.readouterr().out
    for text in ("key", "model", "mode", "size", "MlpMixer.forward", "max-autotune", "cpu", torch.__version__):
        assert text in out
    assert "2 entries of 1 model(s)" in out
    assert main(["cache", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["folder"] == folder and len(listed["entries"]) == 2
    assert {e["state"] for e in listed["entries"]} == {"ok"} and all(e["bytes"] > 1000 for e in listed["entries"])
    damaged = entries()[0]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    assert main(["cache", "list", "--check"]) == 1
    assert "refused: " in capsys.readouterr().out
    assert main(["cache", "clear", "--model", "Nothing.forward"]) == 2
    assert "no entry of model 'Nothing.forward'" in capsys.readouterr().err
    assert main(["cache", "clear", "--model", "MlpMixer.forward"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out and not entries()
    run_once()
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert main(["cache", "list"]) == 0
    assert "no entries" in capsys.readouterr().out
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    assert main(["cache", "list", "--dir", str(not_a_folder)]) == 2
    assert "is not a folder; give the compile cache's folder" in capsys.readouterr().err


def test_clear_in_a_process_of_its_own(tmp_path):
    run_once()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "airgraph", "cache", "clear", "--dir", os.environ["AIRGRAPH_CACHE_DIR"]],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "removed 1 entry" in done.stdout, done.stderr
    assert not entries()
    done = subprocess.run([sys.executable, "-m", "airgraph", "cache", "wipe"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "invalid choice: 'wipe'" in done.stderr
