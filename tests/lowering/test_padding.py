"""Capture sizes' plan: which graphs may run a batch padded to a larger size (lowering/padding.py).

Each refused case is a graph where a real row's values would depend on padded rows; each planned one pads the
batch inputs and slices the outputs back. The planned cases' padded runs are compared with eager here, on the
graph itself: a padded run sliced back must equal the unpadded one.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from airgraph.lowering.padding import PadPlan, PadRefusal, plan_padding
from airgraph.models import (
    KVCache,
    build_serving_decode,
    build_tiny_llama,
    decode_inputs,
    mark_batch_dynamic,
    serving_decode_inputs,
)

THIS_FILE = __file__


def aten_graph(fn, *args, dynamic_dim: int = 0) -> tuple[torch.fx.GraphModule, list]:
    """The forward ATen graph (inference) of ``fn`` with dimension ``dynamic_dim`` of ``args[0]`` dynamic, and the
    arguments it was called with."""
    graphs, calls = [], []

    def compiler(gm, example_inputs):
        graphs.append(gm)

        def run(*inputs):
            calls.append(list(inputs))
            return gm(*inputs)

        return run

    torch._dynamo.mark_dynamic(args[0], dynamic_dim)
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=compiler), fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0], calls[0]


def run_padded(gm: torch.fx.GraphModule, plan: PadPlan, args: list, size: int) -> list:
    """Run the graph on ``args`` padded to ``size`` rows (zeros), sliced back as the plan says."""
    batch = plan.batch(args)
    padded = list(args)
    for i in plan.symints:
        padded[i] = size
    for i, dim, k in plan.padded:
        shape = list(args[i].shape)
        shape[dim] = k * size
        buffer = torch.zeros(shape, dtype=args[i].dtype)
        buffer.narrow(dim, 0, k * batch).copy_(args[i])
        padded[i] = buffer
    outputs = list(gm(*padded))
    for index, dim, k in plan.sliced:
        outputs[index] = outputs[index].narrow(dim, 0, k * batch)
    return outputs


LINEAR = torch.nn.Linear(8, 8)
EMBED = torch.nn.Embedding(16, 8)


def _row_local(x):
    h = torch.relu(LINEAR(x)).softmax(-1)
    return torch.nn.functional.layer_norm(h.view(x.shape[0], 2, 4), (4,)).flatten(1) * 2, h.sum(-1)


def _tokens(t):
    return EMBED(t).transpose(0, 1).reshape(t.shape[1], -1).amax(0)


@pytest.mark.parametrize(
    "fn, args",
    [
        (_row_local, lambda: [torch.randn(5, 8)]),
        (lambda x: x.reshape(-1) + 1, lambda: [torch.randn(5, 3)]),
        (lambda x, y: (x @ y, torch.cat([x, x], 1)), lambda: [torch.randn(5, 4), torch.randn(4, 3)]),
        (lambda t: EMBED(t).mean(1), lambda: [torch.randint(0, 16, (5, 3))]),
    ],
    ids=["pointwise-norm-views", "flatten", "matmul-cat", "embedding"],
)
def test_row_local_graphs_are_planned_and_padding_is_invisible(fn, args):
    values = args()
    gm, inputs = aten_graph(fn, *values)
    plan = plan_padding(gm, dim=0)
    assert isinstance(plan, PadPlan), plan
    assert plan.padded and plan.sliced
    with torch.no_grad():
        want = gm(*inputs)
        got = run_padded(gm, plan, inputs, 8)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    "fn, what",
    [
        (lambda x: x.sum(0), "reduces or scans along the batch dimension"),
        (lambda x: x.cumsum(0), "reduces or scans along the batch dimension"),
        (lambda x: x.sort(0).values, "reduces or scans along the batch dimension"),
        (lambda x: x.t() @ x, "contracts over the batch dimension"),
        (lambda x: x / x.shape[0], "uses the batch size as a value"),
        (lambda x: x[-1], "picks or places along the batch dimension"),
        (lambda x: x[1:], "slices the batch dimension"),
        (lambda x: torch.cat([x, x]), "picks or places along the batch dimension"),
        (lambda x: x.t().reshape(-1), "reshapes the batch dimension"),
        (lambda x: x + torch.rand_like(x), "draws random numbers"),
    ],
    ids=["sum", "cumsum", "sort", "contract", "size-as-value", "select", "slice", "cat", "transposed-flatten", "rand"],
)
def test_row_mixing_graphs_are_refused_naming_the_op_and_the_line(fn, what):
    gm, _ = aten_graph(fn, torch.randn(5, 4))
    refusal = plan_padding(gm, dim=0)
    assert isinstance(refusal, PadRefusal), refusal
    assert what in refusal.reason
    assert refusal.source is not None and refusal.source.startswith(f"{THIS_FILE}:")


def test_batch_norm_in_training_is_refused_and_in_eval_planned():
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(5, 4)
    refusal = plan_padding(aten_graph(bn.train(), x)[0], dim=0)
    assert isinstance(refusal, PadRefusal) and "batch norm in training" in refusal.reason
    torch._dynamo.reset()
    assert isinstance(plan_padding(aten_graph(bn.eval(), x.clone())[0], dim=0), PadPlan)


def test_a_fixed_size_cache_written_by_batch_rows_is_refused():
    """The cache has max-batch rows; a call writes its first ``batch`` rows: padded rows would write real ones."""
    cache = torch.zeros(8, 4)

    def step(x):
        cache[: x.shape[0]] += x
        return cache[: x.shape[0]] * 2

    refusal = plan_padding(aten_graph(step, torch.randn(3, 4))[0], dim=0)
    assert isinstance(refusal, PadRefusal)
    assert "a tensor of fixed size" in refusal.reason


def test_static_shapes_and_a_non_batch_dimension_have_no_plan():
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(lambda x: x * 2, backend=aot_autograd(fw_compiler=compiler), dynamic=False)(torch.randn(3, 4))
    assert plan_padding(graphs[0], dim=0) is None
    torch._dynamo.reset()
    gm, _ = aten_graph(lambda x: x * 2, torch.randn(3, 4), dynamic_dim=1)
    assert plan_padding(gm, dim=0) is None
    plan = plan_padding(gm, dim=1)
    assert isinstance(plan, PadPlan) and plan.padded == ((1, 1, 1),)


def test_the_serving_decode_step_is_planned_and_padding_is_invisible():
    """Caches that follow the batch, written at each row's own position (a scatter along the sequence): a padded
    row writes only into a padded cache row, so the step is padded; Dynamo's batch starts at 2."""
    step = build_serving_decode("micro")
    tokens, positions = serving_decode_inputs(step.config, 3)
    k, v = step.new_caches(3)
    k[0].normal_(generator=torch.Generator().manual_seed(0))  # earlier positions the step attends to
    mark_batch_dynamic(tokens, positions, k, v)
    gm, inputs = aten_graph(step, tokens, positions, k, v)
    plan = plan_padding(gm, dim=0)
    assert isinstance(plan, PadPlan), plan
    assert plan.smallest == 2
    assert len(plan.padded) == 4  # tokens, positions and the two caches
    with torch.no_grad():
        want = gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in inputs])
        got = run_padded(gm, plan, inputs, 8)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_tiny_llamas_max_batch_cache_is_refused_with_its_reason():
    """TinyLlama's decode writes the first B rows of a cache made for the largest batch (as HF's StaticCache of
    max_batch_size): a padded row would write into the row of another request."""
    model = build_tiny_llama("micro", max_batch_size=8)
    tokens, pos = decode_inputs(model.config, 3, 4)
    refusal = plan_padding(aten_graph(model, tokens, pos)[0], dim=0)
    assert isinstance(refusal, PadRefusal), refusal
    assert "takes a batch of rows from a tensor of fixed size" in refusal.reason
    assert refusal.source is not None and refusal.source.endswith(f"llama.py:{_line_of(KVCache.update, 'bsz]')}")


