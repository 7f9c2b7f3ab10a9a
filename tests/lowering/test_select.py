"""The seam: one place chooses each segment's implementation, in a fixed order, and every report says who chose."""

from __future__ import annotations

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.cli import main
from airgraph.lowering.select import CHOSEN_BY, STEPS, GraphRequest, Impl, choose
from airgraph.runtime.capture import ObservedRun
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import assert_close, make_config


class Store:
    """A store answering the seam for every device segment (as the kernel library or the tuning bank do)."""

    def __init__(self, chosen_by: str, backend: str = "aten") -> None:
        self.chosen_by, self.backend, self.asked = chosen_by, backend, []

    def lookup(self, segment, request):
        self.asked.append(segment.id)
        return Impl(self.backend, self.chosen_by, source={"key": f"entry-{segment.id}"})


def fn(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def compiled_with(config=None, *, static_kernels=None, tuning=None):
    backend = AirgraphBackend(config or make_config())
    backend.static_kernels, backend.tuning = static_kernels, tuning
    return torch.compile(fn, backend=backend), backend


def test_the_steps_are_in_the_documented_order():
    assert (
        [name for name, _ in STEPS]
        == list(CHOSEN_BY)
        == ["debug", "host", "compare", "static_kernels", "tuning", "config"]
    )


@pytest.mark.parametrize(
    ("stores", "expected"),
    [
        ({}, ("inductor", "config")),
        ({"tuning": "tuning"}, ("aten", "tuning")),
        ({"static_kernels": "static_kernels", "tuning": "tuning"}, ("aten", "static_kernels")),
    ],
)
def test_the_first_step_that_answers_wins_and_reports_say_who(stores, expected):
    made = {name: Store(chosen_by) for name, chosen_by in stores.items()}
    compiled, backend = compiled_with(**made)
    x = torch.randn(8)
    assert_close(compiled(x), fn(x))
    (segment,) = backend.reports[0].segments
    assert (segment.backend, segment.chosen_by) == expected
    if made:
        assert segment.source == {"key": "entry-0"}
    if "static_kernels" in made:
        assert made["tuning"].asked == []  # a later step is not even asked


def test_debug_beats_every_store():
    tuning = Store("tuning")
    compiled, backend = compiled_with(make_config(**{"debug.run_eagerly": True}), tuning=tuning)
    x = torch.randn(8)
    assert_close(compiled(x), fn(x))
    (segment,) = backend.reports[0].segments
    assert (segment.backend, segment.chosen_by) == ("interpreter", "debug") and tuning.asked == []


def test_a_step_answering_as_another_is_a_bug():
    class Liar(Store):
        def lookup(self, segment, request):
            return Impl("aten", "config")

    request = GraphRequest("inference", torch.device("cpu"), make_config(), tuning=Liar("tuning"))
    from airgraph.graph.program import Segment

    with pytest.raises(AssertionError, match="the seam's 'tuning' step answered as 'config'"):
        choose(Segment(id=0, placement="device", stream=None, nodes=[]), request)


def test_explain_and_inspect_show_chosen_by(tmp_path, capsys):
    report = airgraph.explain(fn, torch.randn(8), config=make_config(kernel_backend="aten"))
    assert report.to_dict()["graphs"][0]["segments"][0]["chosen_by"] == "config"
    script = tmp_path / "example.py"
    script.write_text("import torch\ndef airgraph_example():\n    return torch.sin, (torch.randn(4),)\n")
    assert main(["inspect", str(script), "--kernel-backend", "aten"]) == 0
    out = capsys.readouterr().out
    assert "chosen by" in out and "config" in out


@pytest.mark.parametrize("simulated", [False, True], ids=["cpu", "simulated-cuda"])
def test_a_shape_observer_hears_each_new_key_once_captured_or_not(simulated):
    """Static kernels record shapes here: GraphCapture tells of each new key (simulated CUDA, captured), the
    executor's ObservedRun does on the CPU (uncaptured)."""
    heard: list[tuple] = []

    def factory(report, segments):
        assert [s.backend for s in segments] == ["aten"]
        return lambda key, args: heard.append(tuple(a.shape for a in args if isinstance(a, torch.Tensor)))

    runtime = SimulatedCuda() if simulated else None
    backend = AirgraphBackend(make_config(kernel_backend="aten", mode="reduce-overhead"), runtime=runtime)
    backend.shape_observers.append(factory)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in (4, 4, 6, 4, 6, 9):
        x = torch.randn(n)
        assert_close(compiled(x), fn(x))
    assert heard == [((4,),), ((6,),), ((9,),)]
    (report,) = backend.reports
    assert report.captured is simulated and report.capture_keys == (3 if simulated else 0)


def test_an_observed_run_passes_calls_through():
    calls = []
    run = ObservedRun(lambda args: [a * 2 for a in args], lambda key, args: calls.append(key), static_indices=[1])
    weight = torch.ones(2)
    assert torch.equal(run([torch.ones(3), weight])[0], torch.full((3,), 2.0))
    run([torch.zeros(3), torch.zeros(2)])  # same key: the static input (position 1) is not part of it
    run([torch.zeros(5), weight])
    assert [key[0][1] for key in calls] == [torch.Size([3]), torch.Size([5])]
