import json

import torch
from torch import nn

import airgraph
from tests.helpers import make_config

NODE_KEYS = {"name", "target", "stream", "placement", "segment", "device"}
SEGMENT_KEYS = {"id", "stream", "placement", "backend", "num_nodes", "chosen_by", "source"}
PASS_KEYS = {"name", "enabled", "changed", "details"}


def test_explain_report_has_the_documented_shape():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        report = airgraph.explain(model, torch.randn(3, 4), config=make_config(kernel_backend="aten"))
    data = json.loads(json.dumps(report.to_dict()))  # plain JSON all the way down
    (graph,) = data["graphs"]
    assert {"id", "mode", "nodes", "segments", "passes", "captured"} <= set(graph)
    assert graph["mode"] == "max-autotune" and graph["captured"] is False and graph["kind"] == "inference"
    assert all(set(node) >= NODE_KEYS for node in graph["nodes"])
    assert all(set(seg) >= SEGMENT_KEYS for seg in graph["segments"])
    assert all(set(p) >= PASS_KEYS for p in graph["passes"])
    assert [p["name"] for p in graph["passes"]] == [
        "streams",
        "concat_linear",
        "host_placement",
        "remove_noops",
        "dead_code_elimination",
        "fallback",
    ]
    targets = [n["target"] for n in graph["nodes"]]
    assert "aten.relu.default" in targets and targets[-1] == "output"
    for node in graph["nodes"]:
        assert node["stream"] is None and node["placement"] == "device"
        assert (node["segment"] is None) == (node["target"] in ("placeholder", "output"))
    (segment,) = graph["segments"]
    assert segment == {
        "id": 0,
        "stream": None,
        "placement": "device",
        "backend": "aten",
        "num_nodes": segment["num_nodes"],
        "chosen_by": "config",
        "source": {},
    }
    assert segment["num_nodes"] == sum(1 for n in graph["nodes"] if n["segment"] == 0)
    assert data["config"]["kernel_backend"] == "aten"


def test_explain_reports_pass_changes_and_switches():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x.reshape(x.shape) * 1) - 1

    on = airgraph.explain(fn, torch.randn(5), config=make_config(kernel_backend="aten"))
    noops = {p.name: p for p in on.graphs[0].passes}["remove_noops"]
    assert noops.enabled and noops.changed == 2
    assert any("aten.view.default" in line for line in noops.details)
    assert any("aten.mul.Tensor" in line for line in noops.details)
    assert not any(n.target in ("aten.view.default", "aten.mul.Tensor") for n in on.graphs[0].nodes)

    off = airgraph.explain(
        fn, torch.randn(5), config=make_config(kernel_backend="aten", **{"passes.remove_noops": False})
    )
    noops_off = {p.name: p for p in off.graphs[0].passes}["remove_noops"]
    assert not noops_off.enabled and noops_off.changed == 0
    assert any(n.target == "aten.mul.Tensor" for n in off.graphs[0].nodes)


def test_explain_lists_graph_breaks_and_training_graphs():
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    report = airgraph.explain(fn, torch.randn(3), config=make_config(kernel_backend="aten"))
    assert report.dynamo_graphs == 2 and len(report.graphs) == 2
    assert report.graph_breaks and any("graph_break" in reason for reason in report.graph_breaks)

    model = nn.Linear(3, 2)
    training = airgraph.explain(model, torch.randn(4, 3), config=make_config(kernel_backend="aten"))
    assert [g.kind for g in training.graphs] == ["forward"]  # the backward compiles when backward runs


def test_explain_reduce_overhead_on_cpu_is_uncaptured():
    model = nn.Linear(3, 2).eval()
    with torch.no_grad():
        report = airgraph.explain(
            model, torch.randn(4, 3), config=make_config(mode="reduce-overhead", kernel_backend="aten")
        )
    graph = report.graphs[0].to_dict()
    assert graph["mode"] == "reduce-overhead" and graph["captured"] is False
    assert "cpu" in graph["uncaptured_reason"]


def test_printing_a_report_gives_a_short_summary():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        report = airgraph.explain(model, torch.randn(3, 4), config=make_config(kernel_backend="aten"))
    text = str(report)
    assert text.splitlines()[0] == "airgraph report: 1 ATen graph(s) from 1 Dynamo graph(s), 0 graph break(s)"
    graph = report.graphs[0]
    assert f"graph {graph.id} (inference, cpu, max-autotune)" in text and "[aten/config]" in text
    assert len(text) < 400 and len(repr(report)) < 200 and len(repr(graph)) < 300


def test_inspect_tables_are_not_cut_when_redirected(tmp_path, capsys):
    from airgraph.cli import main

    script = tmp_path / "example.py"
    script.write_text(
        "import torch\n"
        "def airgraph_example():\n"
        "    return (lambda x: torch.nn.functional.gelu(torch.sin(x) * 2)), (torch.randn(4),)\n"
    )
    assert main(["inspect", str(script), "--kernel-backend", "aten"]) == 0
    out = capsys.readouterr().out  # not a terminal: rich would cut at 80 columns
    assert max(len(line) for line in out.splitlines()) > 80
    assert "aten.gelu.default" in out
