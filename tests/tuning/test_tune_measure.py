"""Deciding between candidates: a winner beats the default by more than the spread; a busy machine is measured
again, and a verdict that the default won is only given on quiet rounds."""

from __future__ import annotations

import itertools

from airgraph.tuning.measure import NOISY, REPEATS, ROUNDS, decide


class ScriptedTimer:
    """A runtime whose ``time`` returns each function's next scripted seconds (the functions are not run)."""

    def __init__(self, script: dict[str, list[float]]) -> None:
        self.cycles = {name: itertools.cycle(values) for name, values in script.items()}
        self.calls = 0

    def time(self, fn, args, iters):
        self.calls += 1
        return next(self.cycles[fn.name])


def named(name: str):
    def fn(args):
        return args

    fn.name = name
    return fn


def run(script: dict[str, list[float]]):
    timer = ScriptedTimer(script)
    return decide({name: named(name) for name in script}, [], timer), timer


def test_a_candidate_clearly_faster_wins_on_the_first_rounds():
    decision, _ = run({"default": [10.0, 10.2, 9.9], "a": [7.0, 7.1, 6.9], "b": [9.8, 10.1, 10.0]})
    assert decision.winner == "a" and decision.conclusive and decision.rounds == ROUNDS


def test_quiet_rounds_without_a_winner_are_a_verdict_for_the_default():
    decision, _ = run({"default": [10.0, 10.1, 9.9], "a": [10.0, 9.9, 10.1]})
    assert decision.winner is None and decision.conclusive and decision.rounds == ROUNDS
    assert decision.spread <= NOISY


def test_noisy_rounds_are_measured_again_then_called_inconclusive():
    # Every other round is slowed by half (another process on the core): a candidate 10% faster cannot be told apart.
    decision, timer = run({"default": [10.0, 15.0], "a": [9.0, 13.5]})
    assert decision.winner is None and not decision.conclusive
    assert decision.rounds == ROUNDS * (REPEATS + 1) and decision.spread > NOISY
    # each time_side_by_side calls time() once per function to calibrate, then once per round
    assert timer.calls == 2 * (REPEATS + 1) * (ROUNDS + 1)


def test_noise_that_settles_gives_a_verdict_from_the_pooled_rounds():
    # First 9 rounds: 5 slowed by 60% (noisy); then quiet rounds until the pooled quartiles are quiet again.
    noisy = [10.0] + [10.0, 16.0] * 4 + [16.0]
    quiet = [10.0] * (ROUNDS + 1)
    timer = ScriptedTimer({})
    timer.cycles = {name: iter(noisy + quiet + quiet) for name in ("default", "a")}
    decision = decide({name: named(name) for name in ("default", "a")}, [], timer)
    assert decision.conclusive and decision.winner is None
    assert decision.rounds == 3 * ROUNDS and decision.spread <= NOISY


def test_a_default_that_beats_every_candidate_needs_no_quiet_rounds():
    # Every other round slowed by half, as above, but every candidate takes more than twice the default's time: the
    # default won (the 14 us GEMM of issue #20 whose candidates took 31 to 70 us was called inconclusive).
    decision, _ = run({"default": [10.0, 15.0], "a": [25.0, 37.5], "b": [40.0, 60.0]})
    assert decision.winner is None and decision.conclusive and decision.spread > NOISY
    assert decision.rounds == ROUNDS  # decided on the first rounds: nothing measured again
    # One candidate within the noise of the default: no verdict, as before.
    decision, _ = run({"default": [10.0, 15.0], "a": [25.0, 37.5], "b": [10.5, 15.5]})
    assert decision.winner is None and not decision.conclusive
