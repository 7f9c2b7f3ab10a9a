"""AOTAutograd's metadata of the graph being compiled (lowering/aot.py): an internal that changes between torch
versions (2.15's plain-tensor records gained an ``arg_count``). Fast, so CI runs it on every supported torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from airgraph.lowering import aot


def read_while_compiling(read: Callable[[list], Any], fn, *args) -> Any:
    """What ``read(example_inputs)`` answers while AOTAutograd compiles ``fn``'s one inference graph."""
    seen: list = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        seen.append(read(example_inputs))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, inference_compiler=compiler))(*args)
    (answer,) = seen
    return answer


def simple_for(fn, *args) -> bool:
    return read_while_compiling(lambda inputs: aot.no_runtime_wrappers(len(inputs)), fn, *args)


def test_a_graph_of_plain_tensors_has_nothing_for_the_runtime_wrappers():
    assert simple_for(lambda x, w: (x @ w).relu(), torch.randn(2, 3), torch.randn(3, 4))


def test_a_mutated_input_or_an_output_aliasing_an_input_does():
    assert not simple_for(lambda x: x.add_(1), torch.randn(3))
    assert not simple_for(lambda x: (x.view(-1), x + 1), torch.randn(2, 3))


class Cached(torch.nn.Module):
    """A weight it only reads, and a cache buffer it updates in place."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.register_buffer("cache", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(1)
        return x @ self.weight


def test_weights_are_the_static_inputs_the_graph_does_not_update():
    def read(inputs: list) -> tuple:
        static = aot.static_input_indices()
        return [tuple(inputs[i].shape) for i in static], {tuple(inputs[i].shape) for i in aot.unchanged_weights()}

    static, unchanged = read_while_compiling(read, Cached(), torch.randn(2, 4))
    assert sorted(static) == [(4,), (4, 4)]  # the weight and the cache
    assert unchanged == {(4, 4)}  # the cache is updated: not a weight to freeze


def test_outside_a_compile_nothing_is_known():
    assert aot.static_input_indices() == [] and aot.unchanged_weights() == set() and aot.donated_inputs() == []
    assert not aot.no_runtime_wrappers(1) and not aot.tracing_active()
    aot.report_output_strides([(1,)])  # nobody asks: nothing to tell
    with aot.donating([0]):  # nothing to set
        assert aot.donated_inputs() == []