def _line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


CACHE = torch.zeros(8, 4)
SLOTS = torch.zeros(8, 6)


@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda x, slots: CACHE.index_copy_(0, slots, x) * 1, lambda: [torch.randn(3, 4), torch.tensor([5, 1, 2])]),
        (lambda x, index: CACHE.scatter_(0, index, x) * 1, lambda: [torch.randn(3, 4), torch.zeros(3, 4).long()]),
        (lambda x, index: SLOTS.scatter_(1, index, x) * 1, lambda: [torch.randn(3, 1), torch.zeros(3, 1).long()]),
    ],
    ids=["index_copy-slots", "scatter-rows", "scatter-along-other-dim"],
)
def test_batch_rows_written_by_index_into_a_tensor_of_fixed_size_are_refused(fn, args):
    """A serving engine's slot mapping into a cache of fixed size: padded rows (slot 0) would write real slots."""
    values = args()
    torch._dynamo.mark_dynamic(values[1], 0)
    refusal = plan_padding(aten_graph(fn, *values)[0], dim=0)
    assert isinstance(refusal, PadRefusal), refusal
    assert "writes batch rows into a tensor of fixed size" in refusal.reason
    assert refusal.source is not None and refusal.source.startswith(f"{THIS_FILE}:")


def _attend(q, dropout=0.0):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=dropout)


def test_attention_without_dropout_is_planned_with_dropout_or_over_the_batch_refused():
    q = torch.randn(3, 2, 5, 4)
    gm, inputs = aten_graph(_attend, q)
    plan = plan_padding(gm, dim=0)
    assert isinstance(plan, PadPlan), plan
    with torch.no_grad():
        torch.testing.assert_close(run_padded(gm, plan, inputs, 8)[0], gm(*inputs)[0])
    torch._dynamo.reset()
    refusal = plan_padding(aten_graph(lambda q: _attend(q, 0.5), q.clone())[0], dim=0)
    assert isinstance(refusal, PadRefusal) and "draws random numbers" in refusal.reason
    torch._dynamo.reset()
    refusal = plan_padding(aten_graph(_attend, q.clone(), dynamic_dim=2)[0], dim=2)
    assert isinstance(refusal, PadRefusal) and "attends over the batch dimension" in refusal.reason
