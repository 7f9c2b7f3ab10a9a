"""Capture sizes end to end on the simulated CUDA runtime: every batch size up to the largest replays one of a few
graphs and equals eager; a graph that mixes rows runs unpadded and says why."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.report.render import capture_state
from airgraph.runtime.simulated import SimulatedCuda

SIZES = [2, 4, 8]


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(6, 12), torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))).softmax(-1)


class BatchMean(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) - super().forward(x).mean(0)  # mixes rows: the mean over the batch


def compiled(model: torch.nn.Module, sizes: list[int]) -> tuple[object, AirgraphBackend, SimulatedCuda]:
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    config.reduce_overhead.capture_sizes = sizes
    sim = SimulatedCuda()
    backend = AirgraphBackend(config, runtime=sim)
    return torch.compile(model, backend=backend, dynamic=True), backend, sim


def test_random_batches_replay_at_most_one_graph_per_size_and_equal_eager():
    model = Mlp().eval()
    run, backend, sim = compiled(model, SIZES)
    rng = random.Random(0)
    with torch.no_grad():
        for _ in range(25):
            x = torch.randn(rng.randint(1, 8), 6)
            with sim.call():
                got = run(x)
            torch.testing.assert_close(got, model(x))
    sim.check()
    (report,) = [r for r in backend.reports if r.capture_sizes]
    assert report.captured and report.capture_sizes == SIZES
    assert report.capture_keys <= len(SIZES)  # recorded at the first call, one graph per size, never again
    assert report.padded_calls > 0 and report.padded_rows > 0
    assert f"sizes {SIZES}, {report.padded_calls} padded calls" in capture_state(report)  # what explain shows


def test_a_batch_above_the_largest_size_is_right():
    model = Mlp().eval()
    run, _, sim = compiled(model, SIZES)
    with torch.no_grad():
        for batch in (3, 11, 12, 5):
            x = torch.randn(batch, 6)
            with sim.call():
                torch.testing.assert_close(run(x), model(x))
    sim.check()


def test_a_row_mixing_graph_runs_unpadded_and_says_why_once(caplog):
    model = BatchMean().eval()
    run, backend, sim = compiled(model, SIZES)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for batch in (3, 5, 3):
            x = torch.randn(batch, 6)
            with sim.call():
                torch.testing.assert_close(run(x), model(x))
    said = [str(w.message) for w in caught if "capture_sizes" in str(w.message)]
    assert len(said) == 1, said
    assert "mean" in said[0] and f"{__file__}:" in said[0]  # the op, and the line of this file
    (report,) = [r for r in backend.reports if r.kind == "inference"]
    assert report.padding_refused and not report.capture_sizes and report.padded_calls == 0


def test_static_shapes_warn_how_to_make_the_batch_dynamic():
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    config.reduce_overhead.capture_sizes = SIZES
    sim = SimulatedCuda()
    run = torch.compile(Mlp().eval(), backend=AirgraphBackend(config, runtime=sim), dynamic=False)
    with pytest.warns(UserWarning, match=r"mark_dynamic\(x, 0\)"), torch.no_grad(), sim.call():
        run(torch.randn(3, 6))


@pytest.mark.parametrize("bad", [[0, 2], [2.0], "8", [True]])
def test_a_bad_capture_sizes_value_is_refused_naming_the_option(bad):
    config = airgraph.CompilerConfig()
    with pytest.raises(ValueError, match=r"reduce_overhead\.capture_sizes: invalid value"):
        config.reduce_overhead.capture_sizes = bad
