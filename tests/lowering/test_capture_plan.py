"""What reduce-overhead refuses to capture (lowering/capture_plan.py, capture_rules.py): graphs traced on fake CUDA
tensors, and simulated runs on tensors placed on the simulator's device (traced as CUDA, run on the CPU)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import airgraph.lowering.capture_rules as capture_rules
from airgraph.config import CompilerConfig
from airgraph.graph.fake_guard import fake_cuda_guard
from airgraph.lowering.capture_plan import NOTHING_TO_CAPTURE, find_uncapturable, launches, plan_capture
from airgraph.report.explain import plan
from airgraph.runtime.device import UNCACHED_ALLOCATOR
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import assert_close, compile_with, unsafe_double


def trace(fn, *specs: tuple[tuple[int, ...], str], dtype=torch.float32) -> torch.fx.GraphModule:
    """``fn`` traced to ATen on fake tensors of these (shape, device)s."""
    with fake_cuda_guard(), FakeTensorMode(allow_non_fake_inputs=True):
        return make_fx(fn)(*(torch.empty(shape, device=device, dtype=dtype) for shape, device in specs))


@pytest.fixture(scope="module")
def put_op():
    """An op that reads its input under an alias annotation and returns nothing (as symmetric memory's puts do):
    ``is_view`` holds for it, yet it does device work."""
    lib = torch.library.Library("airgraph_capture_plan_test", "FRAGMENT")
    lib.define("put(Tensor(a) x) -> ()")
    lib.impl("put", lambda x: None, "CompositeExplicitAutograd")
    torch.library.register_fake("airgraph_capture_plan_test::put", lambda x: None, lib=lib)
    yield torch.ops.airgraph_capture_plan_test.put
    lib._destroy()


def put_then_view(x: torch.Tensor) -> torch.Tensor:
    torch.ops.airgraph_capture_plan_test.put(x)
    return x.view(-1)


@pytest.mark.parametrize(
    ("fn", "work"),
    [
        (lambda x: x.view(-1)[1:].unsqueeze(0).expand(2, -1), False),  # views only
        (lambda x: x.view(x.shape[0] * x.shape[1]), False),  # shape arithmetic and a view
        (lambda x: torch.ops.aten._unsafe_view(x, [24]), False),  # a view its schema does not call one
        (lambda x: x.view(-1) * 2, True),
        (lambda x: torch._foreach_add_([x], 1), True),  # in place, returning nothing
        (lambda x: torch.empty_like(x), True),  # an allocation: counted as work (it errs towards capturing)
        (put_then_view, True),
    ],
)
def test_a_graph_launches_device_work_unless_it_only_views_and_sizes(fn, work, put_op):
    gm = trace(fn, ((4, 6), "cuda"))
    assert any(map(launches, gm.graph.nodes)) is work
    plan = plan_capture(gm, mode="reduce-overhead", device=torch.device("cuda"), can_capture=True)
    assert plan.capture is work and (plan.uncapturable == NOTHING_TO_CAPTURE) is not work


def test_an_op_reading_an_aliased_input_and_returning_nothing_is_work_though_is_view_holds(put_op):
    gm = trace(put_then_view, ((4, 6), "cuda"))
    (put,) = gm.graph.find_nodes(op="call_function", target=put_op.default)
    assert put_op.default.is_view and launches(put)


def test_a_graph_on_two_gpus_is_refused():
    gm = trace(lambda a, b: a + b.to("cuda:0"), ((4,), "cuda:0"), ((4,), "cuda:1"))
    assert find_uncapturable(gm) == "the graph touches cuda:0, cuda:1: one CUDA graph records the work of one device"


def _masked_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.index_put(x, [x > 0], torch.zeros((), device=x.device))


TORCH_RULE = {  # what Inductor's rule (or its fallback) refuses, and how the refusal names it
    "cudagraph_unsafe op": (lambda x: unsafe_double(x) + 1, "is tagged cudagraph_unsafe"),
    "boolean index_put": (_masked_zero, "indexes with a boolean mask"),
    "sparse output": (lambda x: x.to_sparse() * 2, "has a sparse output"),
    # in Inductor's list from torch 2.15 on; refused with every torch (capture_rules.FORBIDDEN_OPS)
    "cuSOLVER eigh": (lambda x: torch.linalg.eigh(x @ x.mT)[0], "aten._linalg_eigh.default is among the ops"),
}


@pytest.fixture(params=["inductor", "fallback"])
def torch_rule(request, monkeypatch):
    """Inductor's is_cudagraph_unsafe_fx_node, or the fallback used where it cannot be imported."""
    monkeypatch.setattr(capture_rules, "_rule", None)
    if request.param == "fallback":
        monkeypatch.setitem(sys.modules, "torch._inductor.utils", None)  # import fails
    rule, _ = capture_rules.torch_rule()
    assert (rule is capture_rules._torch_rule_fallback) is (request.param == "fallback")
    return request.param


@pytest.mark.parametrize("name", TORCH_RULE)
def test_torch_rule_and_its_fallback_refuse_the_same_ops(name, torch_rule):
    fn, says = TORCH_RULE[name]
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(3, 3))
    reason = find_uncapturable(gm, simulated=True)
    assert reason is not None and says in reason, reason


