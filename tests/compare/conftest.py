"""Fixtures of the compare tests: a kernel backend with one wrong lowering, registered for the test only."""

from __future__ import annotations

import pytest
import torch

from airgraph.lowering import backends
from airgraph.lowering.aten import compile_aten

aten = torch.ops.aten


@pytest.fixture
def wrong_backend(monkeypatch: pytest.MonkeyPatch):
    """``plant(op, by)``: registers the kernel backend "wrong", aten's with every ``op`` node computed by ``by`` (its
    tensor arguments only), and returns its name; the registry is restored when the test ends."""

    def plant(op, by) -> str:
        def lower(request):
            gm = torch.fx.GraphModule(request.gm, request.gm.graph.__deepcopy__())
            for node in gm.graph.find_nodes(op="call_function", target=op):
                node.target = by
                node.args = tuple(a for a in node.args if isinstance(a, torch.fx.Node))
                node.kwargs = {}
            gm.recompile()
            return compile_aten(gm)

        monkeypatch.setitem(backends.KERNEL_BACKENDS, "wrong", backends._Entry(lower, True, "a planted divergence"))
        return "wrong"

    return plant
