"""Measuring candidates: checked against the default's outputs first, then timed side by side.

- **Checked first**: a candidate runs on the same inputs as the default (inputs a segment writes in place are
  fresh copies for each run) and must give the same outputs (values within the dtype's tolerance, same sizes and
  strides) and leave the written inputs the same; otherwise it is dropped, with the reason.
- **Timed through the device runtime** (runtime/device.py ``time``: CUDA events on CUDA, ``perf_counter`` on the
  CPU, the simulator's cost model in tests): each ``time`` call is the median of ``iters`` calls after a warm-up
  call. Candidates are timed in interleaved rounds (default, a, b, default, a, b, ...), so load from other
  processes hits all of them alike; a candidate's time is the median of its rounds. A graph that reduce-overhead
  replays on CUDA is timed by :class:`DeviceClock`: its kernels back to back, no host launching between them.
- **Busy machines say so**: a verdict that the default won needs quiet measurements, or a default that beats
  every candidate as a winner must beat it (below): while neither holds, the rounds are measured again (up to
  :data:`REPEATS` more times, the rounds pooled); still so, the unit is *inconclusive*: reported with its spread,
  and no memo goes into the bank (the next tuning run measures it again). A winner needs no quiet: it beats the
  default by more than the spread (below).
- **Beating the default**: by more than the measured run-to-run spread, and by at least :data:`MIN_GAIN`: the
  candidate's median is at least 3% below the default's, and its rounds' interquartile range lies wholly below
  the default's (its third quartile under the default's first), so the gap between the two is wider than what
  either varies from round to round. On a shared machine a round's time can vary by half (other processes
  thrash the caches); the quartiles stand where a spread-widened threshold would refuse a five-fold gain.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "MIN_GAIN",
    "NOISY",
    "Budget",
    "Decision",
    "DeviceClock",
    "Timing",
    "beats",
    "check",
    "decide",
    "fresh_inputs",
    "reference_outputs",
    "time_side_by_side",
]

MIN_GAIN = 0.03
ROUNDS = 9
NOISY = 0.10  # relative interquartile range of the rounds above which "the default won" is not a verdict
REPEATS = 2
ROUND_SECONDS = 0.01  # what one time() call aims to take
TOLERANCES = {
    torch.float32: {"rtol": 1e-3, "atol": 1e-4},
    torch.float16: {"rtol": 1e-2, "atol": 1e-2},
    torch.bfloat16: {"rtol": 5e-2, "atol": 5e-2},
}


@dataclass
class Timing:
    rounds: list[float] = field(default_factory=list)  # seconds: each round's median

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def quartiles(self) -> tuple[float, float]:
        """First and third quartiles of the rounds."""
        if len(self.rounds) < 2:
            return self.median, self.median
        q1, _, q3 = statistics.quantiles(self.rounds, n=4, method="inclusive")
        return q1, q3

    @property
    def spread(self) -> float:
        """Relative interquartile range of the rounds (run-to-run spread)."""
        q1, q3 = self.quartiles
        return (q3 - q1) / self.median if self.median > 0 else 0.0


def beats(candidate: Timing, default: Timing) -> bool:
    """Whether ``candidate`` is faster than ``default`` by at least MIN_GAIN and by more than the run-to-run spread
    (see the module docstring)."""
    return candidate.median < default.median * (1 - MIN_GAIN) and candidate.quartiles[1] < default.quartiles[0]


def fresh_inputs(inputs: list[Any], written: frozenset[int] | set[int]) -> list[Any]:
    """``inputs`` with the ones a callable writes in place replaced by copies (same layout)."""
    out = list(inputs)
    for i in written:
        value = inputs[i]
        if isinstance(value, torch.Tensor):
            copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
            out[i] = copy.copy_(value)
    return out


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def check(
    fn: Callable[[list], Any],
    inputs: list[Any],
    written: frozenset[int] | set[int],
    reference: list[Any],
    *,
    strides: bool = True,
) -> str | None:
    """Run ``fn`` once on fresh inputs and compare with ``reference`` (the default's outputs, then its written
    inputs); None when they agree, else the reason. ``strides``: the layouts must agree too (a segment's outputs;
    an operator's choice gets the graph's layout when it is applied, whatever the default lowered alone gave)."""
    try:
        outputs = reference_outputs(fn, inputs, written)
    except Exception as exc:  # a candidate that fails is dropped, with why
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    if len(outputs) != len(reference):
        return f"returned {len(outputs)} values, the default {len(reference)}"
    for i, (got, want) in enumerate(zip(outputs, reference, strict=True)):
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                return f"output {i} is not a tensor"
            if got.shape != want.shape or (strides and got.numel() > 1 and got.stride() != want.stride()):
                got_layout, want_layout = (tuple(got.shape), got.stride()), (tuple(want.shape), want.stride())
                return f"output {i}: sizes, strides {got_layout}, the default's {want_layout}"
            try:
                torch.testing.assert_close(got, want, **TOLERANCES.get(want.dtype, {}), equal_nan=True)
            except AssertionError as exc:
                lines = [line for line in str(exc).splitlines() if "mismatched" in line.lower()]
                return f"output {i} differs from the default's ({lines[0].strip() if lines else 'values'})"
        elif got != want:
            return f"output {i}: {got!r}, default {want!r}"
    return None


def reference_outputs(fn: Callable[[list], Any], inputs: list[Any], written: frozenset[int] | set[int]) -> list[Any]:
    """The default's outputs and written inputs, to check candidates against."""
    args = fresh_inputs(inputs, written)
    return _outputs(fn(list(args))) + [args[i] for i in sorted(written)]


