"""Frozen parameters (config.frozen_parameters, lowering/freeze.py): which parameters an inference graph holds as
constants, which it leaves as inputs (training graphs, parameters the graph updates, buffers, static kernels),
what a parameter changed after compiling does, and reduce-overhead's records with the weights frozen."""

from __future__ import annotations

import copy

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.compat import torchair as tng
from airgraph.models import build_tiny_llama, decode_inputs
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import compile_with, make_config

MM = ("aten.mm.default", "aten.addmm.default")


class Attention(torch.nn.Module):
    """q/k/v projections of one input (seeded)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.q, self.k, self.v = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.q(x) @ self.k(x).T, -1) @ self.v(x)


def _mms(report) -> int:
    return sum(1 for n in report.nodes if n.target in MM)


def test_a_training_graph_keeps_its_weights_as_inputs_with_one_warning():
    eager, model = Attention(), Attention()
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    x = torch.randn(4, 16)
    with pytest.warns(UserWarning, match=r"config\.frozen_parameters applies to inference graphs only") as seen:
        for _ in range(2):  # the second call reuses the graphs: still one warning
            compiled(x).sum().backward()
    assert len([w for w in seen if "frozen_parameters" in str(w.message)]) == 1
    eager(x).sum().backward()
    eager(x).sum().backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    forward = next(r for r in backend.reports if r.kind == "forward")
    assert forward.frozen_parameters == [] and forward.frozen_refused == "training graph"
    assert _mms(forward) == 5  # q, k, v, and the attention's two


class Scaled(torch.nn.Module):
    """q/k/v, and a parameter the forward updates in place (a running count)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.steps = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return self.attn(x) * self.steps


def test_a_parameter_the_graph_updates_is_not_frozen():
    eager, model = Scaled(), Scaled()
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    with torch.no_grad():
        for _ in range(3):  # each call reads the count the last one wrote
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), eager(x))
    assert model.steps.item() == 3
    (report,) = backend.reports
    assert len(report.frozen_parameters) == 3 and not any("steps" in name for name in report.frozen_parameters)
    assert _mms(report) == 3  # q/k/v -> 1, and the attention's two


def test_a_replaced_parameter_or_another_module_recompiles():
    """Dynamo's identity guards: another tensor at a frozen parameter's source compiles the graph again (a module
    of the same class would otherwise run with the first one's weights)."""
    first, second = Attention(0), Attention(1)
    backend = AirgraphBackend(make_config(kernel_backend="aten", frozen_parameters=True))
    x = torch.randn(4, 16)
    with torch.no_grad():
        for model in (first, second):
            torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
        assert len(backend.reports) == 2
        first.q.weight = torch.nn.Parameter(torch.randn(16, 16))  # as load_state_dict(assign=True) would
        torch.testing.assert_close(torch.compile(first, backend=backend)(x), first(x))
    assert len(backend.reports) == 3


def test_a_parameter_changed_in_place_keeps_its_compiled_value_until_a_reset():
    """What docs/modes.md says: the weights laid out anew keep the values they were compiled with; after
    torch.compiler.reset() the next call compiles with the new ones."""
    model = Attention()
    before = copy.deepcopy(model)
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        model.q.weight.mul_(2)  # in place, as load_state_dict copies
        torch.testing.assert_close(compiled(x), before(x))
        torch.compiler.reset()
        torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.reports) == 2


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 16)
        self.gate, self.up = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
        self.head = torch.nn.Linear(16, 32, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + (torch.nn.functional.silu(self.gate(h)) * self.up(h)) @ self.gate.weight
        return self.head(h)


def test_tied_embeddings_are_one_frozen_parameter():
    eager, model = Tied(), Tied()
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), eager(ids))
    (report,) = backend.reports
    assert len(report.frozen_parameters) == 3  # embed (= head), gate, up
    assert sum("embed" in name for name in report.frozen_parameters) == 1
    assert _mms(report) == 3  # gate/up -> 1, h @ gate.weight, head


def test_buffers_and_the_kv_cache_stay_inputs():
    eager, model = build_tiny_llama("micro"), build_tiny_llama("micro")
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True, fullgraph=True)
    with torch.no_grad():
        for pos in range(4):  # each step reads the cache the earlier ones wrote
            inputs = decode_inputs(model.config, 1, pos, seed=pos)
            torch.testing.assert_close(compiled(*inputs), eager(*inputs))
    (report,) = backend.reports
    params = dict(model.named_parameters())
    assert len(report.frozen_parameters) == len(params) == 12
    assert not any("_buffers" in name for name in report.frozen_parameters)


def test_static_kernels_refuse_with_a_warning(tmp_path):
    model = Attention()
    options = {"frozen_parameters": True, "static_kernels.enabled": True, "static_kernels.build": False}
    compiled, backend = compile_with(
        model, kernel_backend="aten", **options, **{"static_kernels.build_dir": str(tmp_path)}
    )
    x = torch.randn(4, 16)
    with torch.no_grad(), pytest.warns(UserWarning, match=r"frozen_parameters is ignored while config\.static_kernels"):
        torch.testing.assert_close(compiled(x), model(x))
    (report,) = backend.reports
    assert report.frozen_refused == "static kernels" and _mms(report) == 5


