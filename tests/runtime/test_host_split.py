"""reduce-overhead with host work, on the CPU machine: the split and the capture flow on fake CUDA tensors.

Values cannot be checked without a GPU (test_host_capture.py does that); these tests check the wiring: which
host work runs when, which buffers a replay refills, and how outputs are put together.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import airgraph.runtime.capture as capture_module
import airgraph.runtime.executor as executor
from airgraph.lowering.capture_plan import find_uncapturable, plan_host_work
from airgraph.lowering.host_split import split_host_work
from airgraph.lowering.partition import partition
from airgraph.passes import run_pipeline
from airgraph.report.fake import fake_cuda_guard
from airgraph.report.schema import GraphReport
from airgraph.runtime.capture import CaptureState, GraphCapture, MemoryPool
from airgraph.runtime.device import CUDA
from airgraph.runtime.host import HostSplit
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import graph_request, lower_all
from tests.passes.test_host_placement import context

DEVICE = torch.device("cuda")


def build_host_split(gm: torch.fx.GraphModule) -> HostSplit:
    """The host split the backend builds for ``gm`` (aten kernels), its device part run by CUDA's executor."""
    program = split_host_work(gm, graph_request("aten", device="cuda"))
    return HostSplit(program, executor.build_executor(program.device_gm, program.device_segments, DEVICE, runtime=CUDA))


def gather_rows(x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ramp = torch.arange(4, device=x.device) + 1  # static: no input data
    index = (lengths + ramp.cpu()).clamp(max=3)  # per call: a CPU input's data
    return x[index.to(x.device)] * ramp.sum(), index


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch):
    """gather_rows traced on fake CUDA inputs and placed; its fake mode and inputs."""
    monkeypatch.setattr(executor, "pinned", lambda t: t)  # fake CPU tensors cannot be pinned
    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            x, lengths = torch.empty(4, 3, device="cuda"), torch.zeros(4, dtype=torch.long)
            gm = make_fx(gather_rows)(x, lengths)
        run_pipeline(gm, context())
        yield gm, mode, [x, lengths]


def test_host_work_is_classified_static_or_per_call(traced):
    gm, _, _ = traced
    assert find_uncapturable(gm) is None
    plan = plan_host_work(gm)
    assert plan.problem is None
    assert [n.name for n in plan.per_call] == ["add_1", "clamp"]
    assert {"arange", "add", "sum_1"} <= {n.name for n in plan.static}
    assert len(plan.transfers) == 2 and not plan.feeds


def test_host_split_wires_host_values_around_the_device_part(traced):
    gm, mode, inputs = traced
    with fake_cuda_guard():
        split = build_host_split(gm)
        assert sorted((t.static, t.pin) for t in split.transfers) == [(False, True), (True, True)]
        assert [where for where, _ in split.program.recipe] == ["device", "host"]
        with mode:
            statics = split.run_static(list(inputs))
            values = [*inputs, *statics, *split.run_per_call(list(inputs), statics)]
            out = split.device_fn([*inputs, *split.boundary(values)])
            pieces = split.assemble(list(out), values, clone_static=True)
            whole = split(list(inputs))
    for got in (pieces, whole):
        assert got[0].device.type == "cuda" and got[0].shape == (4, 3)
        assert got[1].device.type == "cpu" and got[1].shape == (4,)


class _Graph:
    replays = 0

    def replay(self) -> None:
        _Graph.replays += 1


class _Recorder(SimulatedCuda):
    """The simulator, except that a recording runs nothing and a replay only counts (the device part is fake)."""

    def capture(self, fn, args, *, pool, stream, device):
        return _Graph(), fn(list(args))


def test_capture_runs_host_work_once_per_call_and_static_work_once_per_key(traced, monkeypatch):
    gm, mode, inputs = traced
    monkeypatch.setattr(capture_module, "_storage", id)  # fake tensors have no storage addresses
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda self: id(self))
    with fake_cuda_guard():
        split = build_host_split(gm)
        calls = {"static": 0, "per_call": 0}
        for name in calls:
            fn = getattr(split.program, f"{name}_fn")

            def counted(args: list, fn=fn, name=name) -> object:
                calls[name] += 1
                return fn(args)

            setattr(split.program, f"{name}_fn", counted)
        report = GraphReport(id=0, mode="reduce-overhead", kind="inference", device="cuda")
        capture = GraphCapture(
            split,
            host_split=split,
            input_views={},
            device=torch.device("cuda"),
            static_indices=[],
            mutated_indices=[],
            pool=MemoryPool(_Recorder()),
            capture_limit=4,
            warmup_iters=1,
            report=report,
            uncapturable=find_uncapturable(gm),
        )
        _Graph.replays = 0
        with mode:
            outputs = [capture(list(inputs)) for _ in range(4)]
    (entry,) = capture._keys.values()
    assert entry.state is CaptureState.CAPTURED and report.captured and report.capture_keys == 1
    assert _Graph.replays == 3
    # the warm-up call runs everything once and is recorded from (its host values reused: random or mutating
    # per-call work must run once a call); each replay runs the per-call work only
    assert calls == {"static": 1, "per_call": 4}
    assert [t.static for _, t in entry.refill] == [False]  # only the per-call transfer is refilled
    assert entry.copy_indices == (0,)  # the CUDA input gets a static buffer, the CPU input does not
    for out in outputs:
        assert out[0].device.type == "cuda" and out[1].device.type == "cpu"


