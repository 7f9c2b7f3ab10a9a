"""The CUDA paths (side streams, waits, joins, lifetimes, capture and replay) run on the CPU through the
simulated runtime (airgraph/runtime/simulated.py), with its race checker, and compared with eager."""

from __future__ import annotations

import logging
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import airgraph.lowering.partition as partition_module
import airgraph.runtime.capture as capture_module
from airgraph import ops, scope
from airgraph.runtime import executor
from airgraph.runtime.capture import CaptureState
from airgraph.runtime.device import BORROWED
from airgraph.runtime.outputs import expanded_dims, memory_copier
from airgraph.runtime.simulated import SimulatedCuda, SimulatedCudaError, StreamRaceError
from airgraph.runtime.simulated_state import SimGraph
from tests.helpers import assert_close, compile_with
from tests.streams.models import SeedModel
from tests.streams.test_streams_property import build, step

MODES = ["max-autotune", "reduce-overhead"]


def run_checked(fn, sim: SimulatedCuda, calls: list[tuple], **options):
    """``fn`` compiled on the simulator, called on each argument tuple; the outputs, and the backend."""
    compiled, backend = compile_with(fn, runtime=sim, **options)
    outputs = []
    for args in calls:
        with sim.call():
            outputs.append(compiled(*args))
    sim.check()
    return outputs, backend


def seed_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(64, 64, generator=generator) for _ in range(4))


@pytest.mark.parametrize("kernel_backend", ["aten", "inductor"])
@pytest.mark.parametrize("mode", MODES)
def test_seed_model_runs_its_streams_race_free_and_equals_eager(kernel_backend, mode):
    model, sim = SeedModel(), SimulatedCuda()
    calls = [seed_inputs(i) for i in range(5)]
    got, backend = run_checked(model, sim, calls, mode=mode, kernel_backend=kernel_backend, fullgraph=True)
    for outputs, args in zip(got, calls, strict=True):
        for actual, expected in zip(outputs, model(*args), strict=True):
            assert_close(actual, expected)
    (report,) = backend.reports
    assert {s.stream for s in report.segments} == {None, "1", "2"}  # streams split the CPU graph here
    assert {"1 (priority 0)", "2 (priority 0)"} <= {s.name for s in sim.streams}
    assert report.captured is (mode == "reduce-overhead")


