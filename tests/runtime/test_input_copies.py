"""In-graph input copies (``reduce_overhead.input_copies = "in-graph"``; runtime/feeding.py): a recorded graph fills
its own input buffers from the tensors each call points it at, instead of a copy launched before each replay. On the
CUDA simulator (its graphs keep fed sources by address, and a replay copies from them first), and on a GPU
(`cuda`)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.runtime import feeding
from airgraph.runtime.device import CudaRuntime
from airgraph.runtime.simulated import SimulatedCuda, SimulatedCudaError
from tests.helpers import Step, assert_close, make_config

IN_GRAPH = {"reduce_overhead.input_copies": "in-graph"}


@pytest.fixture
def counted(monkeypatch):
    """The simulator's feeds (sources per call) and copy launches (tensors per call), counted."""
    feeds, launches = [], []
    feed, copy_many = SimulatedCuda.feed, SimulatedCuda.copy_many
    monkeypatch.setattr(SimulatedCuda, "feed", lambda self, g, s: (feeds.append(len(s)), feed(self, g, s))[1])
    monkeypatch.setattr(
        SimulatedCuda, "copy_many", lambda self, d, s: (launches.append(len(s)), copy_many(self, d, s))[1]
    )
    return feeds, launches


@pytest.fixture
def cuda_launches(monkeypatch):
    """On a GPU with cuda.bindings (else the test is skipped): CUDA's copy launches (tensors per call), counted."""
    if feeding.bindings() is None:
        pytest.skip("cuda.bindings is not installed")
    launches = []
    copy_many = CudaRuntime().copy_many  # (torch's foreach copy itself)
    monkeypatch.setattr(
        CudaRuntime, "copy_many", staticmethod(lambda d, s: (launches.append(len(s)), copy_many(d, s))[1])
    )
    return launches


@pytest.mark.parametrize("fast_path", [False, True], ids=["through torch.compile", "fast path"])
def test_a_graph_fills_its_input_buffers_itself_from_each_calls_tensors(counted, captures, fast_path):
    """New input tensors every call (as a decode loop's): each replay is fed that call's tensor, no copy is launched,
    and the results are eager's."""
    feeds, launches = counted
    model, sim = Step().eval(), SimulatedCuda()
    step = airgraph.compile(
        model, make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH), fast_path=fast_path, runtime=sim
    )
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(4, 16)
            assert_close(step(x), model(x))
    assert feeds == [1] * 5 and not launches  # the first call records: five replays
    assert not sim.problems
    (capture,) = captures
    (entry,) = capture.keys.values()
    recorded = entry.recorded
    (position,) = recorded.fed  # the input (after the parameters)
    assert not recorded.batches and recorded.graph.fed[0][0] == position


def test_by_default_inputs_are_copied_by_a_launch(counted):
    feeds, launches = counted
    model = Step().eval()
    step = airgraph.compile(model, make_config(mode="reduce-overhead", kernel_backend="aten"), runtime=SimulatedCuda())
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16)
            assert_close(step(x), model(x))
    assert not feeds and launches == [1, 1]


def test_an_input_not_laid_out_as_its_buffer_is_copied_by_a_launch_beside_fed_ones(counted):
    """A transposed input (dense, but not in the order a copy of its bytes needs) is copied by a launch beside the
    contiguous one, which is fed."""
    feeds, launches = counted

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b).relu()

    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    compiled = torch.compile(fn, backend=AirgraphBackend(config, runtime=SimulatedCuda()))
    for _ in range(4):
        a, b = torch.randn(4, 8), torch.randn(6, 8).t()
        assert_close(compiled(a, b), fn(a, b))
    assert feeds == [1] * 3 and launches == [1] * 3


