"""host_placement on CUDA-shaped ATen graphs, faked on a machine without a GPU (FakeTensorMode, device="cuda")."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.config import CompilerConfig
from airgraph.graph.fake_guard import fake_cuda_guard
from airgraph.lowering.capture_plan import find_uncapturable
from airgraph.passes import CompileContext, run_pipeline
from airgraph.passes.host_placement import host_placement
from airgraph.report.explain import plan
from airgraph.report.schema import GraphReport
from tests.helpers import make_config

aten, prims = torch.ops.aten, torch.ops.prims


def context(config: CompilerConfig | None = None, device: str = "cuda") -> CompileContext:
    config = config or make_config(kernel_backend="aten")
    report = GraphReport(id=0, mode=config.mode, kind="inference", device=device)
    return CompileContext(config=config, report=report, kind="inference", device=torch.device(device))


def trace_cuda(fn, *shapes: tuple[int, ...]) -> torch.fx.GraphModule:
    """``fn`` traced to ATen on fake CUDA inputs of these shapes (no GPU needed)."""
    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            inputs = [torch.empty(shape, device="cuda") for shape in shapes]
            return make_fx(fn)(*inputs)


def placements(gm: torch.fx.GraphModule) -> dict[str, str]:
    return {n.name: n.meta.get("placement", "device") for n in gm.graph.nodes if n.op == "call_function"}


def h2d_copies(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.meta.get("host_placement") == "h2d"]


def chain(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """arange(4) -> *2 (small: host) -> repeat to 16 (large: device) -> sum; a random op beside it."""
    small = torch.arange(4, device=x.device) * 2
    large = small.repeat(4)
    return x + large.sum(), torch.rand(2, device=x.device)


def fragment(x: torch.Tensor) -> torch.Tensor:
    """GE's Shape -> Gather -> Concat -> Reshape fragment (seed 003) as PyTorch code writes it: the shape as a
    tensor, gathered, concatenated with the remaining size and read back with .tolist() for the reshape. On the
    device: two blocking copies, three kernels and two device-to-host syncs; placed: host arithmetic."""
    shape = torch.tensor(x.shape, device=x.device)
    first = torch.gather(shape, 0, torch.tensor([0], device=x.device))
    new_shape = torch.cat([first, x.numel() // first])
    return x.reshape(new_shape.tolist())


def scaled_fragment(x: torch.Tensor) -> torch.Tensor:
    """The fragment, then device work on its result: placed, the fragment alone leaves the device a view (no
    work, so reduce-overhead does not capture it); this leaves it a kernel to capture."""
    return fragment(x) * 2


def test_seed_fragment_moves_to_host_and_its_syncs_go():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        report = plan(fragment, torch.randn(4, 6), device="cuda", config=make_config(kernel_backend="aten"))
    (graph,) = report.graphs
    by_target: dict[str, set[str]] = {}
    for node in graph.nodes:
        by_target.setdefault(node.target, set()).add(node.placement)
    for target in ("aten.gather.default", "aten.floor_divide.default", "aten.cat.default"):
        assert by_target[target] == {"host"}, target
    assert by_target["aten._local_scalar_dense.default"] == {"host"}
    assert by_target["aten.view.default"] == {"device"}
    assert graph.host_placement["syncs_removed"] == 4  # two .item() + two blocking host-to-device copies
    assert graph.host_placement["copies"] == []  # nothing computed on the host goes back to the device
    assert [s.placement for s in graph.segments] == ["host", "device"]  # host work hoisted into one segment
    details = {p.name: p for p in graph.passes}["host_placement"].details
    assert sum("sync removed" in line and "_local_scalar_dense" in line for line in details) == 2
    assert any(line.startswith("gather = aten.gather.default -> host") for line in details)


def test_chain_stops_at_the_first_large_node_and_random_ops_stay():
    gm = trace_cuda(chain, (16,))
    result = host_placement(gm, context())
    placed = placements(gm)
    assert placed["arange"] == placed["mul"] == "host"
    assert placed["repeat"] == placed["sum_1"] == placed["add"] == "device"
    assert placed["rand"] == "device"
    assert "repeat = aten.repeat.default stays on the device: output has 16 elements, not provably <= 8" in (
        result.details
    )
    assert any(line.startswith("rand = aten.rand.default stays on the device: random") for line in result.details)
    arange = next(n for n in gm.graph.nodes if n.name == "arange")
    assert arange.kwargs["device"] == torch.device("cpu") and arange.meta["val"].device.type == "cpu"


def test_a_host_value_read_by_several_device_ops_gets_exactly_one_copy():
    def fn(x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(3, device=x.device) + 1  # two host ops, read by two device ops
        return x[:, :3] * pos + x[:, 3:6] / pos

    gm = trace_cuda(fn, (2, 8))
    host_placement(gm, context())
    (copy,) = h2d_copies(gm)
    assert copy.target is aten._to_copy.default
    assert copy.kwargs == {"device": torch.device("cuda", 0), "non_blocking": True}
    assert copy.args[0].name == "add" and copy.args[0].meta["placement"] == "host"
    assert {u.target for u in copy.users} == {aten.mul.Tensor, aten.div.Tensor}
    assert copy.meta["val"].device.type == "cuda" and tuple(copy.meta["val"].shape) == (3,)
    assert not any(u.meta.get("placement") != "host" for u in copy.args[0].users if u is not copy)
    gm.graph.lint()

    inductor = trace_cuda(fn, (2, 8))  # Inductor's decompositions already ran: the copy is prims.device_put
    host_placement(inductor, context(make_config(kernel_backend="inductor")))
    (copy,) = h2d_copies(inductor)
    assert copy.target is prims.device_put.default and copy.args[1:] == (torch.device("cuda", 0), True)


def test_the_threshold_option_changes_the_outcome():
    placed = {}
    for limit in (2, 8):
        gm = trace_cuda(chain, (16,))
        host_placement(gm, context(make_config(kernel_backend="aten", **{"host_placement.max_elements": limit})))
        placed[limit] = placements(gm)
    assert placed[2]["arange"] == placed[2]["mul"] == "device"
    assert placed[8]["arange"] == placed[8]["mul"] == "host"
    gm = trace_cuda(chain, (16,))
    result = host_placement(gm, context(make_config(kernel_backend="aten", **{"host_placement.max_elements": 16})))
    assert placements(gm)["repeat"] == "host" and "sum_1 = aten.sum.default -> host" in " ".join(result.details)


def test_the_threshold_option_is_validated():
    config = CompilerConfig()
    assert config.host_placement.max_elements == 8 and config.passes.host_placement is True
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match=r"host_placement\.max_elements"):
            config.host_placement.max_elements = bad


def test_switching_the_pass_off_changes_nothing():
    on, off = trace_cuda(chain, (16,)), trace_cuda(chain, (16,))
    before = off.code
    run_pipeline(on, context())
    reports = run_pipeline(off, context(make_config(kernel_backend="aten", **{"passes.host_placement": False})))
    assert not {r.name: r for r in reports}["host_placement"].enabled
    assert "host" not in placements(off).values() and not h2d_copies(off)
    assert off.code == before  # remove_noops and DCE find nothing here either
    assert "host" in placements(on).values()


def test_on_a_cpu_graph_the_pass_changes_nothing_and_says_so():
    gm = make_fx(chain)(torch.randn(16))
    before = gm.code
    result = host_placement(gm, context(device="cpu"))
    assert result.changed == 0 and gm.code == before
    assert result.details == ["the graph runs on the CPU: every op is already on the host, nothing to place"]
    assert "host" not in placements(gm).values()


def test_a_small_op_whose_move_would_gain_nothing_stays():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x, torch.full((), 0.5, device=x.device))  # one fill kernel vs one copy

    gm = trace_cuda(fn, (8,))
    result = host_placement(gm, context())
    assert "host" not in placements(gm).values() and not h2d_copies(gm)
    assert any("saves nothing: 1 op(s), 1 copy(ies) back" in line for line in result.details)


def test_cpu_inputs_and_their_consumers_are_anchors_and_a_small_constant_joins_them():
    def fn(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        last = (lengths - 1).clamp(min=0)  # CPU already: anchors
        return x[last.to(x.device)]  # the copy to the device is small: it moves, one copy is inserted

    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            x, lengths = torch.empty(4, 3, device="cuda"), torch.empty(2, dtype=torch.long)
            gm = make_fx(fn)(x, lengths)
    result = host_placement(gm, context())
    placed = placements(gm)
    assert placed["sub"] == placed["clamp"] == placed["_to_copy"] == "host"
    assert gm.graph.find_nodes(op="placeholder")[1].meta["placement"] == "host"
    (copy,) = h2d_copies(gm)
    assert copy.kwargs["non_blocking"] is True
    assert any("blocking host-to-device copy replaced" in line for line in result.details)


def test_a_real_device_constant_is_copied_to_the_host_outside_the_compiles_fake_mode():
    """On a GPU, make_fx runs a small constant's ops for real: the graph holds a real CUDA tensor (a get_attr), and the
    pass runs under the compile's FakeTensorMode, which refuses real tensors (H100: "Please convert all Tensors to
    FakeTensors first ... aten.detach.default(tensor([4, 6], device='cuda:0'))"). Here a real CPU tensor stands for
    it, behind the same fake CUDA value, where the CPU-only build traced a CPU constant and a copy."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + (torch.arange(2, device=x.device) * torch.tensor([4, 6], device=x.device)).sum()

    gm = trace_cuda(fn, (4, 6))
    (to_device,) = gm.graph.find_nodes(op="call_function", target=aten._to_copy.default)
    gm._device_constant = torch.tensor([4, 6])  # the real constant a GPU trace holds
    with gm.graph.inserting_before(to_device):
        constant = gm.graph.create_node("get_attr", "_device_constant")  # (as make_fx does: FX's get_attr warns)
    constant.meta["val"] = to_device.meta["val"]  # on cuda:0
    to_device.replace_all_uses_with(constant)
    gm.graph.eliminate_dead_code()
    with FakeTensorMode(), warnings.catch_warnings():  # AOTAutograd calls the backend's compiler under its fake mode
        warnings.simplefilter("error")  # (the H100 run: FX warned of the host copy's get_attr, a plain attribute)
        host_placement(gm, context())
    assert placements(gm)["mul"] == "host"
    (host_copy,) = (n for n in gm.graph.find_nodes(op="get_attr") if n.target.startswith("_host_"))
    value = getattr(gm, host_copy.target)
    assert type(value) is torch.Tensor and value.device.type == "cpu" and value.tolist() == [4, 6]


