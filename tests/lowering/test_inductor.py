"""The inductor kernel backend on a segment traced for another backend (AOTAutograd without Inductor's
decompositions): what a tuning candidate or the seam compiles when the graph's kernel backend is aten."""

from __future__ import annotations

import operator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.lowering.inductor import compile_inductor
from airgraph.lowering.request import LowerRequest
from tests.helpers import assert_close, make_config

aten = torch.ops.aten


def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.addmm(b, x, w.t())  # aten.t: Inductor decomposes it, and has no lowering for it
    mean, rstd = aten.native_layer_norm(y, [y.shape[-1]], None, None, 1e-5)[1:]  # a multi-output op
    return torch.nn.functional.gelu(y), mean + rstd


def test_a_segment_traced_without_inductors_decompositions_compiles_and_equals_eager():
    args = [torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)]
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(a) for a in args]
    with mode:
        gm = make_fx(fn)(*fakes)
    targets = {n.target for n in gm.graph.nodes}
    assert aten.t.default in targets and operator.getitem in targets
    request = LowerRequest(gm, fakes, "inference", torch.device("cpu"), make_config(kernel_backend="aten"))
    compiled = compile_inductor(request)
    for got, expected in zip(compiled(list(args)), fn(*args), strict=True):
        assert_close(got, expected)
    assert aten.t.default in {n.target for n in gm.graph.nodes}  # the segment's own graph stays as traced
