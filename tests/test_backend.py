"""End-to-end: airgraph-compiled models equal eager, on both kernel backends and both modes (CPU)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import Target, assert_close, compile_with

BACKENDS = ["aten", pytest.param("inductor", marks=pytest.mark.slow)]
MODES = ["max-autotune", "reduce-overhead"]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.head = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = self.conv2(x)
        return self.head(x.flatten(1))


def on_target(mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Target, list]:
    """Where a test of ``mode`` runs: reduce-overhead on the CUDA simulator (the CPU records no graphs), with every
    replay it performs counted; max-autotune on the CPU."""
    if mode != "reduce-overhead":
        return Target("cpu", None), []
    sim, replays = SimulatedCuda(), []
    replay = sim.replay

    def counted(graph, recorded, args) -> None:
        replays.append(graph)
        replay(graph, recorded, args)

    monkeypatch.setattr(sim, "replay", counted)
    return Target("cpu", sim), replays


def assert_ran(report, mode: str, replays: list, *, keys: int = 1) -> None:
    """The path ``mode`` takes ran: captured and replayed in reduce-overhead, neither in max-autotune."""
    captured = mode == "reduce-overhead"
    assert report.captured is captured and report.capture_keys == (keys if captured else 0)
    assert bool(replays) is captured and report.uncaptured_reason is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kernel_backend", BACKENDS)
def test_mlp_inference(kernel_backend, mode, monkeypatch):
    model = mlp().eval()
    target, replays = on_target(mode, monkeypatch)
    compiled, backend = target.compile(model, kernel_backend=kernel_backend, mode=mode)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for scale in (1, 2, 3):  # warm-up, record, replay
            assert_close(compiled(x * scale), model(x * scale))
    (report,) = backend.reports
    assert report.kind == "inference"
    assert [(s.backend, s.chosen_by) for s in report.segments] == [(kernel_backend, "config")]
    assert_ran(report, mode, replays)


@pytest.mark.parametrize("kernel_backend", BACKENDS)
def test_conv_net_inference(kernel_backend):
    model = ConvNet().eval()
    compiled, _ = compile_with(model, kernel_backend=kernel_backend)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert_close(compiled(x), model(x))


@pytest.mark.parametrize("kernel_backend", BACKENDS)
def test_training_three_steps_match_eager(kernel_backend):
    model = ConvNet() if kernel_backend == "aten" else mlp()
    reference = copy.deepcopy(model)
    compiled, backend = compile_with(model, kernel_backend=kernel_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(1)
    shape = (4, 3, 16, 16) if isinstance(model, ConvNet) else (4, 16)
    for _ in range(3):
        x = torch.randn(shape)
        loss = compiled(x).square().mean()
        ref_loss = reference(x).square().mean()
        assert_close(loss, ref_loss)
        loss.backward()
        ref_loss.backward()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert_close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_close(p, q)
    for name, buf in model.named_buffers():
        assert_close(buf, dict(reference.named_buffers())[name])
    assert sorted(r.kind for r in backend.reports) == ["backward", "forward"]


def test_graph_break_runs_every_piece_compiled():
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) * 2
        torch._dynamo.graph_break()
        return torch.cos(y + 1).sum(0)

    compiled, backend = compile_with(fn, kernel_backend="aten")
    x = torch.randn(5, 3)
    assert_close(compiled(x), fn(x))
    assert backend.dynamo_graphs == 2
    assert sorted({r.dynamo_graph for r in backend.reports}) == [0, 1]


@pytest.mark.parametrize("kernel_backend", BACKENDS)
def test_dynamic_shapes_compile_once(kernel_backend):
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x @ y).relu() + x.sum(dim=1, keepdim=True)

    compiled, backend = compile_with(fn, dynamic=True, kernel_backend=kernel_backend)
    for n in (3, 7, 12):
        x, y = torch.randn(n, 6), torch.randn(6, 6)
        assert_close(compiled(x, y), fn(x, y))
    assert len(backend.reports) == 1  # one symbolic graph served every size


def test_recompiles_on_new_static_shape():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x

    compiled, backend = compile_with(fn, dynamic=False, kernel_backend="aten")
    for n in (2, 3):
        x = torch.randn(n, 4)
        assert_close(compiled(x), fn(x))
    assert len(backend.reports) == 2


def test_input_mutation_stays_in_graph_and_matches_eager():
    def fn(cache: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.add_(x)
        return cache * 2

    compiled, backend = compile_with(fn, kernel_backend="aten")
    cache, ref_cache = torch.zeros(4), torch.zeros(4)
    x = torch.randn(4)
    with torch.no_grad():
        out = compiled(cache, x)
        ref = fn(ref_cache, x)
    assert_close(out, ref)
    assert_close(cache, ref_cache)
    assert any(n.target == "aten.copy_.default" for n in backend.reports[0].nodes)


# inductor + reduce-overhead on the CPU is the inductor max-autotune path (capture needs CUDA): see tests/runtime.
@pytest.mark.parametrize(
    ("kernel_backend", "mode"),
    [
        ("aten", "max-autotune"),
        ("aten", "reduce-overhead"),
        pytest.param("inductor", "max-autotune", marks=pytest.mark.slow),
    ],
)
def test_tiny_llama_prefill_and_decode(kernel_backend, mode, monkeypatch):
    model = build_tiny_llama("micro", seed=3)
    reference = build_tiny_llama("micro", seed=3)
    target, replays = on_target(mode, monkeypatch)
    compiled, backend = target.compile(model, kernel_backend=kernel_backend, mode=mode, fullgraph=True)
    cfg = model.config
    with torch.no_grad():
        tokens, pos = prefill_inputs(cfg, 1, 6, seed=1)
        assert_close(compiled(tokens, pos), reference(tokens, pos))
        for step in range(3):
            tokens, pos = decode_inputs(cfg, 1, 6 + step, seed=step)
            assert_close(compiled(tokens, pos), reference(tokens, pos))
    for buf, ref_buf in zip(model.buffers(), reference.buffers(), strict=True):
        assert_close(buf, ref_buf)  # the KV caches were updated in place, as eager does
    assert {s.chosen_by for r in backend.reports for s in r.segments if s.backend != "sync"} == {"config"}
    for report in backend.reports:  # prefill and decode: a graph each, decode's replayed
        assert_ran(report, mode, replays)


def test_backend_by_name(monkeypatch):
    """torch.compile(backend="airgraph") reaches AirgraphBackend through the torch_dynamo_backends entry point."""
    from airgraph.backend import AirgraphBackend

    compiled_graphs = []
    original = AirgraphBackend.compile_graph

    def counted(self, gm, example_inputs, **kwargs):
        compiled_graphs.append(kwargs["kind"])
        return original(self, gm, example_inputs, **kwargs)

    monkeypatch.setattr(AirgraphBackend, "compile_graph", counted)
    assert "airgraph" in torch._dynamo.list_backends()
    model = mlp().eval()
    compiled = torch.compile(model, backend="airgraph")
    x = torch.randn(2, 16)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    assert compiled_graphs == ["inference"]


def test_run_eagerly_uses_the_interpreter():
    model = mlp().eval()
    compiled, backend = compile_with(model, **{"debug.run_eagerly": True})
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    assert {s.backend for s in backend.reports[0].segments} == {"interpreter"}


def test_graph_dump_writes_one_file_per_pass(tmp_path):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x.view(x.shape) + 0) * 3

    compiled, backend = compile_with(fn, kernel_backend="aten", **{"debug.graph_dump": str(tmp_path)})
    x = torch.randn(4)
    assert_close(compiled(x), fn(x))
    (folder,) = tmp_path.iterdir()
    assert folder.name == f"graph_{backend.reports[0].id}_inference"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [
        "00_input.txt",
        "01_streams.txt",
        "02_concat_linear.txt",
        "03_host_placement.txt",
        "04_remove_noops.txt",
        "05_dead_code_elimination.txt",
        "06_fallback.txt",
    ]
    before = (folder / "00_input.txt").read_text()
    after = (folder / "04_remove_noops.txt").read_text()
    assert "torch.ops.aten.view.default" in before and "torch.ops.aten.view.default" not in after
    assert "torch.ops.aten.sigmoid.default" in after


def test_reduce_overhead_on_cpu_runs_uncaptured_and_says_so_once():
    model = mlp().eval()
    compiled, backend = compile_with(model, kernel_backend="aten", mode="reduce-overhead", dynamic=False)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (2, 3):  # two graphs (a recompile), one warning
            x = torch.randn(n, 16)
            assert_close(compiled(x), model(x))
    lines = [str(w.message) for w in caught if "uncaptured" in str(w.message)]
    assert len(lines) == 1 and "on cpu the executor runs uncaptured" in lines[0]
    assert len(backend.reports) == 2
    for report in backend.reports:
        assert not report.captured and "captures CUDA graphs" in report.uncaptured_reason


@pytest.mark.slow
def test_max_pool_with_indices_in_a_fresh_process():
    """Inductor's decomposition of max_pool2d (training: with indices) asks ``torch._inductor.lowering``, which
    nothing had imported in a fresh process before airgraph's AOTAutograd trace did."""
    import subprocess
    import sys

    script = """
import torch, airgraph
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(3, 2, 1))
x = torch.randn(2, 3, 9, 9)
compiled = torch.compile(model, backend=airgraph.get_backend())
compiled(x).sum().backward()
grad = model[0].weight.grad.clone()
model.zero_grad()
model(x).sum().backward()
torch.testing.assert_close(grad, model[0].weight.grad)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("kernel_backend", BACKENDS)
def test_random_ops_train_and_draw_what_eager_draws(kernel_backend):
    """Dropout in training: Inductor lowers random ops natively only after its own joint-graph pass, which airgraph's
    AOTAutograd does not run, so they fall back to ATen's, drawing exactly eager's numbers in eager's order."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 4)).train()
    reference = copy.deepcopy(model)
    compiled, _ = compile_with(model, kernel_backend=kernel_backend)
    x = torch.randn(8, 16)
    torch.manual_seed(7)
    got = compiled(x)
    got.sum().backward()
    torch.manual_seed(7)
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(got, expected)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    with torch.no_grad():  # dropout did drop: the output is not the one without it
        assert not torch.allclose(expected, reference.eval()(x))

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return torch.rand_like(t) + t

    compiled_noisy, _ = compile_with(noisy, kernel_backend=kernel_backend)
    torch.manual_seed(3)
    drawn = compiled_noisy(x)
    torch.manual_seed(3)
    torch.testing.assert_close(drawn, noisy(x))