@pytest.mark.parametrize("input_copies", ["launch", "in-graph"])
def test_reduce_overhead_neither_copies_nor_checks_frozen_weights(captures, input_copies):
    """The decode step recorded on the simulated CUDA runtime, with and without the lever: the same inputs copied
    (or fed) before each replay (weights never were: they are used in place), and the frozen weights' addresses
    no longer checked before a replay (the graph holds them); every replay equals eager."""
    records = {}
    for frozen in (False, True):
        torch._dynamo.reset()
        eager, model = build_tiny_llama("micro"), build_tiny_llama("micro")
        sim = SimulatedCuda()
        config = make_config(
            mode="reduce-overhead",
            kernel_backend="aten",
            frozen_parameters=frozen,
            **{"reduce_overhead.input_copies": input_copies},
        )
        backend = AirgraphBackend(config, runtime=sim)
        step = torch.compile(model, backend=backend, fullgraph=True)
        with torch.no_grad():
            for pos in range(4):
                inputs = decode_inputs(model.config, 1, pos, seed=pos)
                with sim.call():
                    got = step(*inputs)
                torch.testing.assert_close(got, eager(*inputs))
        sim.check()
        (entry,) = captures[-1].keys.values()
        assert entry.replays == 3 and not entry.recaptures  # the first call records
        records[frozen] = (entry.recorded, backend.reports[0])
    (off, _), (on, report) = records[False], records[True]
    assert on.copy_indices == off.copy_indices and on.fed == off.fed  # the token and position only
    assert len(on.copy_indices) == 2
    frozen = len(report.frozen_parameters)
    assert frozen == 12 and len(on.static_checked) == len(off.static_checked) - frozen  # 2 caches, 3 buffers left


def test_torchairs_name_sets_the_option():
    config = tng.CompilerConfig()
    assert config.experimental_config.frozen_parameter is False
    config.experimental_config.frozen_parameter = True
    assert config.frozen_parameters is True and config.experimental_config.frozen_parameter is True
    with pytest.raises(ValueError, match="frozen_parameters"):
        config.experimental_config.frozen_parameter = "yes"
    model = Attention()
    compiled = torch.compile(model, backend=tng.get_npu_backend(compiler_config=config))
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_a_host_split_decode_step_replays_with_frozen_weights():
    """The decode step traced as CUDA on the simulator, with dynamic shapes: its per-call host values (RMSNorm's
    epsilon) are split off around the replay (lowering/host_split.py), and the device program holds the frozen and
    concatenated weights; every replay equals eager."""
    eager, model = build_tiny_llama("micro"), build_tiny_llama("micro")
    sim = SimulatedCuda()
    sim.to_device(model)
    backend = AirgraphBackend(
        make_config(mode="reduce-overhead", kernel_backend="aten", frozen_parameters=True), runtime=sim
    )
    step = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for pos in range(5):
            inputs = decode_inputs(model.config, 1, pos, seed=pos)
            want = eager(*inputs)
            with sim.call():
                got = step(*sim.to_device(*inputs))
            torch.testing.assert_close(got, want)
    sim.check()
    (report,) = backend.reports
    assert report.host_prologue["transfers"] and report.captured and report.capture_keys == 1
    assert len(report.frozen_parameters) == 12 and _mms(report) == 5


def test_the_fast_path_replays_a_frozen_decode_step():
    eager, model = build_tiny_llama("micro"), build_tiny_llama("micro")
    sim = SimulatedCuda()
    config = make_config(mode="reduce-overhead", kernel_backend="aten", frozen_parameters=True)
    step = airgraph.compile(model, config, fast_path=True, runtime=sim, fullgraph=True)
    with torch.no_grad():
        for pos in range(5):
            inputs = decode_inputs(model.config, 1, pos, seed=pos)
            with sim.call():
                torch.testing.assert_close(step(*inputs), eager(*inputs))
    sim.check()
    assert step.routes == 1 and not step.refused and step.fast_calls == 3  # past the compiling and learning calls
    (report,) = step.backend.reports
    assert len(report.frozen_parameters) == 12 and _mms(report) == 5


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_frozen_decode_step_replays_on_a_gpu(dtype):
    """Inductor's Triton kernels reading the concatenated weights and their column slices, recorded as a CUDA graph
    and replayed through the fast path, against eager."""
    eager = build_tiny_llama("tiny", device="cuda", dtype=dtype)
    model = build_tiny_llama("tiny", device="cuda", dtype=dtype)
    config = make_config(mode="reduce-overhead", frozen_parameters=True)
    step = airgraph.compile(model, config, fast_path=True, fullgraph=True)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    with torch.no_grad():
        for pos in range(6):
            inputs = decode_inputs(model.config, 1, pos, seed=pos, device="cuda")
            torch.testing.assert_close(step(*inputs), eager(*inputs), **tolerance)
    (report,) = step.backend.reports
    assert report.captured and len(report.frozen_parameters) == 21 and _mms(report) == 9
