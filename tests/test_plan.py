"""Planning for a GPU without one: explain/plan on fake CUDA inputs compile without running anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.lowering.backends import KERNEL_BACKENDS
from airgraph.lowering.capture_plan import find_uncapturable
from airgraph.models import build_tiny_llama, decode_inputs
from airgraph.passes import run_pipeline
from airgraph.report.explain import PlanError, explain, plan
from airgraph.report.fake import fake_cuda_guard, fake_inputs
from tests.helpers import assert_close, compile_with, make_config
from tests.passes.test_host_placement import context


@pytest.fixture
def no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel backend raises: planning must not lower a single segment."""

    def refuse(*args, **kwargs):
        raise AssertionError("a planned compilation lowered a segment")

    for name, entry in list(KERNEL_BACKENDS.items()):
        monkeypatch.setitem(KERNEL_BACKENDS, name, dataclasses.replace(entry, fn=refuse))


def hf_positions(hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """HF-style decode arithmetic: cache position, position ids, a causal + padding mask, the next position."""
    bsz, seq_len = hidden.shape[:2]
    past = attention_mask.shape[1] - seq_len
    cache_position = torch.arange(past, past + seq_len, device=hidden.device)
    position_ids = cache_position.unsqueeze(0).expand(bsz, -1)
    target = attention_mask.shape[-1]
    causal = torch.full((seq_len, target), -1e9, dtype=hidden.dtype, device=hidden.device)
    causal = causal * (torch.arange(target, device=hidden.device) > cache_position.reshape(-1, 1))
    causal = causal[None, None] + (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * -1e9
    return hidden * position_ids[..., None].to(hidden.dtype), causal, int(cache_position[-1].item()) + 1


def test_plan_tiny_llama_reports_every_node_without_running(no_kernels):
    model = build_tiny_llama("micro")
    weight = model.output.weight
    tokens, pos = decode_inputs(model.config, 1, 4)
    with torch.no_grad():
        report = plan(model, tokens, pos, device="cuda")  # default config: Inductor, never called
    (graph,) = report.graphs
    assert graph.planned and graph.device == "cuda:0" and graph.kind == "inference"
    assert all(n.placement in ("host", "device") for n in graph.nodes)
    assert all((n.segment is None) == (n.target in ("placeholder", "output")) for n in graph.nodes)
    assert {s.backend for s in graph.segments} == {"inductor"} and not graph.captured
    assert model.output.weight is weight and weight.device.type == "cpu" and not isinstance(weight, FakeTensor)
    data = report.to_dict()["graphs"][0]
    assert data["planned"] is True and "host_placement" in data


def test_planned_dynamic_decode_is_capturable_with_its_float_inputs_copied_per_call(no_kernels):
    """With dynamic=True Dynamo passes Python floats (RMSNorm's eps) as 0-dim CPU inputs; a kernel reading one
    would freeze it at recording, so reduce-overhead copies it to the device before every replay."""
    model = build_tiny_llama("micro")
    config = make_config(kernel_backend="aten", mode="reduce-overhead")
    with torch.no_grad():
        report = plan(model, *decode_inputs(model.config, 1, 4), device="cuda", dynamic=True, config=config)
    (graph,) = report.graphs
    assert graph.uncaptured_reason is None
    assert graph.host_prologue["per_call"] and len(graph.host_prologue["transfers"]) == model.config.n_layers * 2 + 1
    assert graph.host_placement["copies"] == graph.host_prologue["transfers"]


def test_planning_a_training_graph_on_a_cpu_only_build_says_what_to_do():
    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build plans training graphs")
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match=r"torch\.no_grad"):
        plan(model, torch.randn(2, 4), device="cuda", config=make_config(kernel_backend="aten"))


def test_explain_plans_when_the_user_fakes_the_inputs(no_kernels):
    def fn(x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(3, device=x.device) + 1
        return x[rows] + x[1:].sum()  # Python indexing of fake CUDA tensors

    with fake_cuda_guard():
        mode = FakeTensorMode()
        with mode:
            x = torch.empty(4, 5, device="cuda")
    report = explain(fn, x, config=make_config(kernel_backend="aten"))
    (graph,) = report.graphs
    assert graph.planned and graph.device == "cuda:0"
    assert {n.target for n in graph.nodes if n.placement == "host"} == {"aten.arange.default", "aten.add.Tensor"}
    assert [s.placement for s in graph.segments][:1] == ["host"]


def test_fake_inputs_keep_fakes_and_place_reals():
    mode = FakeTensorMode()
    with fake_cuda_guard():
        with mode:
            already = torch.empty(2, device="cuda")
        faked = fake_inputs({"a": torch.ones(3, 2), "b": [already, 7]}, device="cuda", mode=mode)
    assert isinstance(faked["a"], FakeTensor) and faked["a"].device.type == "cuda" and faked["a"].shape == (3, 2)
    assert faked["b"][0] is already and faked["b"][1] == 7


def test_fake_cuda_guard_restores_the_process():
    from torch.fx.experimental import proxy_tensor

    lift, numel_limit = torch._C._only_lift_cpu_tensors(), proxy_tensor.CONSTANT_NUMEL_LIMIT
    mode = FakeTensorMode()
    with fake_cuda_guard(), mode:
        assert torch._C._only_lift_cpu_tensors() and proxy_tensor.CONSTANT_NUMEL_LIMIT == 0
        x = torch.empty(4, device="cuda")
        assert x[1:].shape == (3,)
    assert torch._C._only_lift_cpu_tensors() == lift and numel_limit == proxy_tensor.CONSTANT_NUMEL_LIMIT
    if torch.backends.cuda.is_built():
        return  # CUDA is compiled in: the registry was not touched, and its guard stays
    with mode, pytest.raises(RuntimeError, match="not linked with support for cuda"):
        x[1:]


def test_fake_cuda_guard_traces_the_same_graph_where_a_gpu_is_available(monkeypatch):
    """On the H100 the guard stood aside when a GPU was available: plans and the simulator traced real CUDA
    constants there, and CPU tests that read their graphs failed on the GPU machine (#18 item 5)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.tensor([4.0, 6.0], device=x.device).sum()

    def traced_targets() -> list[str]:
        with fake_cuda_guard(), FakeTensorMode(allow_non_fake_inputs=True):
            gm = make_fx(fn)(torch.empty(2, device="cuda"))
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    here = traced_targets()
    assert "aten._to_copy.default" in here  # the constant is made on the host and copied
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert traced_targets() == here


def test_planned_reduce_overhead_splits_static_and_per_call_host_work(no_kernels):
    def fn(x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ramp = torch.arange(x.shape[0], device=x.device) + 1  # from sizes: static per shape key
        index = (lengths + ramp.cpu()).clamp(max=x.shape[0] - 1)  # from a CPU input's data: per call
        return x[index.to(x.device)] * ramp.sum(), index

    config = make_config(kernel_backend="aten", mode="reduce-overhead")
    planning = {"device": "cuda", "config": config}
    report = plan(fn, torch.randn(4, 3), fake_inputs(torch.arange(4), device="cpu"), **planning)
    (graph,) = report.graphs
    assert graph.uncaptured_reason is None
    prologue = graph.host_prologue
    assert {"arange", "add", "sum_1"} <= set(prologue["static"])
    assert {"add_1", "clamp"} <= set(prologue["per_call"])
    assert len(prologue["transfers"]) == 2

    def scale(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return x * factor  # a 0-dim CPU input read by a kernel: copied to the device before every replay

    cpu_scalar = fake_inputs(torch.tensor(2.0), device="cpu")
    (graph,) = plan(scale, torch.randn(4), cpu_scalar, device="cuda", config=config).graphs
    assert graph.uncaptured_reason is None and len(graph.host_prologue["transfers"]) == 1

    def scale_by_count(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return x * lengths.sum().item()  # a per-call number baked into a kernel: refused

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        (graph,) = plan(scale_by_count, torch.randn(4), fake_inputs(torch.arange(3), device="cpu"), **planning).graphs
    reason = graph.uncaptured_reason
    assert reason is not None and "changes with every call" in reason and "inside the CUDA graph" in reason


def test_find_uncapturable_accepts_host_work_but_not_other_cpu_tensors():
    def fn(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return x + lengths.to(x.device)  # a CPU input copied in: a per-call transfer once placed

    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            x, lengths = torch.empty(3, device="cuda"), torch.zeros(3)
            placed, unplaced = make_fx(fn)(x, lengths), make_fx(fn)(x, lengths)
    run_pipeline(placed, context())
    assert find_uncapturable(placed) is None
    reason = find_uncapturable(unplaced)
    assert reason is not None and "CPU tensor inside a CUDA graph" in reason


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_numerics_equal_eager_on_cpu_where_the_pass_is_a_no_op(mode):
    compiled, backend = compile_with(hf_positions, dynamic=True, kernel_backend="aten", mode=mode)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for past in (3, 6):
            hidden, mask = torch.randn(2, 1, 4), torch.ones(2, past + 1)
            mask[0, 0] = 0
            got, want = compiled(hidden, mask), hf_positions(hidden, mask)
            assert_close(got[0], want[0])
            assert_close(got[1], want[1])
            assert got[2] == want[2]
    assert backend.reports
    for graph in backend.reports:
        placement = {p.name: p for p in graph.passes}["host_placement"]
        assert placement.changed == 0 and "runs on the CPU" in placement.details[0]
        assert {n.placement for n in graph.nodes} == {"device"}


def line_of(marker: str) -> str:
    """``file:line`` of the line of this file that ends with ``# marker``."""
    lines = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(i for i, text in enumerate(lines, 1) if text.endswith(f'# {marker}'))}"


def scaled_by_its_sum(x: torch.Tensor) -> torch.Tensor:
    n = x.sum().item()  # VALUE_LINE
    return x * n


class Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if (y > 0).any():  # BRANCH_LINE
            return y.relu()
        return y


def nonzero_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(x).float().sum() + x  # SHAPE_LINE


@pytest.mark.parametrize(
    ("fn", "marker", "reason", "op", "cause"),
    [
        (
            scaled_by_its_sum,
            "VALUE_LINE",
            "data-dependent branch or value",
            "_local_scalar_dense",
            DataDependentOutputException,
        ),
        (Gated(), "BRANCH_LINE", "data-dependent branch or value", "_local_scalar_dense", DataDependentOutputException),
        (nonzero_rows, "SHAPE_LINE", "data-dependent shape", "aten.nonzero", DynamicOutputShapeException),
    ],
    ids=["item", "branch in a module", "nonzero"],
)
def test_planning_code_that_needs_a_value_names_it_and_the_line(fn, marker, reason, op, cause):
    """Fake tensors have no values: a graph break before a Python branch on a tensor, ``.item()``, an op sized by
    values, run eagerly on the planned (fake) outputs, cannot go on. The error says so, where, and what to do."""
    with torch.no_grad(), pytest.raises(PlanError) as info:
        plan(fn, torch.randn(2, 4), device="cuda", config=make_config(kernel_backend="aten"))
    error, message = info.value, str(info.value)
    assert error.reason == reason and error.source == line_of(marker), message
    assert op in error.op and isinstance(error.__cause__, cause)
    assert f"{reason} at {line_of(marker)}" in message and "fake tensors" in message
    assert "airgraph.explain" in message and "torch.where" in message  # how to get around it


def test_explain_on_fake_inputs_names_a_data_dependent_branch_too():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    x = fake_inputs(torch.randn(2, 4), device="cuda", mode=mode)
    with torch.no_grad(), pytest.raises(PlanError, match="data-dependent branch or value") as info:
        explain(Gated(), x, config=make_config(kernel_backend="aten"))
    assert info.value.source == line_of("BRANCH_LINE")


def test_explain_on_real_inputs_takes_the_branch():
    """What the error advises: on real inputs the branch runs, and the graphs before and after it compile."""
    with torch.no_grad():
        report = explain(Gated(), torch.randn(2, 4), config=make_config(kernel_backend="aten"))
    assert report.dynamo_graphs == 2 and not any(g.planned for g in report.graphs)