def test_a_host_value_of_data_dependent_shape_keeps_the_graph_uncaptured():
    """nonzero of a CPU input runs on the host; its device copy has a size only the data decides, which one
    recorded CUDA graph buffer cannot hold: refused, naming the copy."""

    def fn(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        idx = torch.nonzero(lengths > 0).flatten()
        return x.index_select(0, idx.to(x.device)) * 2

    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        with mode:
            gm = make_fx(fn)(torch.empty(4, 3, device="cuda"), torch.zeros(4, dtype=torch.long))
        run_pipeline(gm, context())
    assert gm.graph.find_nodes(op="call_function", target=torch.ops.aten.nonzero.default)[0].meta["placement"] == "host"
    reason = find_uncapturable(gm)
    assert reason is not None and "copies view to the device with a data-dependent shape" in reason


def test_the_caller_gets_host_values_themselves_not_the_buffers_an_async_copy_reads(traced, monkeypatch):
    """max-autotune: `index` is both a graph output and the source of an asynchronous copy to the device.
    The copy reads a pinned copy of it; the caller gets the value itself and may write to it at once."""
    gm, mode, inputs = traced
    handed_to_copies: list[torch.Tensor] = []

    def pinned(t: torch.Tensor) -> torch.Tensor:
        copy = t.clone()  # stands for pin_memory() (fake CPU tensors cannot be pinned)
        handed_to_copies.append(copy)
        return copy

    monkeypatch.setattr(executor, "pinned", pinned)
    with fake_cuda_guard():
        segments = partition(gm, streams=True)
        lower_all(segments, "aten", device="cuda")
        run = executor.build_executor(gm, segments, DEVICE, runtime=CUDA)
        with mode:
            rows, index = run(list(inputs))
    assert handed_to_copies and rows.device.type == "cuda" and index.device.type == "cpu"
    assert all(index is not copy for copy in handed_to_copies)


def test_an_input_copied_to_the_device_and_updated_in_place_is_the_caller_s(monkeypatch):
    """`idx` (a CPU input) is read by a device op through a copy and then updated in place (`copy_` into the
    input, the functionalized graph's epilogue, on the device side): the update must reach the caller's
    tensor, not a pinned copy made for the transfer."""

    def fn(x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor]:
        out = x[idx] * 2
        idx.add_(1)
        return (out,)  # a tuple, as AOTAutograd's graphs return

    sources: list[str] = []
    real_compile = executor.compile_function

    def compile_function(source: str, *args):
        sources.append(source)
        return real_compile(source, *args)

    monkeypatch.setattr(executor, "compile_function", compile_function)
    monkeypatch.setattr(executor, "pinned_copy", lambda t: t.clone())  # fake CPU tensors cannot be pinned
    with fake_cuda_guard():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            functional = torch.func.functionalize(fn, remove="mutations_and_views")
            gm = make_fx(functional)(torch.empty(10, 3, device="cuda"), torch.zeros(4, dtype=torch.long))
        run_pipeline(gm, context())
        segments = partition(gm, streams=True)
        lower_all(segments, "aten", device="cuda")
        executor.build_executor(gm, segments, DEVICE, runtime=CUDA)
    (source,) = sources
    idx = names_in(source, "args")[1]
    writer = next(line for line in source.splitlines() if "segment" in line and f"{idx}]" in line.replace(" ", ""))
    assert f"{idx}_pinned" not in writer  # the segment writing idx gets the caller's tensor
    # and no pinned copy is made for nothing: the only device reader writes it too, so its copy to the device
    # reads the caller's pageable tensor (staged before the call returns) ahead of the update
    assert f"{idx}_pinned" not in source


def names_in(source: str, unpacked: str) -> list[str]:
    """The names a generated function unpacks ``unpacked`` into (``v0, v1, = args``)."""
    line = next(line for line in source.splitlines() if line.strip().endswith(f"= {unpacked}"))
    return [name.strip() for name in line.split("=")[0].split(",") if name.strip()]