def test_a_decode_loop_with_new_token_tensors_makes_eager_tokens(counted):
    """Tiny LLaMA's decode loop as users write it (the next token a new tensor each step, the position too), on the
    fast path with in-graph input copies: eager's tokens, both inputs fed, nothing launched to copy them."""
    from airgraph.models import build_tiny_llama, prefill_inputs

    feeds, launches = counted
    model, reference = build_tiny_llama("tiny", seed=0), build_tiny_llama("tiny", seed=0)
    prompt, prompt_pos = prefill_inputs(model.config, 1, 8)
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    step = airgraph.compile(model, config, fast_path=True, runtime=SimulatedCuda(), fullgraph=True)
    with torch.no_grad():
        token = model(prompt, prompt_pos)[:, -1:].argmax(-1)
        made = []
        for i in range(8):
            token = step(token, torch.tensor([8 + i])).argmax(-1)
            made.append(int(token))
        expected, token = [], reference(prompt, prompt_pos)[:, -1:].argmax(-1)
        for i in range(8):
            token = reference(token, torch.tensor([8 + i])).argmax(-1)
            expected.append(int(token))
    assert made == expected
    assert feeds and set(feeds) == {2} and not launches
    assert step.fast_calls > 0


@pytest.mark.parametrize("failure", ["copies fail in the capture", "no memcpy nodes found", "instantiation fails"])
def test_a_graph_that_cannot_record_its_input_copies_launches_them_instead(monkeypatch, caplog, counted, failure):
    """However the recording with in-graph copies fails (a bindings call's error inside the capture; FedGraph finding
    no memcpy node after it; any other error there, as an instantiation's), the key is recorded again at once with
    its copies launched, and the graph's later keys too."""
    feeds, launches = counted
    capture = SimulatedCuda.capture

    def refuse(self, fn, args, **kw):
        if not kw.get("fed"):
            return capture(self, fn, args, **kw)
        if failure == "copies fail in the capture":  # as cudaMemcpyAsync's error would, before the function

            def copies_fail(values):
                raise feeding.FeedError("cudaMemcpyAsync failed: <cudaError_t.cudaErrorNotSupported: 801>")

            return capture(self, copies_fail, args, **kw)
        capture(self, fn, args, **kw)  # recorded; then the graph is refused, as by FedGraph(...)
        if failure == "no memcpy nodes found":
            raise feeding.FeedError("the recorded graph has no memcpy node for its fed input buffers [0]")
        raise RuntimeError("CUDA error: operation not supported (cudaErrorNotSupported)")

    monkeypatch.setattr(SimulatedCuda, "capture", refuse)
    model, sim = Step().eval(), SimulatedCuda()
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    backend = AirgraphBackend(config, runtime=sim)
    step = torch.compile(model, backend=backend, dynamic=True)  # (one graph, a key per batch size)
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 16)
            assert_close(step(x), model(x))
        for _ in range(3):  # another key: launched from the start
            x = torch.randn(2, 16)
            assert_close(step(x), model(x))
    warned = [
        r.getMessage() for r in caplog.records if "recording its input copies in the graph failed" in r.getMessage()
    ]
    assert (
        len(warned) == 1 and ("no memcpy node" if failure == "no memcpy nodes found" else "NotSupported") in warned[0]
    )
    assert not feeds and launches == [1] * 5  # (three replays of the first key, two of the second)
    (report,) = backend.reports
    assert report.captured and report.uncaptured_reason is None and report.recaptures == 0
    assert not sim.capturing and not sim.allocator.recording and not sim.generator.capturing  # cleaned up: record()


