"""The fast path (runtime/fastpath.py) and outputs handed without a copy (runtime/capture.py, outputs.py), on the
CUDA simulator: a recorded key is called past Dynamo and AOTAutograd, what a skipped guard would catch is still
caught, and a kept output is never overwritten while a dropped one costs no copy. The tests taking ``target`` run
on a GPU too (`cuda`), with the test of a call on another device."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import airgraph
from airgraph.config import ReduceOverheadConfig
from airgraph.runtime import fastpath
from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import Step, Target, assert_close, make_config, top_level_ops


@pytest.fixture(autouse=True, params=["last route by guards", "signatures only", "in-graph input copies"])
def matching(request, monkeypatch):
    """Every test three times: with a call matched to the last route by Dynamo's TensorGuards, where torch has none
    (every call computes its signature), and with the graphs filling their input buffers themselves (in-graph input
    copies, the configs' default for the test: runtime/feeding.py)."""
    if request.param == "signatures only":
        monkeypatch.setattr(fastpath, "_TensorGuards", None)
    if request.param == "in-graph input copies":
        monkeypatch.setattr(ReduceOverheadConfig.input_copies, "default", "in-graph")
    return request.param


def fast_compile(model, target: Target | None = None, **options):
    """``model``'s fast path on ``target`` (tests/runtime/conftest.py: a GPU, or a simulator), by default on a new
    simulator."""
    config = make_config(mode="reduce-overhead", kernel_backend="aten", **options)
    if target is not None and target.runtime is None:  # a GPU
        return airgraph.compile(model.cuda(), config, fast_path=True)
    runtime = SimulatedCuda() if target is None else target.runtime
    return airgraph.compile(model, config, fast_path=True, runtime=runtime)


def warm(fast, *args, calls: int = 4):
    """Calls until the key is recorded and the signature has a route (warm-up, record, learn)."""
    with torch.no_grad():
        for _ in range(calls):
            fast(*args)


def warmed_step(target: Target | None = None):
    """A Step, an input, and the Step's fast path with a route for that input (on ``target``: fast_compile)."""
    model, x = Step().eval(), torch.randn(4, 16, device="cpu" if target is None else target.device)
    fast = fast_compile(model, target)
    warm(fast, x)
    return model, x, fast


def test_a_recorded_key_is_called_past_torch_compile_and_equals_eager(monkeypatch, target):
    model, _, fast = warmed_step(target)
    assert fast.routes == 1 and not fast.refused
    monkeypatch.setattr(fast, "compiled", None)  # torch.compile's path is not taken any more
    before = fast.fast_calls
    with torch.no_grad():
        for i in range(3):
            y = torch.full((4, 16), float(i), device=target.device)
            assert_close(fast(y), model(y))
    assert fast.fast_calls == before + 3


class Tagged(torch.Tensor):
    """A tensor subclass (ops keep it, through __torch_function__)."""


def test_a_new_shape_or_scalar_takes_another_signature():
    model = Step().eval()
    fast = fast_compile(model)
    warm(fast, torch.randn(4, 16))
    calls = fast.fast_calls
    with torch.no_grad():
        x = torch.randn(2, 16)
        assert_close(fast(x), model(x))  # another shape: through torch.compile, not the route of (4, 16)
    assert fast.fast_calls == calls

    def signature(args: tuple, kwargs: dict, training: bool = False) -> tuple | None:
        return fastpath._signature(args, kwargs, training)

    assert signature((x, 2), {}) != signature((x, 3), {})
    assert signature((x,), {}) != signature((x,), {}, training=True)
    assert signature((x,), {}) != signature((x.t().contiguous().t(),), {})  # strides
    assert signature((x,), {}) != signature((x.double(),), {})
    assert signature((x,), {}) != signature((x.as_subclass(Tagged),), {})  # a tensor subclass
    assert signature((x,), {}) != signature((torch.empty(2, 16, device="meta"),), {})  # another device
    assert signature((x,), {}) != signature((), {"x": x})
    plain = signature((x,), {})
    with torch.inference_mode():
        assert signature((x,), {}) != plain
    with torch.no_grad():
        assert signature((x,), {}) != plain
    assert signature(([x],), {}) is None  # a structure: no signature, always torch.compile's path


class Twice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


@pytest.mark.parametrize(
    "other",
    [
        lambda x: x[:2],  # another shape
        lambda x: x.t().contiguous().t(),  # other strides
        lambda x: x.clone().requires_grad_(),
        lambda x: x.to(torch.float64),
    ],
    ids=["shape", "strides", "requires_grad", "dtype"],
)
def test_a_call_unlike_the_last_routed_one_does_not_take_its_route(other, matching):
    model, x = Twice().eval(), torch.randn(4, 16)  # no parameters: any dtype
    fast = fast_compile(model)
    warm(fast, x)
    with torch.no_grad():
        fast(x)  # routed: the last route
        calls = fast.fast_calls
        y = other(torch.randn(4, 16))
        out = fast(y)
        assert out.dtype == y.dtype
        assert_close(out, model(y))
        assert fast.fast_calls == calls
    assert (fast._last is not None) == (matching != "signatures only")


def test_the_last_route_is_not_taken_in_another_grad_mode_or_training_mode():
    model, x, fast = warmed_step()
    with torch.no_grad():
        fast(x)
    calls = fast.fast_calls
    out = fast(x)  # grad enabled
    assert out.grad_fn is not None and fast.fast_calls == calls
    model.train()
    with torch.no_grad():
        fast(x)
    assert fast.fast_calls == calls


class MakesOnes(Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.ones(x.shape[-1])  # made in the default dtype


def test_a_changed_global_state_leaves_the_route():
    """What Dynamo's global-state guard checks (autocast, the default dtype, deterministic algorithms...) is checked
    per route with that guard: a route learned in one state is not taken in another, whose call goes through
    torch.compile (recompiled for it) and learns its own route."""
    model, x = MakesOnes().eval(), torch.randn(4, 16)
    fast = fast_compile(model)
    warm(fast, x)
    calls = fast.fast_calls
    with torch.no_grad():
        torch.set_default_dtype(torch.float64)
        try:
            out = fast(x)
        finally:
            torch.set_default_dtype(torch.float32)
        assert out.dtype == torch.float64 and fast.fast_calls == calls  # ones made float64, as eager does
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the linears in bfloat16
            got, want = fast(x), model(x)
        assert fast.fast_calls == calls and not torch.allclose(want, model(x), atol=1e-4)
        torch.testing.assert_close(got, want)
        fast(x), fast(x)  # the default state again: learned anew, then routed
        assert fast.fast_calls == calls + 1
        assert_close(fast(x), model(x))


def test_grad_mode_leaves_the_fast_path():
    model, x = Step(), torch.randn(4, 16)  # parameters require grad
    fast = fast_compile(model)
    warm(fast, x)
    calls = fast.fast_calls
    out = fast(x)  # grad enabled: a training graph, through torch.compile and AOTAutograd
    assert out.requires_grad and out.grad_fn is not None and fast.fast_calls == calls
    out.sum().backward()
    assert model.up.weight.grad is not None


def test_an_assigned_parameter_is_learned_again(target):
    model, x, fast = warmed_step(target)
    calls = fast.fast_calls
    model.up.weight = nn.Parameter(torch.randn_like(model.up.weight))
    with torch.no_grad():
        assert_close(fast(x), model(x))  # the assignment was counted: the route dropped, the call learned anew
        assert fast.fast_calls == calls and fast.routes == 1
        assert_close(fast(x), model(x))
    assert fast.fast_calls == calls + 1


def test_training_mode_leaves_the_route_of_eval_mode():
    """``model.train()`` sets the flag dropout reads (Dynamo guards on it): a route learned in eval mode would drop
    no activation."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.9)).eval()
    fast, x = fast_compile(model), torch.randn(4, 64)
    warm(fast, x)
    with torch.no_grad():
        model.train()
        assert all(bool((fast(x) == 0).any()) for _ in range(4))  # dropout drops, in every call (its own route)
        model.eval()
        calls = fast.fast_calls
        assert_close(fast(x), model(x))
    assert fast.fast_calls == calls + 1 and fast.routes == 2  # the eval route again, beside the training one


@pytest.fixture
def overwriting_conversions():
    """Switches on (the test calls it) torch.__future__'s flag by which ``model.to`` puts new Parameter objects
    into the modules; off again after the test."""
    yield lambda: torch.__future__.set_overwrite_module_params_on_conversion(True)
    torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_parameters_replaced_by_a_conversion_are_never_read_stale(overwriting_conversions):
    """``model.to`` under torch.__future__.set_overwrite_module_params_on_conversion(True) replaces each Parameter
    object unseen by the assignment hooks; the route kept the old ones, and read their stale values."""
    model, x, fast = warmed_step()
    with torch.no_grad():
        fast(x)  # routed: the last route, too
        overwriting_conversions()
        model.double().float()  # new Parameter objects, the same values, dtype and signature
        model.up.weight.mul_(2)  # written in place: only the new objects have it
        for _ in range(3):
            assert_close(fast(x), model(x))
        assert fast.routes == 0  # none while the flag is on
    torch.__future__.set_overwrite_module_params_on_conversion(False)
    calls = fast.fast_calls
    with torch.no_grad():
        for _ in range(3):  # learned again on the new parameters (the signature was seen: at once), then routed
            assert_close(fast(x), model(x))
    assert fast.routes == 1 and fast.fast_calls == calls + 2


def test_a_moved_parameter_is_left_to_torch_compile(target):
    model, x, fast = warmed_step(target)
    calls = fast.fast_calls
    with torch.no_grad():
        model.down.weight.data = model.down.weight.data * 2  # new memory, same Parameter object
        assert_close(fast(x), model(x))
    assert fast.fast_calls == calls  # the capture's address check missed: torch.compile's path re-recorded


@pytest.mark.cuda
def test_cuda_a_call_on_another_device_leaves_the_route():
    """On a GPU: a route learned for CUDA tensors is not taken by a call of CPU tensors (same shape and dtype): the
    call goes through torch.compile and runs on the CPU, as eager does."""
    model, x = Twice().eval(), torch.randn(4, 16, device="cuda")  # no parameters: any device
    fast = fast_compile(model, Target("cuda", None))
    warm(fast, x)
    with torch.no_grad():
        fast(x)  # routed: the last route
        calls = fast.fast_calls
        assert calls > 0
        y = torch.randn(4, 16)
        out = fast(y)
        assert out.device == y.device
        assert_close(out, model(y))
        assert_close(fast(x), model(x))  # the CUDA route still serves CUDA calls
    assert fast.fast_calls == calls + 1


class Broken(Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        torch._dynamo.graph_break()
        return x + self.down(h)


class ReturnsAView(Step):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), x[0]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (Broken(), "2 compiled graphs ran in one call"),
        (ReturnsAView(), "not an output of its graph"),
    ],
)
def test_a_call_the_route_cannot_reproduce_is_refused(model, reason):
    model, x = model.eval(), torch.randn(4, 16)
    fast = fast_compile(model)
    warm(fast, x)
    assert fast.routes == 0 and reason in next(iter(fast.refused.values()))
    with torch.no_grad():
        assert_close(fast(x), model(x))


def test_an_input_mutation_applied_after_the_graph_is_refused():
    def bump(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        counter.add_(1)
        return x * 2

    fast = fast_compile(bump, **{"experimental_config.keep_inference_input_mutations": False})
    x, counter = torch.randn(4), torch.zeros(())
    warm(fast, x, counter)
    assert fast.routes == 0 and "written after the compiled graph" in next(iter(fast.refused.values()))
    assert int(counter) == 4


# -- outputs without a copy ------------------------------------------------------------------------------


def copies(fn) -> int:
    """Top-level copy_ and clone ops that ``fn()`` dispatches (an output copy, or an input into its buffer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for name in top_level_ops(prof.events()) if name in ("aten::copy_", "aten::clone"))


def test_outputs_dropped_before_the_next_step_are_never_copied(target):
    _, x, fast = warmed_step(target)
    calls = fast.fast_calls
    with torch.no_grad():
        dropped = [copies(lambda: fast(x).sum()) for _ in range(3)]  # each step's output dropped at once
        assert not fast.backend._pool.copy_outputs
        fast.backend._pool.copy_outputs = True  # as before: every replay copies its output out
        copied = [copies(lambda: fast(x).sum()) for _ in range(3)]
    # The simulator's replay copies too (its input into its buffer, its graph's writes), in both; one more with
    # the output copied out. On a GPU the input's copy is a foreach copy or none (in the graph): no copy_ at all.
    assert [c - 1 for c in copied] == dropped
    assert fast.fast_calls == calls + 6
    if target.runtime is None:  # a GPU
        assert dropped == [0, 0, 0]


def test_outputs_kept_across_steps_keep_their_values(target):
    model, _, fast = warmed_step(target)
    calls, kept, counts = fast.fast_calls, [], []
    with torch.no_grad():
        replay = copies(lambda: fast(torch.randn(4, 16, device=target.device)).sum())  # an output dropped at once
        for i in range(4):
            x = torch.full((4, 16), float(i), device=target.device)
            counts.append(copies(lambda x=x: kept.append(fast(x))))
        for i, out in enumerate(kept):  # step i's output, after later replays (queued, on a GPU: read in order)
            assert_close(out, model(torch.full((4, 16), float(i), device=target.device)))
    # each later step: the previous step's kept output moved to a copy before the replay
    assert counts == [replay, replay + 1, replay + 1, replay + 1]
    assert not fast.backend._pool.copy_outputs and fast.fast_calls == calls + 5


def test_a_view_of_an_output_held_across_a_replay_stays_correct(target, caplog):
    model, _, fast = warmed_step(target)
    rows = []
    with caplog.at_level(logging.WARNING, logger="airgraph"), torch.no_grad():
        for i in range(4):
            rows.append(fast(torch.full((4, 16), float(i), device=target.device))[1])  # a view: the output is dropped
        for i, row in enumerate(rows):
            assert_close(row, model(torch.full((4, 16), float(i), device=target.device))[1])
    assert fast.backend._pool.copy_outputs  # from the first held view on, replays copy their outputs
    assert caplog.text.count("is still held through a view") == 1  # warned once, at the first held view


def test_on_the_cpu_the_route_calls_the_executor_and_checks_parameter_addresses():
    """Nothing captured (the CPU): the route calls the executor itself, and checks the parameters' addresses."""
    model, x = Step().eval(), torch.randn(4, 16)
    fast = airgraph.compile(model, make_config(kernel_backend="aten"), fast_path=True)
    warm(fast, x)
    calls = fast.fast_calls
    with torch.no_grad():
        assert_close(fast(x), model(x))
        assert fast.fast_calls == calls + 1
        model.up.weight.data = model.up.weight.data.double().float() * 3  # new memory, same Parameter
        assert_close(fast(x), model(x))
    assert fast.fast_calls == calls + 1


def test_reset_forgets_every_route_and_a_plain_compile_is_torch_compile():
    model, x, fast = warmed_step()
    fast.reset()  # after changing Python state the forward reads
    calls = fast.fast_calls
    with torch.no_grad():
        fast(x), fast(x)  # seen once, then learned: both through torch.compile
        assert fast.routes == 1 and fast.fast_calls == calls
        assert_close(fast(x), model(x))
    assert fast.fast_calls == calls + 1
    plain = airgraph.compile(model, make_config(kernel_backend="aten"))
    assert isinstance(plain, torch._dynamo.eval_frame.OptimizedModule)


class AssignsABuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("last", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = x.sum(0)  # a buffer assigned in forward (HF's rotary embeddings do so)
        return x * 2


def test_the_assignment_hooks_do_not_make_other_compiles_recompile():
    """The fast path's global registration hooks run inside any forward Dynamo traces; they must not put a guard on
    their counter there (a guarded global that changes every call recompiled an HF model every step)."""
    fast_compile(Step().eval())  # installs the hooks
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    model = AssignsABuffer()
    compiled = torch.compile(model, backend=counting)
    for i in range(4):
        x = torch.full((3, 4), float(i))
        assert_close(compiled(x), x * 2)
        assert_close(model.last, x.sum(0))
    assert len(compiles) == 1


class Nested(Step):
    def forward(self, x: torch.Tensor) -> tuple:
        y = super().forward(x)
        return (y, y * 2), y + 1


def test_a_nested_result_keeps_its_structure():
    model, x = Nested().eval(), torch.randn(4, 16)
    fast = fast_compile(model)
    warm(fast, x)
    calls = fast.fast_calls
    with torch.no_grad():
        (a, b), c = fast(x)
        (want_a, want_b), want_c = model(x)
    assert fast.fast_calls == calls + 1
    assert_close(a, want_a)
    assert_close(b, want_b)
    assert_close(c, want_c)


def test_an_input_buffer_marked_static_is_read_in_place_without_an_input_copy(monkeypatch, matching):
    """A decode loop that refills its input buffers in place, marked with torch._dynamo.mark_static_address: the
    graph reads them where they are (no copy launch per step); another tensor in their place is still right."""
    model = Step().eval()
    fast = fast_compile(model)
    x = torch.randn(4, 16)
    torch._dynamo.mark_static_address(x)
    warm(fast, x)
    launches = []
    copy_many = SimulatedCuda.copy_many
    monkeypatch.setattr(SimulatedCuda, "copy_many", lambda self, *a: (launches.append(1), copy_many(self, *a)))
    calls = fast.fast_calls
    with torch.no_grad():
        for i in range(3):
            x.fill_(float(i))  # the caller refills the buffer between steps
            assert_close(fast(x), model(x))
        assert fast.fast_calls == calls + 3 and not launches
        other = torch.randn(4, 16)  # not the buffer: recorded again on it, never read from the old address
        for _ in range(2):
            assert_close(fast(other), model(other))
    plain = fast_compile(Step().eval())
    warm(plain, torch.randn(4, 16))
    with torch.no_grad():
        plain(torch.randn(4, 16))
    # an input not marked static is copied into its buffer (the counter sees copies), or fed to the graph
    assert bool(launches) == (matching != "in-graph input copies")


def test_a_decode_loop_refilling_static_input_buffers_makes_eager_tokens():
    """The README's decode loop: token and position buffers marked static, refilled in place after each step (the
    next token written by argmax(out=), the position incremented), read by the graph where they are."""
    from airgraph.models import build_tiny_llama, prefill_inputs

    model, reference = build_tiny_llama("tiny", seed=0), build_tiny_llama("tiny", seed=0)
    prompt, prompt_pos = prefill_inputs(model.config, 1, 8)
    config = make_config(mode="reduce-overhead", kernel_backend="aten")
    step = airgraph.compile(model, config, fast_path=True, runtime=SimulatedCuda(), fullgraph=True)
    with torch.no_grad():
        first = model(prompt, prompt_pos)[:, -1:].argmax(-1)
        tokens, pos = first.clone(), torch.tensor([8])
        for buffer in (tokens, pos):
            torch._dynamo.mark_static_address(buffer)
        made = []
        for _ in range(8):
            torch.argmax(step(tokens, pos), -1, out=tokens)
            pos += 1
            made.append(int(tokens))
        reference(prompt, prompt_pos)
        expected, token = [], first
        for i in range(8):
            token = reference(token, torch.tensor([8 + i])).argmax(-1)
            expected.append(int(token))
    assert made == expected
    assert step.fast_calls >= 5 and not next(iter(step._routes.values())).run.key.copy_indices


class Scaled(Step):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        out = super().forward(x) * scale
        return out if y is None else out + y


@pytest.mark.parametrize("call", ["keyword", "more arguments"])
def test_a_call_with_keywords_or_more_arguments_does_not_take_the_last_route(call):
    model, x = Scaled().eval(), torch.randn(4, 16)
    fast = fast_compile(model)
    warm(fast, x)
    with torch.no_grad():
        fast(x)  # routed: the last route
        calls = fast.fast_calls
        args, kwargs = ((x,), {"scale": 3.0}) if call == "keyword" else ((x, x), {})
        assert_close(fast(*args, **kwargs), model(*args, **kwargs))
    assert fast.fast_calls == calls


class GradOnItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        x.requires_grad_()  # changes the caller's tensor: no version counts it
        return y


def test_a_forward_that_changes_its_arguments_metadata_gets_no_route():
    fast = fast_compile(GradOnItsInput().eval())
    for _ in range(4):
        x = torch.randn(4, 4)
        fast(x)
        assert x.requires_grad  # as in eager: the route would skip it
    assert not fast.routes and "metadata" in next(iter(fast.refused.values()))
    out = fast(torch.randn(4, 4, requires_grad=True))
    assert out.grad_fn is not None  # not an inference route's output
