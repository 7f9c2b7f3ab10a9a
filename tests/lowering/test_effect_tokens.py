"""Graphs with side effects (effect tokens: ``torch.linalg.solve``'s error checks, say) compile their backward: the
forward's output strides are reported to AOTAutograd without the tokens, which it splits off itself (issue #44:
"IndexError: tuple index out of range" in the backward's compile, and a failed backend compile for tensorinv)."""

from __future__ import annotations

import pytest
import torch

import airgraph
from tests.helpers import make_config

CASES = {
    "linalg.solve": (lambda a, b: torch.linalg.solve(a, b), [(3, 3), (3, 2)]),
    "linalg.lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], [(3, 3)]),
    "linalg.tensorsolve": (lambda a, b: torch.linalg.tensorsolve(a, b), [(2, 3, 6), (2, 3)]),
    "linalg.tensorinv": (lambda a: torch.linalg.tensorinv(a, ind=1), [(4, 2, 2)]),
}


def inputs(shapes, requires_grad):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=generator).requires_grad_(requires_grad) for s in shapes]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "inference"])
def test_effectful_linalg_ops_match_eager(name, grad):
    fn, shapes = CASES[name]
    args = inputs(shapes, grad)
    backend = airgraph.get_backend(compiler_config=make_config(kernel_backend="aten"))
    got = torch.compile(fn, backend=backend)(*args)
    want = fn(*args)
    torch.testing.assert_close(got, want)
    if grad:
        seed = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
        got_grads = torch.autograd.grad(got, args, seed)
        want_grads = torch.autograd.grad(want, args, seed)
        torch.testing.assert_close(got_grads, want_grads)


@pytest.mark.slow
def test_linalg_solve_backward_with_inductor_kernels():
    fn, shapes = CASES["linalg.solve"]
    args = inputs(shapes, True)
    backend = airgraph.get_backend(compiler_config=make_config(kernel_backend="inductor"))
    got_grads = torch.autograd.grad(torch.compile(fn, backend=backend)(*args).sum(), args)
    torch.testing.assert_close(got_grads, torch.autograd.grad(fn(*args).sum(), args))