def test_a_graph_that_fails_to_record_without_its_input_copies_too_runs_uncaptured_and_keeps_them(
    monkeypatch, caplog, counted, captures
):
    """A recording that fails with the copies and again without them (the graph itself cannot be captured) says why
    the key runs uncaptured, and not that the copies failed: the graph's other keys still try them."""
    feeds, launches = counted
    capture, tries = SimulatedCuda.capture, []

    def refuse_the_first_key(self, fn, args, **kw):
        if not args:  # (the runtime's own probes)
            return capture(self, fn, args, **kw)
        batch = next(a.shape[0] for a in args if isinstance(a, torch.Tensor) and tuple(a.shape) in ((4, 16), (2, 16)))
        tries.append((batch, bool(kw.get("fed"))))
        if batch == 4:  # the first key's graph cannot be captured, with its copies or without
            raise SimulatedCudaError("operation not permitted when stream is capturing")
        return capture(self, fn, args, **kw)

    monkeypatch.setattr(SimulatedCuda, "capture", refuse_the_first_key)
    model = Step().eval()
    backend = AirgraphBackend(
        make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH), runtime=SimulatedCuda()
    )
    step = torch.compile(model, backend=backend, dynamic=True)  # (one graph, a key per batch size)
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for shape in [(4, 16)] * 3 + [(2, 16)] * 3:
            x = torch.randn(*shape)
            assert_close(step(x), model(x))
    assert tries == [(4, True), (4, False), (2, True)]  # with the copies, without them; the other key with them
    assert "recording its input copies in the graph failed" not in caplog.text
    assert "runs uncaptured: CUDA graph capture failed: SimulatedCudaError: operation not permitted" in caplog.text
    (capture_of_step,) = captures
    assert capture_of_step._recorder.feed and feeds == [1, 1] and not launches  # the second key is fed (2 replays)


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_simulator_finds_a_replay_reading_a_source_freed_since_it_was_fed():
    """What a replay path that forgot to feed its graph would do on CUDA: copy from the address of a tensor that is
    gone (whatever that memory holds now)."""
    sim = SimulatedCuda()
    buffer, source = sim.static_buffer(torch.ones(4)), torch.ones(4)
    graph, (out,) = sim.capture(
        lambda a: [a[0] * 2], [buffer], pool=sim.pool_handle(), stream=sim.new_stream(), device=None, fed=[(0, source)]
    )
    x = torch.full((4,), 3.0)
    sim.feed(graph, [x])
    sim.replay(graph, [buffer], [buffer])
    assert_close(out, torch.full((4,), 6.0))
    assert not sim.problems
    del x
    sim.replay(graph, [buffer], [buffer])
    assert len(sim.problems) == 1 and "reads a tensor freed since it was fed" in sim.problems[0]
    with pytest.raises(SimulatedCudaError, match="2 sources for 1 fed buffers"):
        sim.feed(graph, [torch.ones(4), torch.ones(4)])


@pytest.mark.simulator_problems  # (it checks the reports itself)
def test_the_simulator_finds_a_replay_reading_a_source_whose_memory_moved_since_it_was_fed():
    """CUDA's memcpy node copies from the address it was fed: a source moved since (``set_``, as settling a handed
    output moves it) is not what it copies."""
    sim = SimulatedCuda()
    buffer, source = sim.static_buffer(torch.ones(4)), torch.ones(4)
    graph, _ = sim.capture(
        lambda a: [a[0] * 2], [buffer], pool=sim.pool_handle(), stream=sim.new_stream(), device=None, fed=[(0, source)]
    )
    x = torch.full((4,), 3.0)
    sim.feed(graph, [x])
    x.set_(x.untyped_storage().clone(), 0, x.shape, x.stride())  # the same values elsewhere
    sim.replay(graph, [buffer], [buffer])
    (problem,) = sim.problems
    assert "reads the address it was fed, where the tensor fed is no longer" in problem


def test_the_option_names_its_values():
    with pytest.raises(ValueError, match="input_copies: invalid value 'graph'; allowed values: 'launch', 'in-graph'"):
        make_config(**{"reduce_overhead.input_copies": "graph"})