def test_control_flow_is_refused():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    reason = find_uncapturable(trace(fn, ((4,), "cuda")))
    assert reason is not None and "cond" in reason and "control flow" in reason


def run_scalar(fn, *, host_placement: bool):
    """``fn`` on the simulated device in reduce-overhead, seeded as eager, four calls; the report."""
    sim = SimulatedCuda()
    options = {"passes.host_placement": host_placement}
    compiled, backend = compile_with(fn, runtime=sim, mode="reduce-overhead", kernel_backend="aten", **options)
    x = sim.to_device(torch.randn(4))
    torch.manual_seed(0)
    want = [fn(x) for _ in range(4)]
    torch.manual_seed(0)
    for expected in want:
        with sim.call():
            assert_close(compiled(x), expected)
    sim.check()
    (report,) = backend.reports
    return report


def noisy_scale(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rand(())  # a CPU scalar, new every call, read by a device kernel


def test_a_cpu_scalar_that_changes_per_call_is_refused_inside_the_graph():
    report = run_scalar(noisy_scale, host_placement=False)
    assert not report.captured and "a CPU scalar that changes from call to call" in report.uncaptured_reason


def test_a_cpu_scalar_that_changes_per_call_is_copied_before_each_replay_with_host_placement():
    report = run_scalar(noisy_scale, host_placement=True)
    assert report.captured and report.host_prologue["per_call"] and report.host_prologue["transfers"]


def test_a_constant_cpu_scalar_is_captured_and_replays_right():
    report = run_scalar(lambda x: x * torch.tensor(2.5), host_placement=False)
    assert report.captured and report.uncaptured_reason is None
    assert [n.device for n in report.nodes if n.target == "aten.lift_fresh_copy.default"] == ["cpu"]


@pytest.mark.cuda
def test_cpu_scalars_on_cuda():
    def run(fn, host_placement: bool):
        options = {"passes.host_placement": host_placement}
        compiled, backend = compile_with(fn, mode="reduce-overhead", kernel_backend="aten", **options)
        x = torch.randn(4, device="cuda")
        torch.manual_seed(0)
        want = [fn(x) for _ in range(4)]
        torch.manual_seed(0)
        for expected in want:
            assert_close(compiled(x), expected)
        return backend.reports[0]

    assert "changes from call to call" in run(noisy_scale, host_placement=False).uncaptured_reason
    assert run(noisy_scale, host_placement=True).captured
    assert run(lambda x: x * torch.tensor(2.5), host_placement=False).captured


# -- the caching allocator: PyTorch's own variable turns it off, and a capture with it -------------------------


@pytest.mark.parametrize("value", ["1", "0"])
def test_no_caching_allocator_is_refused_when_a_cuda_graph_is_planned(monkeypatch, value):
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", value)
    config = CompilerConfig()
    config.mode, config.kernel_backend = "reduce-overhead", "aten"
    with torch.no_grad():
        (graph,) = plan(torch.nn.Linear(8, 8), torch.randn(2, 8), device="cuda", config=config).graphs
    assert graph.planned and not graph.captured
    if value == "1":
        assert graph.uncaptured_reason == UNCACHED_ALLOCATOR and "PYTORCH_NO_CUDA_MEMORY_CACHING" in UNCACHED_ALLOCATOR
    else:
        assert graph.uncaptured_reason is None


def test_no_caching_allocator_refuses_cuda_graphs_only_after_the_graph_s_own_reasons(monkeypatch):
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    ro = {"mode": "reduce-overhead", "can_capture": True}
    simulated = plan_capture(trace(lambda x: x * 2, ((4,), "cpu")), device=torch.device("cpu"), **ro)
    assert simulated.capture and simulated.uncapturable is None  # the simulator has no allocator to bypass
    refused = plan_capture(trace(lambda x: x * 2, ((4,), "cuda")), device=torch.device("cuda"), **ro)
    assert refused.capture and refused.uncapturable == UNCACHED_ALLOCATOR and refused.host is None
    two_gpus = trace(lambda a, b: a + b.to("cuda:0"), ((4,), "cuda:0"), ((4,), "cuda:1"))
    own = plan_capture(two_gpus, device=torch.device("cuda:0"), **ro).uncapturable
    assert own.startswith("the graph touches cuda:0, cuda:1")  # first, as the runtime puts the plan's reason first