def test_kept_outputs_stay_correct_across_replays():
    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("side"):
            y = torch.sin(x) * 2
        return y + 1

    sim = SimulatedCuda()
    calls = [(torch.full((8,), float(i)),) for i in range(6)]
    got, backend = run_checked(fn, sim, calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured
    for out, (x,) in zip(got, calls, strict=True):  # every kept output still holds its own step's values
        assert_close(out, fn(x))


def test_a_write_after_a_side_stream_read_waits_for_it():
    """A buffer read on a side stream, then updated in place: the functionalized graph's copy_ into the
    buffer must wait for the side stream (write after read)."""

    def fn(buf: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with scope.stream_switch("reader"):
            total = buf.sum()
        buf.add_(1)
        return total, x * 2

    for mode in MODES:
        sim, buf, expected_buf = SimulatedCuda(), torch.zeros(16), torch.zeros(16)
        calls = [(buf, torch.full((4,), float(i))) for i in range(4)]
        got, _ = run_checked(fn, sim, calls, mode=mode, kernel_backend="aten")
        for (total, doubled), (_, x) in zip(got, calls, strict=True):
            want_total, want_doubled = fn(expected_buf, x)
            assert_close(total, want_total)
            assert_close(doubled, want_doubled)
        assert_close(buf, expected_buf)


def crossing(x: torch.Tensor) -> torch.Tensor:
    h = x * 3  # produced on the caller's stream, read on "side", dead after that read
    with scope.stream_switch("side"):
        y = h.sin()
    return y + x


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_checker_finds_a_missing_wait(monkeypatch):
    monkeypatch.setattr(executor._StreamCode, "_wait", lambda self, waiter, waited, since: None)
    sim = SimulatedCuda()
    compiled, _ = compile_with(crossing, runtime=sim, kernel_backend="aten")
    with sim.call():
        compiled(torch.randn(32))
    with pytest.raises(StreamRaceError, match=r"race: segment .* reads memory that segment"):
        sim.check()


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_checker_finds_an_unjoined_stream(monkeypatch):
    monkeypatch.setattr(executor._StreamCode, "join", lambda self, outputs, names: None)
    sim = SimulatedCuda()
    compiled, _ = compile_with(SeedModel(), runtime=sim, kernel_backend="aten", fullgraph=True)
    with sim.call():
        compiled(*seed_inputs(0))
    with pytest.raises(StreamRaceError, match="is not joined into"):
        sim.check()


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_checker_finds_an_early_free(monkeypatch):
    monkeypatch.setattr(executor._StreamCode, "cross_stream_values", lambda self, steps, placeholders: set())
    sim = SimulatedCuda()
    compiled, _ = compile_with(crossing, runtime=sim, kernel_backend="aten")
    with sim.call():
        compiled(torch.randn(32))
    with pytest.raises(StreamRaceError, match="early free"):
        sim.check()


def viewed_across_streams(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with scope.stream_switch("b"):
        made = torch.sin(x)
    view = made.t()  # on the caller's stream: its memory is still stream b's
    with scope.stream_switch("a"):
        read = torch.sin(view)
    return made, view, read


@pytest.mark.parametrize("mode", MODES)
def test_memory_read_on_a_side_stream_through_a_view_is_freed_after_the_join_without_a_report(mode):
    """Found by the random DAGs below: stream b's memory, viewed on the caller's stream and read on stream a, is
    record_stream-ed for the caller's stream only; the caller's stream joined stream a before the free, so the
    allocator's event on it orders the reuse after a's read (the simulator wanted a record for stream a too)."""
    sim = SimulatedCuda()
    calls = [(torch.randn(4, 4),) for _ in range(3)]
    compiled, _ = compile_with(viewed_across_streams, runtime=sim, mode=mode, kernel_backend="aten", fullgraph=True)
    for (x,) in calls:
        with sim.call():
            for got, want in zip(compiled(x), viewed_across_streams(x), strict=True):  # dropped in the call
                assert_close(got, want)
    sim.check()


def test_stream_priority_reaches_the_side_stream():
    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("urgent", stream_priority=-2):
            y = x.cos()
        return y * x

    sim = SimulatedCuda()
    run_checked(fn, sim, [(torch.randn(8),)], kernel_backend="aten")
    assert "urgent (priority -2)" in {s.name for s in sim.streams}


def test_an_output_viewing_an_input_keeps_its_offset_under_dynamic_shapes():
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[x.shape[0] // 2 :], x * 2

    sim = SimulatedCuda()
    calls = [(torch.arange(n, dtype=torch.float32),) for n in (6, 6, 6, 8, 8, 8)]
    got, backend = run_checked(fn, sim, calls, mode="reduce-overhead", kernel_backend="aten", dynamic=True)
    assert backend.reports[0].capture_keys >= 1
    for outputs, (x,) in zip(got, calls, strict=True):
        view, doubled = outputs
        assert_close(view, x[x.shape[0] // 2 :])
        assert view.data_ptr() == x[x.shape[0] // 2 :].data_ptr()  # a view of the caller's tensor
        assert_close(doubled, x * 2)


def test_outputs_sharing_storage_keep_offsets_and_sharing():
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, y[1:]

    sim = SimulatedCuda()
    calls = [(torch.arange(5, dtype=torch.float32) + i,) for i in range(5)]
    got, _ = run_checked(fn, sim, calls, mode="reduce-overhead", kernel_backend="aten", dynamic=True)
    for (y, tail), (x,) in zip(got, calls, strict=True):
        assert_close(y, x * 2)
        assert_close(tail, (x * 2)[1:])
        assert tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # one storage, as in eager
        assert tail.storage_offset() == y.storage_offset() + 1
    y, tail = got[0]
    y.add_(1)  # a write through one is seen through the other
    assert_close(tail, y[1:])


def test_empty_outputs_keep_their_dtype():
    """Every empty tensor has the null address: an empty output must not be taken for a view of an empty
    input (it would come back as that input)."""

    def fn(x: torch.Tensor, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, past.to(torch.int64) + 1

    sim = SimulatedCuda()
    calls = [(torch.randn(4), torch.empty(0, 4)) for _ in range(4)]
    got, backend = run_checked(fn, sim, calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured
    for (doubled, shifted), (x, _) in zip(got, calls, strict=True):
        assert_close(doubled, x * 2)
        assert shifted.dtype == torch.int64 and shifted.shape == (0, 4)


def test_an_output_made_on_a_side_stream_is_recorded_for_the_caller(monkeypatch):
    """The caller frees it later: its block goes back to the side stream's pool, so the allocator must
    also wait for the caller's stream (record_stream), whatever stream the next call comes from."""
    sim = SimulatedCuda()
    recorded: list[tuple[int, str]] = []
    monkeypatch.setattr(sim, "record_stream", lambda t, stream: recorded.append((t.data_ptr(), stream.name)))

    def fn(x: torch.Tensor) -> torch.Tensor:
        with scope.stream_switch("side"):
            return torch.sin(x * 3)

    (out,), _ = run_checked(fn, sim, [(torch.randn(8),)], kernel_backend="aten")
    assert (out.data_ptr(), "default") in recorded


def test_an_expanded_input_is_copied_into_its_buffer(monkeypatch):
    """GraphCapture hands the runtime the memory an expanded input really has (one row here), at the recording and
    at every replay (outputs.memory_copier; a real CUDA runtime copies what it is given)."""

    def fn(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(mask, -1.0) * 2

    sim = SimulatedCuda()
    copied: list[tuple[torch.Tensor, torch.Tensor]] = []
    runtime_copy = sim.copy_

    def copy(dst: torch.Tensor, src: torch.Tensor, **kwargs) -> None:
        copied.append((dst, src))
        runtime_copy(dst, src, **kwargs)

    monkeypatch.setattr(sim, "copy_", copy)
    calls = [(torch.randn(4, 8), (torch.arange(8) % (i + 2) == 0).expand(4, 8)) for i in range(5)]
    assert calls[0][1].stride() == (0, 1)
    got, backend = run_checked(fn, sim, calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured
    for out, args in zip(got, calls, strict=True):
        assert_close(out, fn(*args))
    assert not any(expanded_dims(dst) or expanded_dims(src) for dst, src in copied)
    rows = [dst for dst, _ in copied if dst.dtype == torch.bool]
    assert [(r.shape, r.stride()) for r in rows] == [((1, 8), (0, 1))] * len(calls)  # the recording, 4 replays


def test_the_simulator_copies_into_an_expanded_tensor_over_its_memory():
    """As a CUDA copy between two buffers of one layout would (torch's own copy_ refuses the overlapping target)."""
    sim = SimulatedCuda()
    src = (torch.arange(8) % 3 == 0).expand(4, 8)
    with sim.call():
        dst = sim.static_buffer(src)
        sim.copy_(dst, src)
    assert dst.stride() == (0, 1) and torch.equal(dst, src)
    with pytest.raises(RuntimeError, match="single memory location"):
        dst.copy_(src)


def test_a_memory_copier_copies_one_element_per_expanded_dim_and_is_the_copy_itself_without_any():
    copied: list[tuple[torch.Size, torch.Size]] = []

    def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        copied.append((dst.shape, src.shape))
        dst.copy_(src)

    dense = torch.zeros(4, 8)
    assert memory_copier(copy, dense) is copy
    dst, src = torch.zeros(1, 8, 1).expand(4, 8, 3), torch.arange(8.0).view(1, 8, 1).expand(4, 8, 3)
    memory_copier(copy, dst)(dst, src)
    assert copied == [(torch.Size([1, 8, 1]), torch.Size([1, 8, 1]))] and torch.equal(dst, src)


def test_device_index_reads_every_spelling():
    assert ops.device_index(torch.device("cuda", 1)) == 1
    assert ops.device_index("cuda:3") == 3
    assert ops.device_index(2) == 2
    assert ops.device_index(torch.device("cuda")) is None
    assert ops.device_index(None) is None


@settings(max_examples=20, deadline=None)
@given(st.lists(step, min_size=1, max_size=8), st.sampled_from(MODES))
def test_random_stream_dags_are_race_free_and_equal_eager(steps, mode):
    torch._dynamo.reset()
    program, sim = build(steps), SimulatedCuda()
    calls = [(torch.randn(4, 4) * 0.5, torch.randn(4, 4) * 0.5) for _ in range(3)]
    got, _ = run_checked(program, sim, calls, mode=mode, kernel_backend="aten", fullgraph=True)
    for outputs, args in zip(got, calls, strict=True):
        for actual, expected in zip(outputs, program(*args), strict=True):
            assert_close(actual, expected)


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_checker_finds_a_write_after_read_race(monkeypatch):
    # the analysis forgets in-place writes: the executor orders nothing for them (the simulator still sees the
    # write, by the version counter)
    monkeypatch.setattr(partition_module, "written_inputs", lambda nodes, inputs: frozenset())

    def fn(buf: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with scope.stream_switch("reader"):
            total = buf.sum()
        buf.add_(1)
        return total, x * 2  # nothing on the caller's stream reads total: only the write orders the two

    sim = SimulatedCuda()
    compiled, _ = compile_with(fn, runtime=sim, kernel_backend="aten")
    with sim.call():
        compiled(torch.zeros(16), torch.ones(1))
    with pytest.raises(StreamRaceError, match=r"race: segment .* writes memory that segment"):
        sim.check()


def alternating_replays(sim: SimulatedCuda) -> list[torch.Tensor]:
    """Replays from two caller streams in turn: nothing but the pool orders one call's work on the graph's
    static buffers after the previous call's."""
    model = torch.nn.Linear(8, 8)
    compiled, _ = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    first, second = sim.new_stream(name="caller 1"), sim.new_stream(name="caller 2")
    outputs = []
    with torch.no_grad():
        for i in range(6):
            with sim.use(first if i % 2 else second), sim.call():
                outputs.append((compiled(x := torch.randn(2, 8)), model(x)))
    return outputs


def test_replays_from_two_caller_streams_are_ordered_by_the_pool():
    sim = SimulatedCuda()
    for got, want in alternating_replays(sim):
        assert_close(got, want)
    sim.check()


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_checker_finds_replays_racing_on_the_static_buffers(monkeypatch):
    class Forgetful(dict):  # the pool forgets the last replay's stream: nothing orders the next one after it
        def __setitem__(self, key, value) -> None:
            pass

    monkeypatch.setattr(capture_module.MemoryPool, "__init__", _forgetful_pool_init(Forgetful))
    sim = SimulatedCuda()
    alternating_replays(sim)
    with pytest.raises(StreamRaceError, match=r"race: a copy on .* writes memory that"):
        sim.check()


def _forgetful_pool_init(table: type):
    original = capture_module.MemoryPool.__init__

    def init(self, runtime) -> None:
        original(self, runtime)
        self.last_stream = table()

    return init


def test_random_ops_draw_once_per_call_under_capture():
    """A recording executes nothing, so it draws no random numbers: the compiled steps draw what eager does."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)

    sim = SimulatedCuda()
    x = torch.zeros(4)
    torch.manual_seed(0)
    want = [fn(x) for _ in range(4)]
    compiled, backend = compile_with(fn, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    torch.manual_seed(0)
    got = [compiled(x) for _ in range(4)]  # the first call runs, then records; the others replay
    assert backend.reports[0].captured
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)


def test_a_data_dependent_op_keeps_the_graph_uncaptured_on_the_simulator_too():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0).sum() * x

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        calls = [(torch.randn(8),) for _ in range(3)]
        got, backend = run_checked(fn, SimulatedCuda(), calls, mode="reduce-overhead", kernel_backend="aten")
    for out, (x,) in zip(got, calls, strict=True):
        assert_close(out, fn(x))
    report = backend.reports[0]
    assert not report.captured and "aten.nonzero.default" in report.uncaptured_reason


def test_weights_saved_for_backward_are_used_in_place(captures):
    """The backward graph gets the weights as saved tensors (views of the parameters), not as parameters:
    recognised by their memory, they are read in place instead of copied into buffers every step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    sim = SimulatedCuda()
    compiled, _ = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")

    def train_steps(steps: int) -> None:  # compiled and reference: same inputs, gradients equal
        for _ in range(steps):
            x = torch.randn(5, 8)
            with sim.call():
                compiled(x).square().sum().backward()
            reference(x).square().sum().backward()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                assert_close(p.grad, q.grad)
                p.grad, q.grad = None, None
        sim.check()

    train_steps(4)
    (backward,) = [c for c in captures if c._report.kind == "backward"]
    (entry,) = backward.keys.values()
    recorded = entry.recorded
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    in_place = [i for i in recorded.static_checked if recorded.static_ptrs[i] in weights]  # by address: not kept alive
    assert in_place and all(recorded.static_args[i] is BORROWED for i in in_place)  # the saved weights
    assert not [i for i in recorded.copy_indices if recorded.static_args[i].untyped_storage().data_ptr() in weights]
    # A weight replaced by a new tensor (new memory): forward and backward see it moved and record again.
    new_weight = torch.randn(16, 8)
    model[0].weight = torch.nn.Parameter(new_weight.clone())
    reference[0].weight = torch.nn.Parameter(new_weight.clone())
    train_steps(3)


def test_an_expanded_output_is_copied_with_its_layout():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0, keepdim=True).expand(4, 8)

    calls = [(torch.randn(3, 8),) for _ in range(4)]
    got, backend = run_checked(fn, SimulatedCuda(), calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured
    for out, (x,) in zip(got, calls, strict=True):
        assert_close(out, fn(x))
        assert out.stride() == (0, 1)


class Positional(torch.nn.Module):
    """Reads a slice of a buffer at the step's offset, then (after a graph break) uses it: the second graph
    gets a view of the buffer at a new address every step. (The first graph does device work too: one of views
    only is not captured, and its buffer would not be known as a recorded graph's static input.)"""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(16, 8))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        row, x = self.table.narrow(0, step, 1), x + 1
        torch._dynamo.graph_break()
        return x * row


def test_a_view_of_a_buffer_at_a_moving_offset_is_recaptured_once_then_copied(captures):
    model, sim = Positional(), SimulatedCuda()
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten", dynamic=True)
    for position in range(8):
        x = torch.randn(8)
        with sim.call():
            assert_close(compiled(x, position), model(x, position))
    sim.check()
    assert [r.recaptures for r in backend.reports] == [0, 1]  # the graph reading the view: recorded again once
    reader = captures[1]
    (entry,) = reader.keys.values()
    # the input guessed static (a view of the buffer) and seen moving: copied from then on
    (view,) = reader._policy.moved_guesses
    assert entry.state is CaptureState.CAPTURED and view in entry.recorded.copy_indices and entry.replays == 6


def test_parameters_replaced_every_call_stop_the_recordings_with_one_warning(caplog):
    model, sim = torch.nn.Linear(4, 4), SimulatedCuda()
    compiled, backend = compile_with(model, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(10):
            model.weight.data = torch.randn(4, 4)  # new memory every call, the same Parameter object
            x = torch.randn(2, 4)
            with sim.call():
                assert_close(compiled(x), model(x))
    sim.check()
    report = backend.reports[0]
    assert report.recaptures == capture_module.MAX_RECAPTURES  # recorded again 3 times; the 4th move gives up
    assert "update them in place" in report.uncaptured_reason
    assert sum("moved" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records) == 1


def test_a_static_cache_made_per_generate_call_is_recorded_again_each_call_and_never_given_up(caplog, monkeypatch):
    """HF ``generate`` with a static cache: each call makes new cache tensors (marked static, updated in place by
    the step) and runs one decode step per new token. Each generate call records the step once more; the key is
    never given up (an H200 run of benchmarks/hf_generate.py ran uncaptured after the 4th generate call)."""

    def step(token, cache, pos):
        cache.index_copy_(0, pos, token)
        return cache.sum(0) * 2

    replays, replay = [0], SimGraph.replay

    def counted(graph, *args):
        replays[0] += 1
        return replay(graph, *args)

    monkeypatch.setattr(SimGraph, "replay", counted)
    sim = SimulatedCuda()
    compiled, backend = compile_with(step, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    generates, tokens = 6, 4  # short generate calls (4 new tokens): 3 replays per recording
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(generates):
            cache, expected = torch.zeros(tokens, 4), torch.zeros(tokens, 4)
            torch._dynamo.mark_static_address(cache)
            for t in range(tokens):
                token, pos = torch.randn(1, 4), torch.tensor([t])
                with sim.call():
                    got = compiled(token, cache, pos)
                assert_close(got, step(token, expected, pos))
            assert_close(cache, expected)
    sim.check()
    (report,) = backend.reports
    assert report.captured and report.uncaptured_reason is None and report.recaptures == generates - 1
    # each generate call's first token warms up and records (one call: recording executes nothing); the rest replay
    assert replays == [generates * (tokens - 1)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _cache_step(token: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, token)
    return cache.sum(0) * 2


def test_a_recording_keeps_no_static_input_alive():
    """A CUDA graph keeps addresses, not tensors, and so does a recording of the caller's tensors it uses in place:
    HF ``generate``'s static cache, made per call, is freed when the call returns, so the caching allocator can give
    its memory to the next call's cache (next test), whose steps then replay without a new recording."""
    sim = SimulatedCuda()
    compiled, backend = compile_with(_cache_step, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    dropped = []
    with torch.no_grad():
        for _ in range(3):  # generate calls
            cache = torch.zeros(4, 4)
            torch._dynamo.mark_static_address(cache)
            for t in range(4):
                with sim.call():
                    compiled(torch.randn(1, 4), cache, torch.tensor([t]))
            dropped.append(weakref.ref(cache))
            del cache
    sim.check()
    assert backend.reports[0].captured
    assert [ref() for ref in dropped] == [None, None, None]


def test_a_new_static_input_at_the_recorded_address_is_replayed_on(captures):
    """The next generate call's cache at the memory of the last one (a new tensor: the caching allocator gave the
    freed block again): the recording is replayed, on the new tensor, and nothing is recorded again."""
    sim = SimulatedCuda()
    compiled, backend = compile_with(_cache_step, runtime=sim, mode="reduce-overhead", kernel_backend="aten")
    memory = torch.empty(16).untyped_storage()  # the block each call's cache gets
    with torch.no_grad():
        for _ in range(3):
            cache, expected = torch.empty(0).set_(memory, 0, (4, 4), (4, 1)).zero_(), torch.zeros(4, 4)
            torch._dynamo.mark_static_address(cache)
            for t in range(4):
                token, pos = torch.randn(1, 4), torch.tensor([t])
                with sim.call():
                    got = compiled(token, cache, pos)
                assert_close(got, _cache_step(token, expected, pos))
            assert_close(cache, expected)
            del cache
    sim.check()
    (report,) = backend.reports
    assert report.captured and report.recaptures == 0
    (entry,) = captures[0].keys.values()
    assert entry.replays == 3 * 4 - 1  # every step but the first (its warm-up, then recorded)


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_a_simulated_replay_needs_its_arguments_alive_or_given():
    sim = SimulatedCuda()
    x = torch.ones(4)
    graph, (out,) = sim.capture(lambda a: [a[0] * 2], [x], pool=sim.pool_handle(), stream=sim.new_stream(), device=None)
    graph.replay()
    assert_close(out, x * 2)
    moved = torch.full((4,), 3.0)
    graph.replay([moved])  # another tensor than the one at the recorded address: the kernels would miss it
    with pytest.raises(StreamRaceError, match=r"arguments \[0\] at their recorded addresses"):
        sim.check()
    del x
    with pytest.raises(SimulatedCudaError, match=r"freed since the recording"):
        graph.replay()


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_a_simulated_replay_flags_an_argument_given_another_layout_in_place():
    """A CUDA graph's kernels read an argument with the sizes, strides and dtype of the recording: a tensor changed
    in place at the same address (``t_``) is read as the old layout, which the simulator reports."""
    sim = SimulatedCuda()
    w = torch.arange(16.0).reshape(4, 4)
    graph, _ = sim.capture(lambda a: [a[0] @ a[0]], [w], pool=sim.pool_handle(), stream=sim.new_stream(), device=None)
    graph.replay([w])
    sim.check()  # the same layout: nothing to report
    with torch.no_grad():
        w.t_()  # the same memory, transposed
    graph.replay([w])
    with pytest.raises(StreamRaceError, match=r"arguments \[0\] with the sizes, strides and dtype"):
        sim.check()


def shifted_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx - 8`` of ``x``: in range for the indices the tests pass (8 and up), out of range for zeros."""
    return torch.index_select(x, 0, idx - 8) * 2


def test_the_recording_runs_on_the_calls_inputs():
    """The simulator runs the function while recording: on the call's inputs (GraphCapture copies them into its
    static buffers, as CUDAGraph Trees record with them), an index computed from them is in range, as in the
    max_pool2d backward of #14 (zeros would give index -8 here, and the key would run uncaptured)."""
    x = torch.randn(4, 3)
    calls = [(x, torch.tensor([8 + (i + j) % 4 for j in range(6)])) for i in range(4)]
    got, backend = run_checked(shifted_rows, SimulatedCuda(), calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured, backend.reports[0].uncaptured_reason
    for out, args in zip(got, calls, strict=True):
        assert_close(out, shifted_rows(*args))


def test_the_recording_sees_the_inputs_before_the_warm_up_mutated_them():
    """The call that records runs the graph first (its results), which updates ``idx`` in place; the recording's
    buffers hold ``idx`` as the call got it, when the graph's indices are in range."""

    def fn(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = shifted_rows(x, idx)
        idx.sub_(8)  # after the warm-up, idx - 8 is out of range
        return out

    x = torch.randn(4, 3)
    calls = [(x, torch.tensor([8 + (i + j) % 4 for j in range(6)])) for i in range(4)]
    want = [(fn(x, idx.clone()), idx - 8) for _, idx in calls]
    got, backend = run_checked(fn, SimulatedCuda(), calls, mode="reduce-overhead", kernel_backend="aten")
    assert backend.reports[0].captured, backend.reports[0].uncaptured_reason
    for out, (_, idx), (want_out, want_idx) in zip(got, calls, want, strict=True):
        assert_close(out, want_out)
        assert_close(idx, want_idx)


def test_a_recordings_outputs_hold_no_results_until_a_replay():
    """A CUDA recording executes nothing: its outputs are unwritten memory until the first replay. The simulator
    runs the function while recording, then overwrites what it wrote there (NaN, every bit of an integer flipped),
    so that results taken from a recording are wrong here too; its arguments are put back."""

    def fn(args: list) -> list:
        x, idx = args
        return [x * 2, idx + 1, x[idx], idx > 0, x.add_(1)]

    sim = SimulatedCuda()
    x, idx = torch.randn(4), torch.tensor([0, 3, 1])
    want = fn([x.clone(), idx.clone()])
    before = x.clone()
    graph, outputs = sim.capture(fn, [x, idx], pool=sim.pool_handle(), stream=sim.new_stream(), device=None)
    assert outputs[0].isnan().all() and outputs[2].isnan().all()
    assert (outputs[1] == ~want[1]).all() and (outputs[3] == ~want[3]).all()
    assert_close(x, before)  # the mutated argument, and its alias among the outputs, as they were
    assert outputs[4] is x
    graph.replay()
    for got, expected in zip(outputs, want, strict=True):
        assert_close(got, expected)


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_a_recording_without_device_work_is_reported():
    """CUDA warns "The CUDA Graph is empty" for a recording of views only (the H100 did, four times, for the seed
    fragment that host placement left a reshape); the simulator reports it. Writing an argument, or making a new
    output, is work; a recording without outputs (the memory pool's keeper) is not looked at."""
    sim = SimulatedCuda()

    def recorded(fn, *args) -> list[str]:
        sim.capture(fn, list(args), pool=sim.pool_handle(), stream=sim.new_stream(), device=None)
        problems, sim.problems = sim.problems, []
        return problems

    x = torch.randn(4, 6)
    (problem,) = recorded(lambda args: [args[0].view(24), args[0].t()], x)
    assert "does no device work" in problem and "The CUDA Graph is empty" in problem
    assert recorded(lambda args: [args[0].view(24) * 2], x) == []
    assert recorded(lambda args: [args[0].add_(1).view(24)], x) == []
    assert recorded(lambda args: [args[0].mul_(1).view(24)], x) == []  # a kernel, whatever it wrote
    assert recorded(lambda args: [], x) == []


def test_attention_traces_as_the_math_kernel_on_any_machine():
    """On the H100, fake CUDA attention picked the GPU's memory-efficient kernel while the simulator traced, and
    the simulator's CPU run could not execute it (#18 item 5): the simulator traces as a machine without a GPU."""
    sim = SimulatedCuda()
    placed = sim.to_device(torch.ones(2))  # noqa: F841 (placed values are weakly held)
    backends = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled)
    before = [enabled() for enabled in backends]
    with sim.placement.tracing():
        assert not any(enabled() for enabled in backends) and torch.backends.cuda.math_sdp_enabled()
    assert [enabled() for enabled in backends] == before
