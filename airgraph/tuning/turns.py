"""Turns on a device: one measurement at a time per device, across processes.

Two processes tuning on one device at once spoil each other's timings (on a 2-core CPU, two tuners each left all
their GEMMs inconclusive). Every measurement (a unit's interleaved rounds, a whole graph's, the whole call's) takes
the device's turn first: a ``filelock`` lock file per device in ``config.tuning.lock_dir`` (the user cache's
``airgraph/device-locks`` by default), named by :func:`device_key` ("cpu", "cuda-GPU-<uuid>"). Only timing happens
under it: a tuner compiles and checks its candidates before it asks, and while another holds the turn it builds
the next unit's (tuning/tuner.py), so two tuners take turns without idling.

- **held per measurement**, never for a whole tuning run: two tuners interleave unit by unit;
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

__all__ = ["DeviceTurns", "device_key"]


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


class DeviceTurns:
    """One process's turns on the devices it measures on; the locks live in ``folder``."""

    def __init__(self, folder: str | os.PathLike[str], timeout_s: float, waits: Waits | None = None) -> None:
        self.folder = Path(folder)
        self.timeout_s = timeout_s
        self.waits = waits if waits is not None else Waits()
        self._locks: dict[str, FileLock] = {}

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
        if lock.is_locked:
            return True  # this process holds it
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        lock.release()
        return True

    @contextlib.contextmanager
    def turn(self, device: torch.device) -> Iterator[float]:
        """Hold ``device``'s turn for the duration (re-entrant in a process); yields the seconds waited for it."""
        lock = self._lock(device)
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
        try:
            yield waited
        finally:
            if held:
                lock.release()
