"""Graph keys (lowering/keys.py) of segments holding real constants, computed while a graph compiles."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from airgraph.lowering.keys import canonical_text, graph_key


def _graph_with_constant(value: torch.Tensor) -> torch.fx.GraphModule:
    root = torch.nn.Module()
    root.register_buffer("_tensor_constant0", value)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c = graph.get_attr("_tensor_constant0")
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (x, c)))
    return torch.fx.GraphModule(root, graph)


def test_a_real_constant_is_digested_under_the_compiles_fake_mode():
    # AOTAutograd compiles under a FakeTensorMode while get_attr constants stay real (T5's relative position
    # buckets lift a tensor(0)): reading their bytes there used to raise "Please convert all Tensors to
    # FakeTensors first" and failed the compile.
    # (the seam's tuning step keys every segment once the bank has entries: T5's training step failed so in the zoo)
    gm = _graph_with_constant(torch.tensor(0))
    outside = graph_key(gm)
    with FakeTensorMode():
        inside = graph_key(gm)
        other = graph_key(_graph_with_constant(torch.tensor(1)))
    assert inside == outside
    assert other != inside  # the value is part of the key, not only its shape


def test_a_fake_constant_is_keyed_by_its_metadata():
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(2, 3))
        text = canonical_text(_graph_with_constant(fake))
    assert "tensor(float32, (2, 3), fake)" in text
