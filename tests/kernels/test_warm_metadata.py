"""Warm starts read AOTAutograd's metadata of the graph being compiled (an internal that changes between torch
versions: 2.15's plain-tensor records gained an ``arg_count``). Fast, so CI runs it on every supported torch."""

from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd

from airgraph.kernels.warm import _simple


def simple_for(fn, *args) -> bool:
    seen: list[bool] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        metadata = torch._guards.TracingContext.try_get().fw_metadata
        seen.append(_simple(metadata, len(example_inputs)))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, inference_compiler=compiler))(*args)
    (simple,) = seen
    return simple


def test_a_graph_of_plain_tensors_has_nothing_for_the_runtime_wrappers():
    assert simple_for(lambda x, w: (x @ w).relu(), torch.randn(2, 3), torch.randn(3, 4))


def test_a_mutated_input_or_an_output_aliasing_an_input_does():
    assert not simple_for(lambda x: x.add_(1), torch.randn(3))
    assert not simple_for(lambda x: (x.view(-1), x + 1), torch.randn(2, 3))
