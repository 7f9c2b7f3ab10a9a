"""One measurement at a time per device (tuning/turns.py): tuners in two processes take turns, build while they
wait, reach the verdicts each reaches alone, say how long they waited; a killed holder frees the turn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from airgraph.tuning.turns import DeviceTurns, device_key
from tests.tuning.turns_worker import tune

CPU = torch.device("cpu")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
MODELS = [(32, 64), (48, 96)]  # two MLPs (d, h): two units each


def worker(tmp_path: Path, markers: Path, d: int, h: int) -> subprocess.Popen:
    args = [str(markers), str(tmp_path / "bank"), str(tmp_path / "locks"), str(tmp_path), str(d), str(h)]
    command = [sys.executable, "-m", "tests.tuning.turns_worker", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def verdicts(result: dict) -> list:
    return [unit[:3] for unit in result["units"]]  # name, status, choice


@pytest.mark.slow
def test_two_tuners_take_turns_build_meanwhile_and_reach_their_lone_verdicts(tmp_path):
    """The stand-in clock (turns_worker.SharedClock) spoils a measurement that overlaps another process's, as a
    shared core does; without turns both tuners end inconclusive. Here this test holds the CPU's turn until both
    have built all their units, then lets them contend: no measurement overlaps, each waited, each reached the
    verdicts it reaches alone."""
    alone = []
    for d, h in MODELS:  # each tuner alone, one after the other (a bank of its own)
        (tmp_path / f"alone-{d}").mkdir()
        alone.append(
            tune(
                str(tmp_path / f"alone-{d}"), str(tmp_path / f"bank-{d}"), str(tmp_path / "locks"), str(tmp_path), d, h
            )
        )
    assert all(a["contended"] == 0 and a["units"] for a in alone)

    markers = tmp_path / "markers"
    markers.mkdir()
    here = DeviceTurns(tmp_path / "locks", 600.0)
    with here.turn(CPU):
        procs = [worker(tmp_path, markers, d, h) for d, h in MODELS]
        built = lambda: [int(p.read_text() or 0) for p in markers.glob("built-*")]  # noqa: E731
        wait_for(lambda: sorted(built()) == [2, 2], 120, "both tuners to build their units")
        time.sleep(1.5)  # both are past building now, waiting for the turn
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))

    for result, lone in zip(results, alone, strict=True):
        assert result["contended"] == 0 and result["measurements"] > 20  # never two measurements at once
        assert result["built_before_measuring"] == 2  # built its units while waiting
        assert verdicts(result) == verdicts(lone)  # what it decides alone, every unit decided
        assert all(not unit[3].startswith("inconclusive") and unit[4] == 9 for unit in result["units"])
        waits = result["waits"]
        assert (
            waits["waited_s"] > 1.0 and waits["turns"] >= 3 and waits["locks"] == [str(tmp_path / "locks" / "cpu.lock")]
        )
        assert f"waited {waits['waited_s']:.1f} s for the device's turn to measure" in result["printed"]
    assert here.waits.turns == 1


HOLDER = """
import sys, torch
from airgraph.runtime.cpu import CPU
from airgraph.tuning.turns import DeviceTurns
x = torch.randn(64, 64)
with DeviceTurns(sys.argv[1], 600.0).turn(torch.device("cpu")):
    print("measuring", flush=True)
    while True:
        CPU.time(lambda args: args[0] @ args[0], [x], 50)
"""


def test_a_holder_killed_mid_measurement_frees_the_turn(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "measuring"
        turns = DeviceTurns(tmp_path, 600.0)
        assert not turns.free_now(CPU)  # held by the measuring process
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    start = time.perf_counter()
    with turns.turn(CPU) as waited:  # the OS released the killed process's lock
        assert waited < 1.0
    assert time.perf_counter() - start < 1.0 and turns.waits.turns == 1 and turns.free_now(CPU)


def test_a_stuck_holder_is_measured_beside_after_the_timeout_with_a_warning(tmp_path):
    held = DeviceTurns(tmp_path, 600.0)
    turns = DeviceTurns(tmp_path, 0.3)
    warned = pytest.warns(UserWarning, match=r"cpu\.lock for more than 0 s; measuring beside it")
    with held.turn(CPU), warned, turns.turn(CPU) as waited:
        assert 0.25 < waited < 5
    assert (turns.waits.timed_out, turns.waits.turns) == (1, 1)


def test_each_device_has_its_own_turn_and_a_lock_folder_must_be_a_folder(tmp_path):
    assert device_key(CPU) == "cpu"
    if not torch.cuda.is_available():
        assert device_key(torch.device("cuda")) == device_key(torch.device("cuda", 0)) == "cuda0"
    turns = DeviceTurns(tmp_path / "locks", 600.0)
    with turns.turn(CPU), turns.turn(CPU):  # re-entrant in one process
        assert turns.free_now(CPU)
    (tmp_path / "file").write_text("")
    with (
        pytest.raises(
            ValueError, match=r"tuning lock folder .*file is a file; give a folder \(config.tuning.lock_dir\)"
        ),
        DeviceTurns(tmp_path / "file", 1.0).turn(CPU),
    ):
        pass
