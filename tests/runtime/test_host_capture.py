"""Host placement on a real GPU: eager-equal results in both modes, host work around CUDA graph replays.

Every test here needs CUDA (skipped centrally without it): run ``pytest -m cuda`` on the GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from airgraph.lowering.capture_plan import NOTHING_TO_CAPTURE
from airgraph.models import build_tiny_llama, decode_inputs
from airgraph.runtime.device import CudaRuntime
from tests.helpers import assert_close, compile_with
from tests.passes.test_host_placement import fragment, scaled_fragment
from tests.test_plan import hf_positions

pytestmark = pytest.mark.cuda


def shape_positions(x: torch.Tensor) -> torch.Tensor:
    """Host work from sizes only (static per shape key): two positions, whatever the size."""
    n = x.shape[0]
    pos = torch.arange(n - 2, n, device=x.device) + 1
    return x[-2:] * pos[:, None] + pos.sum()


def gather_rows(x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Host work from a CPU input's data (per call): the rows to read change with every call."""
    index = (lengths + 1).clamp(max=x.shape[0] - 1)
    return x[index.to(x.device)] * 2, index


@pytest.fixture
def scalar_outputs():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        yield


def host_nodes(backend) -> list[str]:
    return [n.name for r in backend.reports for n in r.nodes if n.placement == "host"]


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_placed_fragment_matches_eager_and_its_syncs_are_gone(kernel_backend, scalar_outputs):
    compiled, backend = compile_with(fragment, kernel_backend=kernel_backend)
    for shape in ((4, 6), (4, 6), (3, 8)):
        x = torch.randn(shape, device="cuda")
        assert_close(compiled(x), fragment(x))
    first = backend.reports[0]
    assert first.host_placement["syncs_removed"] >= 2 and host_nodes(backend)
    assert first.segments[0].placement == "host"


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_hf_position_arithmetic_matches_eager_with_dynamic_shapes(kernel_backend, scalar_outputs):
    compiled, backend = compile_with(hf_positions, dynamic=True, kernel_backend=kernel_backend)
    for past in (5, 6, 9):
        hidden, mask = torch.randn(2, 1, 8, device="cuda"), torch.ones(2, past + 1, device="cuda")
        mask[1, :2] = 0
        got, want = compiled(hidden, mask), hf_positions(hidden, mask)
        assert_close(got[0], want[0])
        assert_close(got[1], want[1])
        assert got[2] == want[2]
    assert host_nodes(backend)


