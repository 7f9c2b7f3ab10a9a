"""The aten kernel backend calls an op's faster Python binding only where the binding calls that op with the node's
own arguments: a binding whose defaults differ from the op's schema (issue #44's one-element
binary_cross_entropy_with_logits: the binding reduces by none, the op by mean) runs the op itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import airgraph
from tests.helpers import make_config


def bce(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(x, target)


@pytest.mark.parametrize("shape", [(1,), (3,), (2, 4)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_bce_with_logits_reduces_by_mean_as_eager(shape, dynamic):
    x, target = torch.randn(shape), torch.rand(shape)
    backend = airgraph.get_backend(compiler_config=make_config(kernel_backend="aten"))
    got = torch.compile(bce, backend=backend, dynamic=dynamic)(x, target)
    want = bce(x, target)
    assert got.shape == want.shape == torch.Size([])
    torch.testing.assert_close(got, want)


def test_bce_with_logits_gradients_match_eager():
    x, target = torch.randn(1, requires_grad=True), torch.rand(1)
    backend = airgraph.get_backend(compiler_config=make_config(kernel_backend="aten"))
    (got,) = torch.autograd.grad(torch.compile(bce, backend=backend)(x, target), x)
    (want,) = torch.autograd.grad(bce(x, target), x)
    torch.testing.assert_close(got, want)


def test_a_binding_with_other_defaults_is_not_used_and_one_with_the_same_is():
    from torch._dynamo.backends.common import aot_autograd

    from airgraph.lowering.aten import fast_callable

    chosen = {}

    def look(gm: torch.fx.GraphModule, _inputs):
        for node in (n for n in gm.graph.nodes if n.op == "call_function"):
            chosen[str(node.target)] = fast_callable(node)
        return gm

    def fn(x, target):
        return bce(x, target), torch.sin(x)

    torch.compile(fn, backend=aot_autograd(fw_compiler=look))(torch.randn(3), torch.rand(3))
    assert chosen["aten.binary_cross_entropy_with_logits.default"] is None  # the OpOverload runs
    assert chosen["aten.sin.default"] is torch._C._VariableFunctions.sin
