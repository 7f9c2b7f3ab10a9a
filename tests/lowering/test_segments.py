"""Partitioning into segments, the kernel backends, and the executor that wires several segments."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.lowering.aten import compile_aten, fast_callable
from airgraph.lowering.partition import partition
from airgraph.runtime.executor import build_executor
from tests.helpers import lower_all

CPU = torch.device("cpu")

aten = torch.ops.aten


def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.sin(x)
    b = torch.cos(y)
    mean, var = torch.var_mean(a + b, dim=0)  # a multi-output op and its getitems
    c = torch.relu(b) * mean
    return c + var, a


def traced() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, torch.Tensor]]:
    args = (torch.randn(4, 3), torch.randn(4, 3))
    return make_fx(fn, tracing_mode="fake")(*args), args


def annotate(gm: torch.fx.GraphModule, streams: dict) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in streams:
            node.meta["stream"] = streams[node.target]


def test_one_segment_is_the_executor_itself():
    gm, args = traced()
    segments = partition(gm)
    assert len(segments) == 1
    lower_all(segments, "aten")
    run = build_executor(gm, segments, CPU)
    assert run is segments[0].compiled
    for got, want in zip(run(list(args)), fn(*args), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["aten", "interpreter", pytest.param("inductor", marks=pytest.mark.slow)])
def test_segments_split_at_key_changes_and_executor_matches_eager(backend):
    gm, args = traced()
    annotate(gm, {aten.cos.default: "s1", aten.relu.default: "s1"})
    segments = partition(gm)
    keys = [(s.placement, s.stream) for s in segments]
    # sin | cos (s1) | add, var_mean + getitems | relu (s1) | mul, add
    assert keys == [("device", None), ("device", "s1"), ("device", None), ("device", "s1"), ("device", None)]
    var_mean = next(n for n in gm.graph.nodes if n.target == aten.var_mean.correction)
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert {n.meta["segment"] for n in getitems} == {var_mean.meta["segment"]}
    cos_segment = segments[1]
    assert cos_segment.inputs == [n for n in gm.graph.nodes if n.op == "placeholder"][1:]
    assert [n.target for n in cos_segment.outputs] == [aten.cos.default]

    lower_all(segments, backend)
    assert {s.backend for s in segments} == {backend}
    run = build_executor(gm, segments, CPU)
    assert run is not segments[0].compiled
    for got, want in zip(run(list(args)), fn(*args), strict=True):
        torch.testing.assert_close(got, want)
    # Values are dropped after their last reader: the generated source deletes the first segment's output.
    assert "del" in run.source


def test_executor_clears_its_input_list():
    gm, args = traced()
    annotate(gm, {aten.cos.default: "s1"})
    segments = partition(gm)
    lower_all(segments, "aten")
    run = build_executor(gm, segments, CPU)
    boxed = list(args)
    run(boxed)
    assert boxed == []  # AOTAutograd's boxed convention: the callee may free the inputs


def test_aten_codegen_is_straight_line_and_reuses_names():
    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(5):
            x = torch.sin(x) * 1.5
        return x

    gm = make_fx(chain, tracing_mode="fake")(torch.randn(8))
    run = compile_aten(gm)
    assert "del " not in run.source  # every dying value is freed by rebinding its name
    # one line per node (placeholders share the unpacking line), plus "def" and "args.clear()"
    assert run.source.count("\n") == len(gm.graph.nodes) + 2
    x = torch.randn(8)
    torch.testing.assert_close(run([x]), chain(x))


def test_fast_binding_is_used_only_when_it_dispatches_to_the_same_overload():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) + torch.div(x, 2, rounding_mode="floor")

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4))
    nodes = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    assert fast_callable(nodes[aten.sin.default]) is torch._C._VariableFunctions.sin
    assert fast_callable(nodes[aten.div.Tensor_mode]) is torch._C._VariableFunctions.div
    # No binding named after aten._to_copy exists: the OpOverload's own entry point is used.
    to_copy = make_fx(lambda t: t.to(torch.float64), tracing_mode="fake")(torch.randn(2))
    node = next(n for n in to_copy.graph.nodes if n.op == "call_function")
    assert fast_callable(node) is None


def test_inplace_only_on_dying_fresh_values():
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.sin(x) * 2  # sin's result dies at mul: written in place
        view = a.view(-1)  # a is read twice (view and add): not in place
        b = a + y
        c = torch.exp(y) + 1  # exp's result dies: in place
        d = torch.arange(3) + 0.5  # int -> float changes dtype: not in place
        e = torch.cos(y) * torch.ones(2, 3, 3)  # broadcasting grows the shape: not in place
        return b, view, c, d, e

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    gm = make_fx(fn, tracing_mode="fake")(x, y)
    run = compile_aten(gm)
    inplace = {line.split("=")[1].split("(")[0].strip() for line in run.source.splitlines() if "_inplace_" in line}
    assert {name.rsplit("_inplace_", 1)[0] for name in inplace} == {"mul_Tensor", "add_Tensor"}
    assert run.source.count("_inplace_") == 2  # sin*2 and exp+1; not a+y, arange+0.5, cos*ones
    x_before, y_before = x.clone(), y.clone()
    for got, want in zip(run([x, y]), fn(x, y), strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, x_before)  # graph inputs are never written
    torch.testing.assert_close(y, y_before)


def test_a_lone_segment_reading_inputs_out_of_order_is_still_the_executor():
    """The segment's inputs follow the graph's input order, so no wrapper frame only reorders arguments."""

    def reversed_use(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.cos(y) * x,)  # a tuple, as AOTAutograd's graphs return

    args = (torch.randn(4), torch.randn(4))
    gm = make_fx(reversed_use, tracing_mode="fake")(*args)
    (segment,) = partition(gm)
    assert [n.name for n in segment.inputs] == [n.name for n in gm.graph.find_nodes(op="placeholder")]
    lower_all([segment])
    run = build_executor(gm, [segment], CPU)
    assert run is segment.compiled
    torch.testing.assert_close(run(list(args))[0], reversed_use(*args)[0])


def test_a_lone_segment_returns_the_inputs_the_graph_returns():
    """A forward graph returns inputs (parameters saved for the backward): the lone segment returns them too, so
    Inductor may hand back its converted copies, and the segment is still the executor; an input nothing but
    the output reads is among its inputs."""

    def saving(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sin(x) * w, w, y, x

    args = (torch.randn(4), torch.randn(4), torch.randn(4))
    gm = make_fx(saving, tracing_mode="fake")(*args)
    (segment,) = partition(gm)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    assert [n.name for n in segment.inputs] == names
    assert [n.name for n in segment.outputs][1:] == [names[1], names[2], names[0]]
    lower_all([segment], "aten")
    run = build_executor(gm, [segment], CPU)
    assert run is segment.compiled
    for got, want in zip(run(list(args)), saving(*args), strict=True):
        torch.testing.assert_close(got, want)
