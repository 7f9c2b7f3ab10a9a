"""The device runtimes share one Protocol; time() is how a tuner measures a candidate on each."""

from __future__ import annotations

import copy
import pickle
import time

import pytest
import torch

from airgraph.runtime.device import BORROWED, CPU, CUDA, FOREACH_COPY_DTYPES, DeviceRuntime, runtime_for
from airgraph.runtime.simulated import SimulatedCuda


def test_every_runtime_implements_the_protocol():
    for runtime in (CUDA, CPU, SimulatedCuda()):
        assert isinstance(runtime, DeviceRuntime)
    assert runtime_for(torch.device("cpu")) is CPU and runtime_for(torch.device("cuda")) is CUDA
    sim = SimulatedCuda()
    assert runtime_for(torch.device("cpu"), sim) is sim
    assert not CPU.has_streams and not CPU.can_capture and sim.has_streams and sim.can_capture


def test_cpu_time_is_the_median_wall_time_of_a_call():
    def sleepy(args: list) -> None:
        time.sleep(args[0])

    assert 0.009 < CPU.time(sleepy, [0.01], iters=3) < 0.05
    with pytest.raises(RuntimeError, match="records no graphs"):
        CPU.capture(sleepy, [0.0], pool=None, stream=None, device=torch.device("cpu"))


def test_the_simulators_time_is_a_deterministic_cost_model():
    sim = SimulatedCuda()
    x = torch.randn(1024)

    def one(args: list) -> torch.Tensor:
        return args[0] + 1

    def three(args: list) -> torch.Tensor:
        return ((args[0] + 1) * 2).relu()

    def view_only(args: list) -> torch.Tensor:
        return args[0].view(32, 32)

    t1, t3 = sim.time(one, [x], iters=5), sim.time(three, [x], iters=5)
    assert t1 == sim.time(one, [x], iters=1)  # not a clock
    per_op = sim.LAUNCH_SECONDS + 2 * x.numel() * 4 / sim.BYTES_PER_SECOND  # one launch, 4 KiB read and written
    assert t1 == pytest.approx(per_op) and t3 == pytest.approx(3 * per_op)
    assert sim.time(view_only, [x], iters=1) == 0.0  # views launch nothing


def test_borrowed_is_one_object_through_copies():
    assert copy.deepcopy(BORROWED) is BORROWED and pickle.loads(pickle.dumps(BORROWED)) is BORROWED
    assert copy.deepcopy([BORROWED, 1])[0] is BORROWED


def test_the_simulator_refuses_a_foreach_copy_cuda_has_no_kernel_for():
    sim = SimulatedCuda()
    dst, src = torch.zeros(4, dtype=torch.uint16), torch.ones(4, dtype=torch.uint16)
    with pytest.raises(NotImplementedError, match=r"foreach_tensor_copy.*uint16"):
        sim.copy_many([dst], [src])
    assert {torch.float32, torch.bfloat16, torch.int64, torch.bool} <= FOREACH_COPY_DTYPES
    assert torch.uint16 not in FOREACH_COPY_DTYPES
    floats, ints = [torch.zeros(2), torch.zeros(3)], [torch.zeros(2, dtype=torch.int64)]
    sim.copy_many(floats + ints, [torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.int64)])
    assert all(bool((t == 1).all()) for t in floats + ints)
