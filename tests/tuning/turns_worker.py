"""A tuning process for tests/tuning/test_tune_turns.py: operator tuning of a small MLP on the CPU or the simulator's
CUDA device, timed by a clock that knows when two processes measure at once. Run as ``python -m
tests.tuning.turns_worker MARKERS BANK LOCKS WORK D H THREADS PEERS cpu|gpu`` (it starts once PEERS processes are
ready); prints one JSON line: each unit's verdict, the waits, how many of its measurements overlapped another's and
how many of its builds another's measurement."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from airgraph.backend import AirgraphBackend
from airgraph.runtime.cpu import CpuRuntime
from airgraph.runtime.simulated import SimulatedCuda
from airgraph.runtime.simulated_device import CostModel
from airgraph.tuning.turns import DeviceTurns, device_key
from tests.helpers import make_config


class _Shared:
    """A deterministic clock (the simulator's cost model: a launch per ATen op and the bytes it moves), except that
    a measurement overlapping another process's costs 60% more every other time, as a shared device makes it: each
    ``time`` call marks itself in ``folder`` while it runs and looks for the marks of others. ``built``: called at
    the first measurement, says how many units the tuner had built by then."""

    HOLD_S = 0.003  # each measurement lasts at least this long, so that two unlocked tuners overlap

    def _shared(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.calls = self.contended = 0
        self.built_before_measuring: int | None = None
        self.built = lambda: 0

    def _cost(self, fn: Any, args: list) -> float:
        fn(list(args))  # a warm-up call, as the real clocks make
        with CostModel(SimulatedCuda.LAUNCH_SECONDS, SimulatedCuda.BYTES_PER_SECOND) as cost:
            fn(list(args))
        return cost.seconds

    def time(self, fn: Any, args: list, iters: int) -> float:
        if self.built_before_measuring is None:
            self.built_before_measuring = self.built()
        mine = self.folder / f"measuring-{os.getpid()}"
        mine.touch()
        try:
            others = self._others(mine)
            seconds = self._cost(fn, args)
            time.sleep(self.HOLD_S)
            others = others or self._others(mine)
        finally:
            mine.unlink()
        self.calls += 1
        if not others:
            return seconds
        self.contended += 1
        return seconds * (1.6 if self.calls % 2 else 1.0)

    def _others(self, mine: Path) -> list[Path]:
        return [p for p in self.folder.glob("measuring-*") if p != mine]


class SharedClock(_Shared, CpuRuntime):
    """The CPU runtime with :class:`_Shared`'s clock."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self._shared(folder)


class SharedGpuClock(_Shared, SimulatedCuda):
    """The simulator's CUDA device with :class:`_Shared`'s clock: a GPU's kernels, timed as a GPU's are, which a
    process compiling beside does not slow."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        SimulatedCuda.__init__(self)
        self._shared(folder)

    def _cost(self, fn: Any, args: list) -> float:
        return SimulatedCuda.time(self, fn, args, 1)


_turns: list[list[float]] = []  # this process's outer turns: [requested, held from, released], CLOCK_MONOTONIC
_turn = DeviceTurns.turn
_asking: list[Path] = []  # the marker an outer turn's request touches ("asking-<pid>"), once tune() names it


@contextlib.contextmanager
def _logged_turn(self: DeviceTurns, device: torch.device):
    """DeviceTurns.turn, each outer turn logged by the system's monotonic clock (one clock for every process), so
    that a test orders two processes' turns by their events."""
    if self._depth.get(device_key(device)):
        with _turn(self, device) as waited:
            yield waited
        return
    requested = time.monotonic()
    for marker in _asking:
        marker.touch()
    with _turn(self, device) as waited:
        held = time.monotonic()
        try:
            yield waited
        finally:
            _turns.append([requested, held, time.monotonic()])


DeviceTurns.turn = _logged_turn


class MLP(torch.nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def tune(
    markers: str, bank: str, locks: str, work: str, d: int, h: int, peers: int = 1, device: str = "cpu"
) -> dict[str, Any]:
    """Operator tuning of MLP(d, h) on a batch of 8 (its first compiled call) on ``device`` ("cpu", or "gpu": the
    simulator's CUDA device), timed by a shared clock, once ``peers`` processes (this one included) are ready."""
    (Path(markers) / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(Path(markers).glob("ready-*"))) < peers and time.monotonic() < deadline:
        time.sleep(0.01)
    _asking[:] = [Path(markers) / f"asking-{os.getpid()}"]
    torch.manual_seed(0)
    model, x = MLP(d, h).eval(), torch.randn(8, d)
    clock = SharedGpuClock(markers) if device == "gpu" else SharedClock(markers)
    if isinstance(clock, SimulatedCuda):
        clock.to_device(model, x)
    options = {"tuning.bank_dir": bank, "tuning.lock_dir": locks, "tuning.work_path": work, "tuning.budget_s": 0.02}
    backend = AirgraphBackend(make_config(kernel_backend="aten", **{"tuning.mode": "op", **options}), runtime=clock)
    built, beside, candidates = [0], [0], [0, 0]  # units begun; builds beside a measurement; candidates done, of

    def progress(event: str, **info: Any) -> None:
        if event == "unit":  # a unit's candidates are being built
            built[0] += 1
            candidates[:] = [0, info["candidates"]]
        else:
            candidates[0] += 1
        # "<units begun> <its candidates built> <of>": all built once the second unit's last candidate is
        (Path(markers) / f"built-{os.getpid()}").write_text(f"{built[0]} {candidates[0]} {candidates[1]}")
        beside[0] += bool(clock._others(Path(markers) / f"measuring-{os.getpid()}"))  # another process measures

    backend.tuner.progress = progress
    clock.built = lambda: built[0]
    calling = clock.call() if isinstance(clock, SimulatedCuda) else contextlib.nullcontext()
    with torch.no_grad(), calling:
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
    report = backend.tuner.report
    return {
        "units": [[o.name, o.status, o.choice, o.note, o.rounds] for o in report.outcomes],
        "waits": report.waits.to_dict(),
        "printed": str(report),
        "contended": clock.contended,
        "measurements": clock.calls,
        "built_before_measuring": clock.built_before_measuring,
        "built_beside_a_measurement": beside[0],
        "device": backend.reports[0].device,
        "turns": list(_turns),
    }


if __name__ == "__main__":
    markers, bank, locks, work, d, h, threads, peers, device = sys.argv[1:10]
    torch.set_num_threads(int(threads))
    print(json.dumps(tune(markers, bank, locks, work, int(d), int(h), int(peers), device)), flush=True)
