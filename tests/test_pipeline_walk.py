"""compile_graph as one pipeline (issue #21), measured by scripts/pipeline_walk.py: the graph's walk climbs back up
at most 10 times and enters no module more than 4 times, a graph with host work goes through the same steps as
one without (the host split in front), and the capture plan (with its host plan) is made once and handed on."""

from __future__ import annotations

import pytest

from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import load_script

STEPS = {"run_pipeline", "plan_capture", "split_host_work", "partition", "build_executor"}
PIPELINE = [
    ("passes/pipeline.py", "run_pipeline"),
    ("lowering/capture_plan.py", "plan_capture"),
    ("lowering/partition.py", "partition"),
    ("runtime/executor.py", "build_executor"),
]


@pytest.mark.parametrize("model", ["_decode", "_fragment"])
def test_every_graph_walks_one_pipeline_and_is_planned_once(model):
    walk = load_script("pipeline_walk")
    stops = walk.walk(getattr(walk, model)(SimulatedCuda()))
    summary = walk.summary(stops)
    assert summary["climbs"] <= walk.MAX_CLIMBS and max(summary["entries"].values()) <= walk.MAX_ENTRIES
    expected = list(PIPELINE)
    if model == "_fragment":  # host work: split off first, then the device program takes the same steps
        expected.insert(2, ("lowering/host_split.py", "split_host_work"))
    assert [(module, function) for _, module, function in stops if function in STEPS] == expected
    planned = [function for _, module, function in stops if module == "lowering/capture_plan.py"]
    assert planned.count("plan_host_work") == (model == "_fragment"), planned  # by plan_capture, handed on
    assert summary["entries"]["lowering/capture_plan.py"] == 1
