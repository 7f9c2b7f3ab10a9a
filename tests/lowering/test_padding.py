"""Capture sizes' plan: which graphs may run a batch padded to a larger size (lowering/padding.py).

Each refused case is a graph where a real row's values would depend on padded rows; each planned one pads the
batch inputs and slices the outputs back. The planned cases' padded runs are compared with eager here, on the
graph itself: a padded run sliced back must equal the unpadded one.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from airgraph.lowering.padding import PadPlan, PadRefusal, plan_padding

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
