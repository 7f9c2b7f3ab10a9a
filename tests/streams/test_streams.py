"""In-graph multi-stream on the CPU: stream assignment, event edges, validation, equality with eager."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import airgraph
from airgraph import ops, scope
from airgraph.passes.streams import StreamGraphError
from tests.helpers import assert_close, compile_with, make_config
from tests.streams.models import SeedModel

MODES = [("aten", "max-autotune"), ("aten", "reduce-overhead"), ("inductor", "max-autotune")]


def seed_inputs(size: int = 64) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(size, size) for _ in range(4)]


@pytest.mark.parametrize(("kernel_backend", "mode"), MODES)
def test_seed_model_matches_eager(kernel_backend, mode):
    model, inputs = SeedModel(), seed_inputs()
    compiled, backend = compile_with(model, kernel_backend=kernel_backend, mode=mode, fullgraph=True)
    for got, want in zip(compiled(*inputs), model(*inputs), strict=True):
        assert_close(got, want)
    (report,) = backend.reports
    assert len(report.events) == 2


def test_seed_model_stream_assignment_and_event_edges():
    report = airgraph.explain(SeedModel(), *seed_inputs(), config=make_config(kernel_backend="aten"))
    (graph,) = report.graphs
    streams = {n.name: n.stream for n in graph.nodes}
    targets = {n.name: n.target for n in graph.nodes}
    mms = [name for name, t in targets.items() if t == "aten.mm.default"]
    adds = [name for name, t in targets.items() if t == "aten.add.Tensor"]
    assert [streams[m] for m in mms] == ["1", None]  # mm_result on '1', mm1 on the caller's stream
    assert [streams[a] for a in adds] == [None, None, None, "2"]  # add_result, B, C.add_(2), add2
    assert not any("stream_enter" in t or "stream_exit" in t for t in targets.values())  # markers consumed
    assert [(e["tag"], e["record_stream"], e["wait_stream"]) for e in graph.events] == [
        ("66", None, "1"),
        ("77", "1", "2"),
    ]
    # On the CPU (no device streams) the scopes do not split the graph: one segment, no sync points.
    assert [(s.stream, s.backend) for s in graph.segments] == [(None, "aten")]

    # Planned for CUDA (fake tensors, nothing runs): segments split at stream changes and sync points.
    with torch.no_grad():
        planned = airgraph.plan(SeedModel(), *seed_inputs(), device="cuda", config=make_config(kernel_backend="aten"))
    segments = planned.graphs[0].segments
    assert {s.stream for s in segments} == {None, "1", "2"}
    assert sum(s.backend == "sync" for s in segments) == 5  # 2 records, 2 waits, 1 record_tagged_stream
    assert {n.name: n.stream for n in planned.graphs[0].nodes} == streams
    passes = {p.name: p for p in graph.passes}
    assert passes["streams"].changed == sum(1 for n in graph.nodes if n.stream is not None)


def test_streams_pass_switched_off_runs_everything_on_one_stream():
    model, inputs = SeedModel(), seed_inputs()
    report = airgraph.explain(model, *inputs, config=make_config(kernel_backend="aten", **{"passes.streams": False}))
    assert all(n.stream is None for n in report.graphs[0].nodes)
    compiled, _ = compile_with(model, kernel_backend="aten", **{"passes.streams": False})
    for got, want in zip(compiled(*inputs), model(*inputs), strict=True):
        assert_close(got, want)


def test_nested_scopes_innermost_wins():
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x.sin()
        with scope.stream_switch("outer"):
            b = a.cos()
            with scope.stream_switch("inner"):
                c = b.exp()
            d = c + 1
        return d * 2

    report = airgraph.explain(fn, torch.randn(4), config=make_config(kernel_backend="aten"))
    streams = {n.target: n.stream for n in report.graphs[0].nodes}
    assert streams["aten.sin.default"] is None and streams["aten.cos.default"] == "outer"
    assert streams["aten.exp.default"] == "inner" and streams["aten.add.Tensor"] == "outer"
    assert streams["aten.mul.Tensor"] is None


def stream_error(fn) -> StreamGraphError:
    """Compile and call ``fn``; the StreamGraphError the backend raised (Dynamo wraps it)."""
    compiled, _ = compile_with(fn, kernel_backend="aten", fullgraph=True)
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(3))
    exc = info.value
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    assert isinstance(inner, StreamGraphError)
    return inner


def test_wait_without_record_names_tag_and_line():
    event = ops.create_tagged_event("never")

    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("1"):
            ops.tagged_event_wait(event)
            return x + 1

    inner = stream_error(fn)
    assert "'never'" in str(inner) and "never recorded before the wait" in str(inner)
    assert "test_streams.py:" in str(inner)


def test_unbalanced_scope_names_tag_and_line():
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch.ops.airgraph.stream_enter("dangling", 0)  # a scope opened by hand and never closed
        return x * 2

    inner = stream_error(fn)
    assert "unbalanced stream scopes" in str(inner) and "'dangling'" in str(inner) and "test_streams.py:" in str(inner)


def test_priority_out_of_range_names_tag_and_line():
    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("hi", stream_priority=7):
            return x + 1

    inner = stream_error(fn)
    assert "'hi'" in str(inner) and "outside the device's range" in str(inner) and "test_streams.py:" in str(inner)


@pytest.mark.parametrize("bad", [1, None, ""])
def test_non_str_tag_is_refused(bad):
    with pytest.raises(TypeError, match="stream_switch: the tag must be a non-empty str"):
        scope.stream_switch(bad)
    with pytest.raises(TypeError, match="create_tagged_event: the tag must be a non-empty str"):
        ops.create_tagged_event(bad)
    with pytest.raises(TypeError, match="record_tagged_stream: the tag must be a non-empty str"):
        ops.record_tagged_stream(torch.zeros(1), bad)


def test_eager_cpu_calls_are_harmless():
    model, inputs = SeedModel(), seed_inputs()
    first = model(*inputs)
    second = model(*inputs)
    for a, b in zip(first, second, strict=True):
        assert_close(a, b)
    assert_close(first[0], inputs[0] + inputs[1])


def test_explain_writes_a_chrome_trace(tmp_path):
    import json

    path = tmp_path / "trace.json"
    config = make_config(kernel_backend="aten", **{"debug.trace_path": str(path)})
    airgraph.explain(SeedModel(), *seed_inputs(), config=config)
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert any("aten::mm" in n for n in names) and any("aten::add" in n for n in names)


def test_inspect_shows_streams_and_event_edges(tmp_path, capsys):
    from airgraph.cli import main

    script = tmp_path / "seed.py"
    script.write_text(
        "import torch\n"
        "from tests.streams.models import SeedModel\n"
        "def airgraph_example():\n"
        "    return SeedModel(size=8), tuple(torch.randn(8, 8) for _ in range(4))\n"
    )
    assert main(["inspect", str(script), "--kernel-backend", "aten"]) == 0
    out = capsys.readouterr().out
    assert "event edges" in out and "66" in out and "77" in out


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_two_branch_model_matches_single_stream_and_eager(kernel_backend):
    from airgraph.models import TwoBranch, two_branch_inputs

    inputs = two_branch_inputs(4, 32)
    multi, single = TwoBranch(32, 3, streams=True), TwoBranch(32, 3, streams=False)
    compiled, backend = compile_with(multi, kernel_backend=kernel_backend, fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(*inputs), single(*inputs))
    assert {n.stream for n in backend.reports[0].nodes} == {"left", "right", None}
    assert len(backend.reports[0].segments) == 1  # on the CPU the scopes do not split the graph


def test_seed_model_through_torchair_names():
    from types import SimpleNamespace

    from airgraph.compat import torchair as tng

    api = SimpleNamespace(
        create_event=tng.ops.npu_create_tagged_event,
        record=tng.ops.npu_tagged_event_record,
        wait=tng.ops.npu_tagged_event_wait,
        record_stream=tng.ops.npu_record_tagged_stream,
        stream_switch=tng.scope.npu_stream_switch,
    )
    model, inputs = SeedModel(api), seed_inputs()
    config = tng.CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    backend = tng.get_npu_backend(compiler_config=config)
    compiled = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)
    for got, want in zip(compiled(*inputs), model(*inputs), strict=True):
        assert_close(got, want)
    streams = {n.target: n.stream for n in backend.reports[0].nodes if n.target == "aten.mm.default"}
    assert len(backend.reports[0].events) == 2 and streams
