"""reduce-overhead: CUDA graph capture and replay. Each capture test runs twice: on the GPU (`cuda`: the GPU
machine only) and on the CPU with CUDA's streams and graphs simulated (runtime/simulated.py), race-checked."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from airgraph.lowering.capture_plan import find_uncapturable
from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs
from airgraph.runtime.capture import CaptureState
from tests.helpers import assert_close, compile_with, top_level_ops

# -- CPU: deciding what can be captured ----------------------------------------------------------------------


def fake(*specs: tuple[tuple[int, ...], str]) -> list[torch.Tensor]:
    """Fake tensors (CUDA ones too, on a machine without a GPU) from one fake mode."""
    with FakeTensorMode(shape_env=ShapeEnv()):
        return [torch.empty(shape, device=device) for shape, device in specs]


def test_find_uncapturable_names_the_op():
    def item(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()

    def host_tensor(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return x + lengths.to(x.device)

    x, lengths = fake(((3,), "cuda"), ((3,), "cpu"))
    reason = find_uncapturable(make_fx(item, tracing_mode="symbolic")(x))
    assert reason is not None and "aten._local_scalar_dense.default" in reason and "host sync" in reason
    reason = find_uncapturable(make_fx(host_tensor, tracing_mode="symbolic")(x, lengths))
    assert reason is not None and "CPU tensor inside a CUDA graph" in reason
    assert find_uncapturable(make_fx(torch.sin, tracing_mode="symbolic")(x)) is None


def test_find_uncapturable_names_data_dependent_shapes():
    gm = make_fx(torch.nonzero, tracing_mode="symbolic")(torch.randn(3))
    reason = find_uncapturable(gm)
    assert reason is not None and "aten.nonzero.default" in reason and "data-dependent" in reason


# -- CUDA, and the same logic on the CPU through the simulated runtime ---------------------------------------


def mlp(device: str = "cuda") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(device).eval()


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_capture_replays_and_matches_eager(kernel_backend, target):
    model = mlp(target.device)
    compiled, backend = target.compile(model, mode="reduce-overhead", kernel_backend=kernel_backend)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 16, device=target.device)
            assert_close(compiled(x), model(x))
    (report,) = backend.reports
    assert report.captured and report.capture_keys == 1 and report.uncaptured_reason is None


def test_one_graph_per_shape_key_and_kept_outputs_stay_correct(target):
    model = mlp(target.device)
    compiled, backend = target.compile(model, mode="reduce-overhead", kernel_backend="aten", dynamic=True)
    kept = []
    with torch.no_grad():
        for n in (2, 3, 2, 5, 3, 2):
            x = torch.randn(n, 16, device=target.device)
            kept.append((compiled(x), model(x)))
    for got, want in kept:  # every output from every step is still what that step computed
        assert_close(got, want)
    (report,) = backend.reports
    assert report.capture_keys == 3  # one CUDA graph per shape key (2, 3, 5), shared pool


def _add_to_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return b * 2


def test_inputs_viewing_a_bigger_storage_than_recorded_are_recorded_again(target):
    """Two inputs viewing one storage, one of them written: AOTAutograd hands the graph their storage as one
    synthetic base, whose size no Dynamo guard checks (the views' are the same). The key of each call tells the
    storages apart: a second recording, not a copy of 32 elements into the 16 of the first one's buffer."""
    compiled, backend = target.compile(_add_to_first, mode="reduce-overhead", kernel_backend="aten")
    with torch.no_grad():
        for n in (16, 16, 16, 32, 32, 16):
            base = torch.arange(n, dtype=torch.float32, device=target.device)
            expected = base.clone()
            want = _add_to_first(expected[0:4], expected[2:6])
            got = compiled(base[0:4], base[2:6])
            assert_close(got, want)
            assert_close(base, expected)  # the write reached the caller's storage, all of it as eager's
    assert [r.capture_keys for r in backend.reports if r.captured] == [2]


def _scaled(d: dict) -> torch.Tensor:
    return d["x"] * d["m"]


def test_a_dict_argument_tensor_given_another_layout_in_place_is_not_replayed_on_the_old_one(target):
    """torch 2.11 skips the tensor guards of tensors in a dict that did not change (its
    skip_tensor_guards_with_matching_dict_tags): an expanded mask set_ to a dense one reaches the same graph, whose
    key must see the new strides (its buffer holds one row of the old mask). Later torch recompiles."""
    compiled, backend = target.compile(_scaled, mode="reduce-overhead", kernel_backend="aten")
    torch.manual_seed(0)
    d = {"x": torch.randn(4, 8, device=target.device), "m": torch.randn(1, 8, device=target.device).expand(4, 8)}
    with torch.no_grad():
        for _ in range(3):
            assert_close(compiled(d), _scaled(d))
        d["m"].set_(torch.randn(4, 8, device=target.device))  # the same tensor object, now dense
        for _ in range(3):
            assert_close(compiled(d), _scaled(d))
    assert sum(r.capture_keys for r in backend.reports) == 2


def test_capture_limit_runs_new_keys_uncaptured_with_one_warning(caplog, target):
    model = mlp(target.device)
    compiled, backend = target.compile(
        model, mode="reduce-overhead", kernel_backend="aten", dynamic=True, **{"reduce_overhead.capture_limit": 2}
    )
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for n in (2, 3, 4, 5, 4):
            x = torch.randn(n, 16, device=target.device)
            assert_close(compiled(x), model(x))
    assert backend.reports[0].capture_keys == 2
    warnings = [r for r in caplog.records if "capture limit" in r.getMessage()]
    assert len(warnings) == 1


def test_a_moved_parameter_is_recorded_again_and_replayed(target, captures):
    """The old graph is dropped when the key records again; the pool it shared must stay usable (a graph pool
    whose use count dropped to zero refuses the next capture: the simulator models the count)."""
    model = mlp(target.device)
    compiled, backend = target.compile(model, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(4, 16, device=target.device)
    with torch.no_grad():
        compiled(x)  # warm-up, then recorded
        compiled(x)  # replayed
        model[0].weight.data = torch.randn_like(model[0].weight)  # new storage: the recorded address is stale
        for _ in range(3):  # recorded again, then replayed twice
            assert_close(compiled(x), model(x))
    (report,) = backend.reports
    assert report.uncaptured_reason is None, report.uncaptured_reason
    assert report.captured and report.capture_keys == 1 and report.recaptures == 1
    (entry,) = captures[0].keys.values()
    assert entry.state is CaptureState.CAPTURED and entry.replays == 3


def test_uncapturable_op_runs_uncaptured_with_one_log_line(caplog, target):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * (x > 0).sum().item()  # an int: a float .item() feeding float math is kept as a tensor

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled, backend = target.compile(fn, mode="reduce-overhead", kernel_backend="aten")
        with caplog.at_level(logging.INFO, logger="airgraph"):
            for _ in range(3):
                x = torch.randn(8, device=target.device)
                assert_close(compiled(x), fn(x))
    report = backend.reports[0]
    assert not report.captured and "_local_scalar_dense" in report.uncaptured_reason
    assert sum("_local_scalar_dense" in r.getMessage() for r in caplog.records) == 1


def test_mutated_user_input_is_copied_back(target, captures):
    def fn(state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        state.mul_(0.5).add_(x)
        return state.sum()

    compiled, backend = target.compile(fn, mode="reduce-overhead", kernel_backend="aten")
    state, ref_state = torch.ones(8, device=target.device), torch.ones(8, device=target.device)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, device=target.device)
            assert_close(compiled(state, x), fn(ref_state, x))
            assert_close(state, ref_state)
    (report,) = backend.reports
    assert report.captured and report.capture_keys == 1
    (entry,) = captures[0].keys.values()
    # the caller's state has a static buffer, copied back after each of the three replays
    assert entry.replays == 3 and entry.recorded.copy_back == (0,) and entry.recorded.static_args[0] is not state


def test_caller_stream_is_honoured(target, monkeypatch):
    model = mlp(target.device)
    compiled, _ = target.compile(model, mode="reduce-overhead", kernel_backend="aten")
    x = torch.randn(4, 16, device=target.device)
    side = target.new_stream()
    replayed_on = []
    graph_class = target.graph_class()
    replay = graph_class.replay

    def spy(graph, *args) -> None:
        replayed_on.append(target.current_stream())
        replay(graph, *args)

    monkeypatch.setattr(graph_class, "replay", spy)
    with torch.no_grad():
        compiled(x)
        compiled(x)
        side.wait_stream(target.current_stream())
        with target.use(side):
            out = compiled(x)
        target.current_stream().wait_stream(side)
    assert_close(out, model(x))
    assert replayed_on[-2:] == [target.current_stream(), side]  # the replay ran on the caller's current stream


def test_an_output_kept_while_the_next_call_runs_on_another_stream_is_moved_after_its_replay(target):
    """The next replay would overwrite a kept output, so the output is moved to a copy first; on the new caller's
    stream, which must wait for the last replay (on the old one) before that copy reads the output's memory."""
    model = mlp(target.device)
    compiled, _ = target.compile(model, mode="reduce-overhead", kernel_backend="aten")
    x, y = torch.randn(4, 16, device=target.device), torch.randn(4, 16, device=target.device)
    side = target.new_stream()
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        kept = compiled(x)  # a replay's output, handed out without a copy
        at = kept.data_ptr()
        with target.use(side):  # y was made before: nothing for side to wait for, as eager would see it
            out = compiled(y)
        target.current_stream().wait_stream(side)
    assert kept.data_ptr() != at  # moved to a copy of its own before the replay on side overwrote the memory
    assert_close(kept, model(x))
    assert_close(out, model(y))


def test_a_replay_copies_its_inputs_in_one_op_per_dtype(target):
    """Inputs go into their static buffers as CUDAGraph Trees copy theirs: one ``_foreach_copy_`` (one launch on a
    GPU) per dtype, not one copy per input; the host time of a decode step is mostly such launches."""

    def fn(a: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return (a + b).index_select(0, idx) * pos

    compiled, backend = target.compile(fn, mode="reduce-overhead", kernel_backend="aten")

    def inputs() -> list[torch.Tensor]:
        values = [torch.randn(4, 8), torch.randn(4, 8), torch.tensor([2, 0]), torch.tensor([3])]
        return [v.to(target.device) for v in values]

    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs())
        args = inputs()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = compiled(*args)
    assert backend.reports[0].captured
    assert_close(out, fn(*args))
    ops = top_level_ops(prof.events())
    assert ops.count("aten::_foreach_copy_") == 2, ops  # the two float inputs, the two int64 ones


def test_an_input_of_a_dtype_the_foreach_copy_refuses_is_copied_alone(target):
    """CUDA's ``_foreach_copy_`` has no kernel for uint16 (nor uint32/64, complex32, float8_e8m0fnu): such an input
    goes into its buffer with a copy of its own, beside the batch of the others (the simulator refuses as CUDA)."""

    def fn(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (a + b) * scale.to(torch.float32)

    compiled, backend = target.compile(fn, mode="reduce-overhead", kernel_backend="aten")

    def inputs() -> list[torch.Tensor]:
        scale = torch.randint(0, 9, (4, 8)).to(torch.uint16)
        return [v.to(target.device) for v in (torch.randn(4, 8), torch.randn(4, 8), scale)]

    with torch.no_grad():
        for _ in range(4):
            args = inputs()
            assert_close(compiled(*args), fn(*args))
    assert backend.reports[0].captured and backend.reports[0].uncaptured_reason is None


def _cache_step(token: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, token)
    return cache.sum(0) * 2


@pytest.mark.cuda
def test_a_static_cache_made_per_call_gets_its_memory_back_and_replays(captures):
    """HF ``generate`` on a GPU: a static cache per generate call, dropped when the call returns. The recording keeps
    no cache alive, so the caching allocator gives the next call's cache the same memory and the recording replays
    on it: recorded again at most once (the first two calls' caches may differ), where a recording that held its
    cache was recorded again every call."""
    compiled, backend = compile_with(_cache_step, mode="reduce-overhead", kernel_backend="aten")
    generates, tokens = 5, 6
    with torch.no_grad():
        for _ in range(generates):
            cache, expected = torch.zeros(tokens, 64, device="cuda"), torch.zeros(tokens, 64, device="cuda")
            torch._dynamo.mark_static_address(cache)
            for t in range(tokens):
                token, pos = torch.randn(1, 64, device="cuda"), torch.tensor([t], device="cuda")
                assert_close(compiled(token, cache, pos), _cache_step(token, expected, pos))
            assert_close(cache, expected)
            del cache, expected
    (report,) = backend.reports
    assert report.captured and report.recaptures <= 1, report.recaptures
    (entry,) = captures[0].keys.values()
    assert entry.replays == generates * tokens - 1 - report.recaptures  # a recording: one call, warmed up


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
def test_tiny_llama_decode_captured(kernel_backend, target):
    model = build_tiny_llama("tiny", seed=0, device=target.device)
    reference = build_tiny_llama("tiny", seed=0, device=target.device)
    cfg = model.config
    tokens, pos = prefill_inputs(cfg, 1, 8, device=target.device)
    with torch.no_grad():
        model(tokens, pos)
        reference(tokens, pos)
        compiled, backend = target.compile(model, mode="reduce-overhead", kernel_backend=kernel_backend, fullgraph=True)
        for step in range(6):
            tokens, pos = decode_inputs(cfg, 1, 8 + step, seed=step, device=target.device)
            assert_close(compiled(tokens, pos), reference(tokens, pos))
    for buf, ref in zip(model.buffers(), reference.buffers(), strict=True):
        assert_close(buf, ref)
    assert backend.reports[0].captured


def test_training_step_under_reduce_overhead(target):
    model = mlp(target.device).train()
    reference = mlp(target.device).train()
    compiled, backend = target.compile(model, mode="reduce-overhead", kernel_backend="aten")
    for _ in range(3):
        x = torch.randn(4, 16, device=target.device)
        loss = compiled(x).square().mean()
        ref = reference(x).square().mean()
        loss.backward()
        ref.backward()
        assert_close(loss, ref)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert_close(p.grad, q.grad)
            p.grad = None
            q.grad = None
    assert {r.kind for r in backend.reports} == {"forward", "backward"}
    assert all(r.captured for r in backend.reports)
