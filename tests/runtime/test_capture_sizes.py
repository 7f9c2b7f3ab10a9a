"""Capture sizes end to end on the simulated CUDA runtime: every batch size up to the largest replays one of a few
graphs and equals eager; a graph that mixes rows runs unpadded and says why."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.models import build_serving_decode, build_tiny_llama, decode_inputs, mark_batch_dynamic
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


def compiled(
    model: torch.nn.Module, sizes: list[int], dynamic: bool | None = True
) -> tuple[object, AirgraphBackend, SimulatedCuda]:
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    config.reduce_overhead.capture_sizes = sizes
    sim = SimulatedCuda()
    backend = AirgraphBackend(config, runtime=sim)
    return torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=True), backend, sim


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


SERVING_SIZES = [1, 2, 4, 8]


def test_a_padded_serving_decode_over_several_steps_equals_eager():
    """A serving engine's decode step (caches that follow the batch, written at each row's position), traced as
    CUDA on the simulated device: random batches of the same requests over several steps, padded, give eager's
    logits and caches every step; every graph recorded is one of the capture sizes (a batch of 1 is Dynamo's own
    static graph: size 1)."""
    step = build_serving_decode("micro")
    run, backend, sim = compiled(step, SERVING_SIZES, dynamic=None)
    eager_k, eager_v = step.new_caches(8)
    k, v = step.new_caches(8)
    sim.to_device(step, *k, *v)
    positions = torch.randint(0, 20, (8,), generator=torch.Generator().manual_seed(1))  # each request's own
    rng = random.Random(0)
    with torch.no_grad():
        for t in range(12):
            batch = rng.choice([1, 3, 5, 7, 8, 2])
            tokens = torch.randint(0, step.config.vocab_size, (batch, 1), generator=torch.Generator().manual_seed(t))
            rows = [c[:batch] for c in (*k, *v)]
            args = (tokens, positions[:batch].clone(), rows[:1], rows[1:])
            sim.to_device(args[0], args[1], *rows)
            mark_batch_dynamic(*args)
            with sim.call():
                logits = run(*args).clone()  # (the replay's output let go before the next call)
            want = step(tokens, positions[:batch], [c[:batch] for c in eager_k], [c[:batch] for c in eager_v])
            torch.testing.assert_close(logits, want)
            for got, cache in zip((*k, *v), (*eager_k, *eager_v), strict=True):
                torch.testing.assert_close(got, cache)  # the real rows written, the others untouched
            positions[:batch] += 1
    sim.check()
    (padded,) = [r for r in backend.reports if r.capture_sizes]
    assert padded.device == "cuda:0"
    assert padded.capture_sizes == [2, 4, 8] and padded.padded_calls > 0  # a batch of 1 never reaches this graph
    assert sum(r.capture_keys for r in backend.reports) <= len(SERVING_SIZES)


def test_tiny_llamas_max_batch_cache_runs_unpadded_and_says_why():
    """TinyLlama's own decode slices a cache of the largest batch: refused, with its reason; still right."""
    model = build_tiny_llama("micro", max_batch_size=8)
    eager = build_tiny_llama("micro", max_batch_size=8)
    run, backend, sim = compiled(model, SIZES)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for pos, batch in enumerate((3, 5, 3)):
            tokens, input_pos = decode_inputs(model.config, batch, pos, seed=pos)
            with sim.call():
                torch.testing.assert_close(run(tokens, input_pos).clone(), eager(tokens, input_pos))
    sim.check()
    said = [str(w.message) for w in caught if "capture_sizes" in str(w.message)]
    assert len(said) == 1 and "takes a batch of rows from a tensor of fixed size" in said[0], said
    (report,) = [r for r in backend.reports if r.kind == "inference"]
    assert "tensor of fixed size" in report.padding_refused and report.padded_calls == 0


def test_sizes_below_dynamos_smallest_batch_are_not_recorded_and_a_batch_of_one_is_not_static():
    """Dynamo gives a batch of 1 a static graph of its own: the padded graph records no size 1, and the batch-1
    graph is not mistaken for static shapes (no warning)."""
    model = Mlp().eval()
    run, backend, sim = compiled(model, [1, 2, 4])
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for batch in (3, 1, 2, 1):
            x = torch.randn(batch, 6)
            with sim.call():
                torch.testing.assert_close(run(x).clone(), model(x))
    assert not [str(w.message) for w in caught if "capture_sizes" in str(w.message)]
    (padded,) = [r for r in backend.reports if r.capture_sizes]
    assert padded.capture_sizes == [2, 4] and padded.capture_keys == 2
    assert sum(r.capture_keys for r in backend.reports) == 3
