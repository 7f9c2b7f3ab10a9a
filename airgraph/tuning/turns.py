"""Turns on a device: one measurement at a time per device, across processes.

Two processes tuning on one device at once spoil each other's timings (on a 2-core CPU, two tuners each left all
their GEMMs inconclusive). Every measurement (a unit's interleaved rounds, a whole graph's, the whole call's) takes
the device's turn first: a ``filelock`` lock file per device in ``config.tuning.lock_dir`` (the user cache's
``airgraph/device-locks`` by default), named by :func:`device_key` ("cpu", "cuda-GPU-<uuid>").

- **held per measurement**, never for a whole tuning run: two tuners interleave unit by unit;
- **only timing under it**: a tuner compiles and checks a unit's candidates before it asks, and while another
  holds the turn it builds its next units (tuning/tuner.py). Except on a CPU whose cores the measurement and a
  compile cannot each have (:func:`builds_beside`): compiling beside spoils it, so building takes the turn too;
- **waits are counted**: each turn's wait goes into the report's :class:`~airgraph.tuning.report.Waits`;
- **a crashed holder frees it**: the lock is the OS's (``fcntl``/``msvcrt``) on an open file, released with its
  process, whatever killed it; a holder alive but stuck for ``config.tuning.lock_timeout_s`` is measured beside
  (a warning names the lock file; the noise rule, tuning/measure.py, still guards the verdicts).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from airgraph.log import warn_once
from airgraph.tuning.report import Waits

__all__ = ["DeviceTurns", "builds_beside", "device_key"]


def device_key(device: torch.device) -> str:
    """The name of ``device``'s lock: "cpu", or a GPU by its UUID (one GPU under two CUDA_VISIBLE_DEVICES orders
    is one key), by its index where CUDA cannot say (the simulator: "cuda0")."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else 0
    if torch.cuda.is_available():
        if device.index is None:
            index = torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            text = str(uuid)
            return "cuda-" + (text if text.startswith("GPU-") else f"GPU-{text}")
    return f"cuda{index}"


def builds_beside(device: torch.device) -> bool:
    """Whether a process may compile while another measures on ``device`` without spoiling its timings: beside a
    GPU's kernels (timed by CUDA events) it may; beside the CPU's only where the intra-op threads leave two cores
    free, one for the compiling process and one for the C++ compilers it starts (this process's thread count
    standing for the measuring one's). A parallel region whose threads need every core waits for the one another
    process holds: a batch-8 GEMM at 2 threads on a 2-core CPU with one core busy took 25 times as long, its rounds
    ±70%; at 1 thread, with the other tuner compiling beside, whole-graph checks spread 22-224% (issue #36)."""
    if device.type != "cpu":
        return True
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return torch.get_num_threads() + 2 <= cores


class DeviceTurns:
    """One process's turns on the devices it measures on; the locks live in ``folder``."""

    def __init__(self, folder: str | os.PathLike[str], timeout_s: float, waits: Waits | None = None) -> None:
        self.folder = Path(folder)
        self.timeout_s = timeout_s
        self.waits = waits if waits is not None else Waits()
        self._locks: dict[str, FileLock] = {}
        self._depth: dict[str, int] = {}  # turns of each device this process is inside of

    def _lock(self, device: torch.device) -> FileLock:
        key = device_key(device)
        if key not in self._locks:
            if self.folder.exists() and not self.folder.is_dir():
                raise ValueError(f"tuning lock folder {self.folder} is a file; give a folder (config.tuning.lock_dir)")
            self.folder.mkdir(parents=True, exist_ok=True)
            self._locks[key] = FileLock(str(self.folder / f"{key}.lock"))
        return self._locks[key]

    def free_now(self, device: torch.device) -> bool:
        """Whether no other process holds ``device``'s turn at this moment (one try: nothing is held after)."""
        lock = self._lock(device)
        if self._depth.get(device_key(device)):
            return True  # this process holds it
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        lock.release()
        return True

    @contextlib.contextmanager
    def building(self, device: torch.device) -> Iterator[float]:
        """Hold ``device``'s turn while compiling where compiling beside a measurement spoils it
        (:func:`builds_beside`); elsewhere nothing. Yields the seconds waited."""
        if builds_beside(device):
            yield 0.0
            return
        outer = not self._depth.get(device_key(device))
        with self.turn(device) as waited:
            self.waits.building_turns += outer
            yield waited

    @contextlib.contextmanager
    def turn(self, device: torch.device) -> Iterator[float]:
        """Hold ``device``'s turn for the duration; yields the seconds waited for it (a turn inside one this
        process holds: 0, not counted again)."""
        key = device_key(device)
        lock = self._lock(device)
        if self._depth.get(key):
            self._depth[key] += 1
            try:
                yield 0.0
            finally:
                self._depth[key] -= 1
            return
        start = time.perf_counter()
        held = True
        try:
            lock.acquire(timeout=self.timeout_s)
        except Timeout:
            held = False
            self.waits.timed_out += 1
            warn_once(
                ("tuning lock", lock.lock_file),
                f"airgraph: another process has held {lock.lock_file} for more than {self.timeout_s:.0f} s; "
                "measuring beside it (its timings may spoil these: tune again when it is done, or raise "
                "config.tuning.lock_timeout_s)",
            )
        waited = time.perf_counter() - start
        waits = self.waits
        waits.turns += 1
        waits.seconds += waited
        waits.longest_s = max(waits.longest_s, waited)
        if str(lock.lock_file) not in waits.locks:
            waits.locks.append(str(lock.lock_file))
        self._depth[key] = 1
        try:
            yield waited
        finally:
            self._depth[key] = 0
            if held:
                lock.release()