def test_host_to_device_copies_come_from_pinned_memory(monkeypatch):
    sources, real = [], CudaRuntime.pinned

    def record(self, t: torch.Tensor) -> torch.Tensor:
        sources.append(real(self, t))
        return sources[-1]

    monkeypatch.setattr(CudaRuntime, "pinned", record)  # looked up when the executor is built
    compiled, _ = compile_with(shape_positions, kernel_backend="aten")
    x = torch.randn(6, 3, device="cuda")
    assert_close(compiled(x), shape_positions(x))
    assert sources and all(t.is_pinned() for t in sources)


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_static_host_work_runs_at_capture_and_replays_as_constants(kernel_backend):
    compiled, backend = compile_with(
        shape_positions, dynamic=True, mode="reduce-overhead", kernel_backend=kernel_backend
    )
    with torch.no_grad():
        for n in (6, 6, 6, 9, 9, 6):
            x = torch.randn(n, 3, device="cuda")
            assert_close(compiled(x), shape_positions(x))
    (report,) = backend.reports
    assert report.captured and report.capture_keys == 2 and report.uncaptured_reason is None
    assert report.host_prologue["static"] and not report.host_prologue["per_call"]
    assert report.host_prologue["transfers"]


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_a_fragment_left_without_device_work_is_not_captured(kernel_backend, scalar_outputs, recwarn):
    """Placed, the seed fragment leaves the device a view: at 1cda07b its captures made CUDA warn "The CUDA Graph
    is empty" (four times in this file's run); it runs uncaptured, as eager would, with the reason."""
    compiled, backend = compile_with(fragment, mode="reduce-overhead", kernel_backend=kernel_backend)
    for shape in [(4, 6)] * 2 + [(3, 8)] * 2:
        x = torch.randn(shape, device="cuda")
        assert_close(compiled(x), fragment(x))
    assert not empty_graph_warnings(recwarn)
    assert backend.reports and all(r.uncaptured_reason == NOTHING_TO_CAPTURE for r in backend.reports)


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_per_call_host_work_runs_before_every_replay(kernel_backend):
    compiled, backend = compile_with(gather_rows, mode="reduce-overhead", kernel_backend=kernel_backend)
    x = torch.randn(8, 4, device="cuda")
    kept = []
    with torch.no_grad():
        for step in range(6):
            lengths = torch.tensor([step, 0, 7, step // 2])
            kept.append(((compiled(x, lengths)), gather_rows(x, lengths)))
    for (rows, index), (want_rows, want_index) in kept:  # every step's outputs are still that step's
        assert_close(rows, want_rows)
        assert torch.equal(index, want_index) and index.device.type == "cpu"
    (report,) = backend.reports
    assert report.captured and report.capture_keys == 1
    assert report.host_prologue["per_call"] and report.host_prologue["transfers"]


def test_a_cpu_index_input_is_copied_before_every_replay():
    def pick(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x[rows] * 2

    compiled, backend = compile_with(pick, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(16, 4, device="cuda")
    with torch.no_grad():
        for step in range(5):
            rows = torch.arange(12) % (step + 3)
            assert_close(compiled(x, rows), pick(x, rows))
    (report,) = backend.reports
    assert report.captured and report.capture_keys == 1 and report.host_prologue["transfers"]


def test_a_cpu_scalar_read_by_a_kernel_is_refilled_before_every_replay():
    def scale(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return x * factor  # as a kernel argument it would be frozen at recording

    compiled, backend = compile_with(scale, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(5, device="cuda")
    with torch.no_grad():
        for value in (1.0, 2.0, 3.0, 4.0):
            factor = torch.tensor(value)
            assert_close(compiled(x, factor), scale(x, factor))
    (report,) = backend.reports
    assert report.captured and report.host_prologue["transfers"]


def test_a_per_call_number_baked_into_a_kernel_still_runs_uncaptured(scalar_outputs):
    def scale(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return x * lengths.sum().item()

    compiled, backend = compile_with(scale, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(5, device="cuda")
    with torch.no_grad():
        for n in (1, 2, 3):
            lengths = torch.arange(n + 2)
            assert_close(compiled(x, lengths), scale(x, lengths))
    report = backend.reports[0]
    assert not report.captured and "changes with every call" in report.uncaptured_reason


def test_dynamic_tiny_llama_decode_is_captured_with_per_call_floats():
    model = build_tiny_llama("micro", seed=0, device="cuda")
    reference = build_tiny_llama("micro", seed=0, device="cuda")
    compiled, backend = compile_with(model, mode="reduce-overhead", kernel_backend="aten", dynamic=True)
    with torch.no_grad():
        for step in range(6):
            tokens, pos = decode_inputs(model.config, 1, 4 + step, seed=step, device="cuda")
            assert_close(compiled(tokens, pos), reference(tokens, pos))
    (report,) = backend.reports
    assert report.captured and report.host_prologue["per_call"]


def test_host_placement_off_gives_the_same_results(scalar_outputs):
    on, _ = compile_with(fragment, kernel_backend="aten")
    off, backend = compile_with(fragment, kernel_backend="aten", **{"passes.host_placement": False})
    x = torch.randn(4, 6, device="cuda")
    assert_close(on(x), off(x))
    assert not host_nodes(backend)


def empty_graph_warnings(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if "CUDA Graph is empty" in str(w.message)]


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_seed_fragment_is_captured_with_its_host_work_once_per_key(kernel_backend, scalar_outputs, recwarn):
    compiled, backend = compile_with(scaled_fragment, mode="reduce-overhead", kernel_backend=kernel_backend)
    for shape in [(4, 6)] * 3 + [(3, 8)] * 3:
        x = torch.randn(shape, device="cuda")
        assert_close(compiled(x), scaled_fragment(x))
    assert not empty_graph_warnings(recwarn)
    for report in backend.reports:
        assert report.captured and report.uncaptured_reason is None
        assert report.host_prologue["static"] and not report.host_prologue["per_call"]