def test_dynamic_sizes_must_be_provably_small():
    def fn(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        ramp = torch.arange(n, device=x.device) * 2  # n elements: not provably <= 8
        tail = torch.arange(n - 1, n + 1, device=x.device) * 3  # 2 elements whatever n is
        return x * ramp + tail.sum()

    report = plan(fn, torch.randn(5), device="cuda", dynamic=True, config=make_config(kernel_backend="aten"))
    (graph,) = report.graphs
    details = {p.name: p for p in graph.passes}["host_placement"].details
    assert any("stays on the device: output has s" in line and "not provably <= 8" in line for line in details)
    host = [n.target for n in graph.nodes if n.placement == "host"]
    assert "aten.arange.start" in host and "aten.sum.default" in host
    assert [n.target for n in graph.nodes if n.target == "aten.arange.default"] and all(
        n.placement == "device" for n in graph.nodes if n.target == "aten.arange.default"
    )


def test_a_cpu_index_read_by_an_indexing_op_on_the_device_gets_an_asynchronous_copy():
    def fn(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x[rows] * 2  # eager copies rows to the device inside the op, blocking

    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            gm = make_fx(fn)(torch.empty(10, 3, device="cuda"), torch.zeros(12, dtype=torch.long))
    result = host_placement(gm, context())
    (copy,) = h2d_copies(gm)
    (index,) = gm.graph.find_nodes(op="call_function", target=aten.index.Tensor)
    assert index.args[1] == [copy] and copy.args[0].op == "placeholder"
    assert copy.meta["val"].device.type == "cuda" and tuple(copy.meta["val"].shape) == (12,)
    assert any("reads the CPU index rows_1" in line for line in result.details)
    assert find_uncapturable(gm) is None  # a per-call transfer now, refilled before each replay


def test_node_reports_name_the_device_of_each_value():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        reports = {
            placed: plan(
                fragment,
                torch.randn(4, 6),
                device="cuda",
                config=make_config(kernel_backend="aten", **{"passes.host_placement": placed}),
            )
            for placed in (False, True)
        }
    devices = {placed: {n.target: n.device for n in r.graphs[0].nodes} for placed, r in reports.items()}
    assert devices[False]["aten.gather.default"] == "cuda:0"  # the shape tensor was copied to the GPU
    assert devices[False]["aten.lift_fresh_copy.default"] == "cpu"  # a CPU constant, placement "device" or not
    assert devices[True]["aten.gather.default"] == "cpu"  # moved to the host
    assert devices[True]["aten._local_scalar_dense.default"] is None  # a Python number, not a tensor
