"""One measurement at a time per device (tuning/turns.py): tuners in two processes take turns, build while they
wait, reach the verdicts each reaches alone, say how long they waited; a killed holder frees the turn."""

from __future__ import annotations

import itertools
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


def worker(tmp_path: Path, markers: Path, d: int, h: int, threads: int, device: str) -> subprocess.Popen:
    args = [str(markers), str(tmp_path / "bank"), str(tmp_path / "locks"), str(tmp_path), str(d), str(h)]
    command = [sys.executable, "-m", "tests.tuning.turns_worker", *args, str(threads), str(len(MODELS)), device]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def finished(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def alone(tmp_path: Path, device: str) -> list[dict]:
    """Each model tuned alone, one after the other (a bank of its own): the verdicts to reach together."""
    found = []
    for d, h in MODELS:
        markers = tmp_path / f"alone-{d}"
        markers.mkdir()
        locks, bank = str(tmp_path / "locks"), str(tmp_path / f"bank-{d}")
        found.append(tune(str(markers), bank, locks, str(tmp_path), d, h, device=device))
    assert all(a["contended"] == 0 and a["units"] for a in found)
    return found


def assert_lone_verdicts(results: list[dict], lone: list[dict], lock: Path) -> None:
    for result, expected in zip(results, lone, strict=True):
        assert result["contended"] == 0 and result["measurements"] > 20  # never two measurements at once
        assert [u[:3] for u in result["units"]] == [u[:3] for u in expected["units"]]  # name, status, choice
        assert all(not unit[3].startswith("inconclusive") and unit[4] == 9 for unit in result["units"])
        assert result["waits"]["locks"] == [str(lock)]
        assert f"waited {result['waits']['waited_s']:.1f} s for the device's turn" in result["printed"]


def assert_took_turns(results: list[dict]) -> None:
    """By the order of the two processes' turns (one monotonic clock), not by seconds: no two turns were held at
    once, and where the processes ran side by side one of them asked for the turn while the other held it."""
    first, second = ([tuple(t) for t in r["turns"]] for r in results)
    held = sorted([(h, e, 0) for _, h, e in first] + [(h, e, 1) for _, h, e in second])
    for (_, end, _), (start, _, _) in itertools.pairwise(held):
        assert end <= start, "two processes held the device's turn at once"

    def asked_while_held(mine, theirs) -> bool:
        return any(h <= r < e for r, _, _ in mine for _, h, e in theirs)

    side_by_side = first[0][0] < second[-1][2] and second[0][0] < first[-1][2]
    if side_by_side:
        assert asked_while_held(first, second) or asked_while_held(second, first)


USABLE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.mark.slow
def test_two_tuners_take_turns_build_meanwhile_and_reach_their_lone_verdicts(tmp_path):
    """On a GPU (the simulator's CUDA device), whose kernels a process compiling beside does not slow: the stand-in
    clock (turns_worker.SharedGpuClock) spoils a measurement that overlaps another process's, as a shared device
    does; without turns both tuners err. This test holds the device's turn until both tuners have built all their
    units (building meanwhile), then lets them contend: no measurement overlaps, each waited, each reached the
    verdicts it reaches alone."""
    lone = alone(tmp_path, "gpu")
    markers = tmp_path / "markers"
    markers.mkdir()
    here = DeviceTurns(tmp_path / "locks", 600.0)
    gpu = torch.device("cuda")  # the simulator's: its lock is the first GPU's when none can say which it is
    with here.turn(gpu):
        procs = [worker(tmp_path, markers, d, h, threads=1, device="gpu") for d, h in MODELS]

        def built_all() -> bool:  # both have built their second unit's last candidate
            done = [p.read_text().split() for p in markers.glob("built-*")]
            return len(done) == 2 and all(len(d) == 3 and d[0] == "2" and d[1] == d[2] for d in done)

        wait_for(built_all, 120, "both tuners to build their units")
        # On a GPU building takes no turn: each tuner's first request is its first measurement's, and waits here.
        wait_for(lambda: len(list(markers.glob("asking-*"))) == 2, 120, "both tuners to ask for the turn")
        released = time.monotonic()
    results = finished(procs)
    assert_lone_verdicts(results, lone, tmp_path / "locks" / f"{device_key(gpu)}.lock")
    for result in results:
        assert result["device"] == "cuda:0" and result["built_before_measuring"] == 2  # built while waiting
        waits = result["waits"]
        assert waits["waited_s"] > 0 and waits["turns"] >= 3 and waits["building_turns"] == 0
        assert result["turns"][0][0] < released <= result["turns"][0][1]  # asked while this test held the turn
    assert here.waits.turns == 1


@pytest.mark.slow
def test_where_a_measurement_takes_the_cpus_cores_building_takes_turns_too(tmp_path):
    """On a CPU whose cores the measuring threads and a compile (the process and its C++ compilers) cannot each
    have, a compile beside a measurement spoils it (a batch-8 GEMM at 2 threads on 2 cores, one busy, took 25 times
    as long): the two tuners build in their turns too, never beside the other's measurement, and still reach the
    verdicts each reaches alone."""
    threads = max(1, USABLE_CORES - 1)  # a core to spare, not two
    lone = alone(tmp_path, "cpu")
    markers = tmp_path / "markers"
    markers.mkdir()
    results = finished([worker(tmp_path, markers, d, h, threads, "cpu") for d, h in MODELS])
    assert_lone_verdicts(results, lone, tmp_path / "locks" / "cpu.lock")
    for result in results:
        assert result["waits"]["building_turns"] >= 3 and result["built_beside_a_measurement"] == 0
    assert_took_turns(results)


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
    assert turns.free_now(CPU)  # the OS released the killed process's lock
    with turns.turn(CPU):
        pass
    assert (turns.waits.turns, turns.waits.timed_out) == (1, 0) and turns.free_now(CPU)


def test_a_stuck_holder_is_measured_beside_after_the_timeout_with_a_warning(tmp_path):
    held = DeviceTurns(tmp_path, 600.0)
    turns = DeviceTurns(tmp_path, 0.3)
    warned = pytest.warns(UserWarning, match=r"cpu\.lock for more than 0 s; measuring beside it")
    with held.turn(CPU), warned, turns.turn(CPU) as waited:
        assert waited >= 0.25  # it waited out its timeout (how much longer depends on the machine's load)
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