def test_cuda_cannot_feed_a_graph_without_a_cuda_runtime_the_bindings_can_start():
    """No driver here: the bindings (installed with torch's CUDA wheels, absent from its CPU wheels) are probed once,
    and CUDA's graphs then launch their copies."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    feeding.bindings.cache_clear()
    assert CudaRuntime().can_feed is False


# -- on a GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("fast_path", [False, True], ids=["through torch.compile", "fast path"])
def test_cuda_graphs_copy_each_calls_inputs_in_the_graph(cuda_launches, captures, fast_path):
    """On a GPU: the graphs are FedGraphs, no copy is launched, and replays queued behind each other (no sync between
    calls, each with a new input tensor, each output kept) each read their own input."""
    model = Step(256).eval().cuda()
    step = airgraph.compile(
        model, make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH), fast_path=fast_path
    )
    with torch.no_grad():
        for _ in range(3):
            step(torch.randn(64, 256, device="cuda"))
        inputs = [torch.randn(64, 256, device="cuda") for _ in range(12)]
        torch.cuda._sleep(100_000_000)  # the GPU kept busy: the replays below queue behind each other
        outputs = [step(x) for x in inputs]
        # One tensor refilled in place before each call: its address is the one set last, the node is not updated
        same, kept = torch.empty(64, 256, device="cuda"), []
        torch.cuda._sleep(100_000_000)
        for x in inputs[:4]:
            same.copy_(x)
            kept.append(step(same))
        torch.cuda.synchronize()
        for x, y in zip([*inputs, *inputs[:4]], [*outputs, *kept], strict=True):
            assert_close(y, model(x))
    assert not cuda_launches
    (capture,) = captures
    (entry,) = capture.keys.values()
    recorded = entry.recorded
    assert isinstance(recorded.graph, feeding.FedGraph) and len(recorded.fed) == 1 and not recorded.batches


@pytest.mark.cuda
def test_cuda_a_decode_loop_with_new_token_tensors_makes_eager_tokens(cuda_launches, captures):
    """On a GPU: tiny LLaMA's decode loop as users write it (a new token tensor and a new position tensor each step:
    two fed buffers), nothing synchronized between steps: eager's tokens, both inputs fed, no copy launched, torch's
    current device left as it was."""
    from airgraph.models import build_tiny_llama, prefill_inputs

    model, reference = build_tiny_llama("tiny", seed=0).cuda(), build_tiny_llama("tiny", seed=0).cuda()
    prompt, prompt_pos = (t.cuda() for t in prefill_inputs(model.config, 1, 8))
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    step = airgraph.compile(model, config, fast_path=True, fullgraph=True)
    device = torch.cuda.current_device()
    with torch.no_grad():
        token, made = model(prompt, prompt_pos)[:, -1:].argmax(-1), []
        for i in range(12):
            token = step(token, torch.tensor([8 + i], device="cuda")).argmax(-1)
            made.append(token)
        token, expected = reference(prompt, prompt_pos)[:, -1:].argmax(-1), []
        for i in range(12):
            token = reference(token, torch.tensor([8 + i], device="cuda")).argmax(-1)
            expected.append(token)
    assert [int(t) for t in made] == [int(t) for t in expected]
    assert not cuda_launches and step.fast_calls > 0 and torch.cuda.current_device() == device
    (capture,) = captures
    (entry,) = capture.keys.values()
    recorded = entry.recorded
    assert isinstance(recorded.graph, feeding.FedGraph) and len(recorded.fed) == 2 and not recorded.batches


def test_a_replay_off_the_lean_path_is_fed_too(counted, captures):
    """A graph that also returns a view of its input (handed back as that view of the caller's tensor, not from the
    graph's memory) replays through GraphCapture's general path: it feeds its graph as the decode step's path does."""
    feeds, launches = counted

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x @ x.t()).relu(), x[1:]

    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    compiled = torch.compile(fn, backend=AirgraphBackend(config, runtime=SimulatedCuda()))
    for _ in range(4):
        x = torch.randn(4, 8)
        y, view = compiled(x)
        assert_close(y, fn(x)[0])
        assert view.data_ptr() == x[1:].data_ptr()
    (capture,) = captures
    (entry,) = capture.keys.values()
    assert entry.recorded.lean is None and entry.recorded.fed
    assert feeds == [1] * 3 and not launches


