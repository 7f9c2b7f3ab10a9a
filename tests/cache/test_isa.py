"""Inductor's CPU instruction-set checks recorded by the first process of an environment, answered in the next
(airgraph/cache/isa.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airgraph.cache.isa import FILE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from torch._inductor import cpu_vec_isa
from airgraph.cache.isa import known_isa
real, checks = cpu_vec_isa.VecISA.check_build, []
def counted(self, code):
    checks.append(type(self).__name__)
    return real(self, code)
cpu_vec_isa.VecISA.check_build = counted
with known_isa(sys.argv[1]):
    valid = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
print(json.dumps({"real_checks": len(checks), "valid": valid}))
"""


def isa_process(root: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_checks_run_once_per_environment(tmp_path):
    first = isa_process(tmp_path)
    if first["real_checks"] == 0:
        pytest.skip("Inductor checks no instruction set on this CPU")
    record = json.loads((tmp_path / FILE).read_text())
    (environment,) = record["environments"].values()
    assert len(environment["checks"]) == first["real_checks"] and environment["valid"] == first["valid"]
    second = isa_process(tmp_path)
    assert second == {"real_checks": 0, "valid": first["valid"]}  # no compile, no child process
    (tmp_path / FILE).write_text('{"format": "airgraph-inductor-isa", "version": 1, "environ')  # torn
    third = isa_process(tmp_path)
    assert third["real_checks"] == first["real_checks"] and third["valid"] == first["valid"]
    assert json.loads((tmp_path / FILE).read_text())["environments"]  # written whole again
