"""compile_graph as one pipeline (issue #21), measured by scripts/pipeline_walk.py: the graph's walk climbs back up
at most 10 times and enters no module more than 4 times, and the capture plan (with its host plan) is made once
and handed on: a graph with host work is planned once, not asked again by the host split or the report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airgraph.runtime.simulated import SimulatedCuda

ROOT = Path(__file__).resolve().parent.parent


def _walk_module():
    spec = importlib.util.spec_from_file_location("pipeline_walk", ROOT / "scripts" / "pipeline_walk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_host_split_graph_is_planned_once_and_walks_one_pipeline():
    walk = _walk_module()
    stops = walk.walk(walk._fragment(SimulatedCuda()))
    summary = walk.summary(stops)
    functions = [function for _, module, function in stops if module == "lowering/capture_plan.py"]
    assert functions.count("plan_host_work") == 1, functions  # by plan_capture, and handed on
    assert summary["entries"]["lowering/capture_plan.py"] == 1
    assert summary["climbs"] <= walk.MAX_CLIMBS and max(summary["entries"].values()) <= walk.MAX_ENTRIES
    order = [(module, function) for _, module, function in stops if function in STEPS]
    assert order == [
        ("passes/pipeline.py", "run_pipeline"),
        ("lowering/capture_plan.py", "plan_capture"),
        ("lowering/host_split.py", "split_host_work"),
        ("lowering/partition.py", "partition"),
        ("runtime/executor.py", "build_executor"),
    ]


STEPS = {"run_pipeline", "plan_capture", "split_host_work", "partition", "build_executor"}


def test_a_graph_without_host_work_walks_the_same_steps():
    walk = _walk_module()
    stops = walk.walk(walk._decode(SimulatedCuda()))
    summary = walk.summary(stops)
    assert summary["climbs"] <= walk.MAX_CLIMBS and max(summary["entries"].values()) <= walk.MAX_ENTRIES
    order = [(module, function) for _, module, function in stops if function in STEPS]
    assert order == [
        ("passes/pipeline.py", "run_pipeline"),
        ("lowering/capture_plan.py", "plan_capture"),
        ("lowering/partition.py", "partition"),
        ("runtime/executor.py", "build_executor"),
    ]