def iterations(fn: Callable[[list], Any], inputs: list[Any], runtime: Any) -> int:
    """How many calls one ``time`` call makes, so that it takes about ROUND_SECONDS of the measured time or of the
    wall clock, the longer (a clock that hides the host's launching spends more than it measures)."""
    start = time.perf_counter()
    one = runtime.time(fn, inputs, 1)
    per_call = max(one, (time.perf_counter() - start) / 2)  # the warm-up call and the timed one
    if per_call <= 0:
        return 3
    return max(3, min(200, int(ROUND_SECONDS / per_call)))


class DeviceClock:
    """A CUDA runtime's clock for a graph that reduce-overhead replays: ``time`` is the runtime's ``device_time``,
    the call's kernels back to back (a replay launches none from the host), finding the L2 cache overwritten
    where the graph's inputs outgrow it (``flush_l2``: a layer then reads its weights from HBM in every step)."""

    def __init__(self, runtime: Any, flush_l2: bool) -> None:
        self.runtime, self.flush_l2 = runtime, flush_l2

    @classmethod
    def of(cls, runtime: Any, device: Any, mode: str, input_bytes: int) -> Any:
        """The clock to measure a graph of ``input_bytes`` with: this one where reduce-overhead replays it on a
        CUDA runtime that has ``device_time``, else ``runtime`` itself."""
        if mode != "reduce-overhead" or device.type != "cuda" or not hasattr(runtime, "device_time"):
            return runtime
        return cls(runtime, input_bytes > runtime.l2_bytes(device))

    def time(self, fn: Callable[[list], Any], args: list, iters: int) -> float:
        return self.runtime.device_time(fn, args, iters, flush_l2=self.flush_l2)


def time_side_by_side(
    fns: dict[str, Callable[[list], Any]],
    inputs: list[Any],
    runtime: Any,
    *,
    written: frozenset[int] | set[int] = frozenset(),
    rounds: int = ROUNDS,
) -> dict[str, Timing]:
    """Interleaved rounds of ``runtime.time`` over ``fns``, each on its own copy of the inputs it writes."""
    own = {name: fresh_inputs(inputs, written) for name in fns}
    iters = {name: iterations(fn, own[name], runtime) for name, fn in fns.items()}
    timings = {name: Timing() for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            timings[name].rounds.append(runtime.time(fn, own[name], iters[name]))
    return timings


class Budget:
    """Seconds left for one unit's candidates (compiling and measuring them)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.perf_counter() + seconds

    def allows(self, expensive: bool = False) -> bool:
        """Whether a candidate may start: any while time is left, an expensive one (an Inductor compile, seconds)
        only while half of it is."""
        left = self.deadline - time.perf_counter()
        return left > (self.seconds / 2 if expensive else 0)


@dataclass
class Decision:
    """Candidates timed against ``"default"``: the fastest one that beats it (None: the default stays), whether
    that was decided (False: no winner and the rounds too noisy to call the default the winner) and how many
    rounds each variant ran."""

    timings: dict[str, Timing]
    winner: str | None
    conclusive: bool

    @property
    def rounds(self) -> int:
        return len(self.timings["default"].rounds)

    @property
    def spread(self) -> float:
        """The largest run-to-run spread among the default and the winner (or every variant, without one)."""
        names = ["default", self.winner] if self.winner else list(self.timings)
        return max(self.timings[name].spread for name in names)


def decide(
    fns: dict[str, Callable[[list], Any]],
    inputs: list[Any],
    runtime: Any,
    *,
    written: frozenset[int] | set[int] = frozenset(),
    eligible: Callable[[str], bool] = lambda name: True,
    rounds: int = ROUNDS,
) -> Decision:
    """Time ``fns`` (one named "default") side by side and pick the fastest eligible one that :func:`beats` the
    default; measure again while no winner is found and the rounds are noisy (module docstring)."""
    timings = time_side_by_side(fns, inputs, runtime, written=written, rounds=rounds)
    for attempt in range(REPEATS + 1):
        winners = [n for n in fns if n != "default" and eligible(n) and beats(timings[n], timings["default"])]
        if winners:
            return Decision(timings, min(winners, key=lambda n: timings[n].median), True)
        quiet = all(t.spread <= NOISY for t in timings.values())
        # The default needs no quiet either when it beats every candidate (by more than their spreads).
        clear = all(beats(timings["default"], timings[n]) for n in fns if n != "default" and eligible(n))
        if quiet or clear or attempt == REPEATS:
            return Decision(timings, None, quiet or clear)
        more = time_side_by_side(fns, inputs, runtime, written=written, rounds=rounds)
        for name, timing in more.items():
            timings[name].rounds.extend(timing.rounds)
    raise AssertionError("unreachable")