@pytest.mark.parametrize("fast_path", [False, True], ids=["through torch.compile", "fast path"])
def test_a_graph_whose_copies_cannot_be_pointed_at_a_calls_tensors_is_recorded_again_with_launches(
    monkeypatch, caplog, counted, captures, fast_path
):
    """runtime.feed fails at a replay (a CUDA error): that call runs uncaptured with eager's result, and the key is
    recorded again with its input copies launched; later calls replay it."""
    _, launches = counted
    feed, failures = SimulatedCuda.feed, []

    def fails_third(self, graph, sources):
        failures.append(1)
        if len(failures) == 3:
            raise feeding.FeedError("cudaGraphExecMemcpyNodeSetParams1D failed: <cudaErrorInvalidValue: 1>")
        return feed(self, graph, sources)

    monkeypatch.setattr(SimulatedCuda, "feed", fails_third)
    model, sim = Step().eval(), SimulatedCuda()
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    step = airgraph.compile(model, config, fast_path=fast_path, runtime=sim)
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(8):
            x = torch.randn(4, 16)
            assert_close(step(x), model(x))
    assert "pointing its input copies at the call's tensors failed" in caplog.text
    assert len(failures) == 3 and launches  # fed twice, failed once, then copies launched
    (capture,) = captures
    (entry,) = capture.keys.values()
    assert entry.recaptures == 1 and not entry.recorded.fed and entry.recorded.batches  # one key, recorded twice
    assert capture._report.capture_keys == 1 and capture._report.recaptures == 1
    assert not sim.problems


class ComplexStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.complex64), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


@pytest.mark.parametrize("bit", ["conjugate", "negative"])
def test_a_conjugate_or_negative_view_is_never_fed_as_its_bytes(bit):
    """A view whose value is not its bytes (x.conj(); a negative view, as x.conj().imag is) in place of a plain tensor:
    on the fast path a call of another signature (Dynamo's guards, which compare dispatch keys, would recompile
    it), never the route whose graph would copy the view's bytes as they are."""
    model, sim = (ComplexStep() if bit == "conjugate" else Step(8)).eval(), SimulatedCuda()
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    step = airgraph.compile(model, config, fast_path=True, runtime=sim)
    dtype = torch.complex64 if bit == "conjugate" else torch.float32
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(4, 8, dtype=dtype)
            assert_close(step(x), model(x))
        for _ in range(3):
            y = torch.randn(4, 8, dtype=dtype)
            y = y.conj() if bit == "conjugate" else torch._neg_view(y)
            assert y.is_conj() or y.is_neg()
            assert_close(step(y), model(y.resolve_conj().resolve_neg()))
    assert not sim.problems, sim.problems


def test_a_fed_input_the_graph_mutates_is_copied_back(counted, captures):
    """An input the graph writes in place: fed into its buffer by the graph, written there, copied back to the
    caller's tensor after the replay (as with a copy launch)."""
    feeds, _ = counted

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + y

    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    compiled = torch.compile(fn, backend=AirgraphBackend(config, runtime=SimulatedCuda()))
    for _ in range(4):
        x, y = torch.randn(8), torch.randn(8)
        want_x, want = x * 2, x * 2 + y
        assert_close(compiled(x, y), want)
        assert_close(x, want_x)
    (capture,) = captures
    (entry,) = capture.keys.values()
    assert len(entry.recorded.fed) == 2 and len(entry.recorded.copy_back) == 1 and feeds == [2] * 3


def test_without_the_bindings_inputs_are_copied_by_a_launch_with_one_warning(monkeypatch, caplog, counted):
    feeds, launches = counted
    monkeypatch.setattr(SimulatedCuda, "can_feed", False)  # as CudaRuntime where cuda.bindings is missing
    model = Step().eval()
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **IN_GRAPH)
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for _ in range(2):  # two compilations, two GraphCaptures: one warning
            step = airgraph.compile(model, config, runtime=SimulatedCuda())
            for _ in range(3):
                x = torch.randn(4, 16)
                assert_close(step(x), model(x))
            torch._dynamo.reset()
    assert caplog.text.count("needs NVIDIA's cuda.bindings") == 1
    assert not feeds and launches == [1] * 4
