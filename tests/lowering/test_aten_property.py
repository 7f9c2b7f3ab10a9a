"""Property test: random DAGs of small ops through the aten backend (name reuse, in-place writes) equal eager."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.lowering.aten import compile_aten

UNARY = [torch.sin, torch.relu, torch.neg, torch.exp, lambda t: t * 1.5, lambda t: t + 2, lambda t: t.t()]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum]

step = st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 50), st.integers(0, 50))


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=12))
def test_random_dags_match_eager(steps):
    def program(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x, y]
        for binary, op, i, j in steps:
            a, b = values[i % len(values)], values[j % len(values)]
            values.append(BINARY[op % len(BINARY)](a, b) if binary else UNARY[op](a))
        return (*values[2:][-3:], values[2])

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(program, tracing_mode="fake")(x, y)
    run = compile_aten(gm)
    x_in, y_in = x.clone(), y.clone()
    expected = program(x, y)
    got = run([x_in, y_in])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, equal_nan=True)
    torch.testing.assert_close(x_in, x)  # inputs untouched
    torch.testing.assert_close(y_in, y)
