"""config.fallback: kept ops are not decomposed, run through the aten backend (chosen_by "compare"), and the compile
cache's key covers the decomposition tables."""

import pytest
import torch
from torch._inductor import decomposition as inductor_decomposition

import airgraph
from airgraph.cache.keys import decomposition_digest
from airgraph.config import CompilerConfig
from airgraph.lowering.decompositions import without_kept

aten = torch.ops.aten


def _wrong_silu(x):
    return x * torch.sigmoid(1.05 * x)  # the planted bug: eager's silu is x * sigmoid(x)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return torch.nn.functional.silu(self.norm(self.linear(x))) * 2


@pytest.fixture
def planted_silu(monkeypatch):
    monkeypatch.setitem(inductor_decomposition.decompositions, aten.silu.default, _wrong_silu)


def test_without_kept_drops_every_overload_of_a_packet_or_one_overload():
    table = {aten.silu.default: 1, aten.silu.out: 2, aten.gelu.default: 3}
    config = CompilerConfig()
    assert without_kept(table, config) == table
    config.fallback.keep_ops = ["aten.silu"]
    assert without_kept(table, config) == {aten.gelu.default: 3}
    config.fallback.keep_ops = ["aten.silu.out"]
    assert without_kept(table, config) == {aten.silu.default: 1, aten.gelu.default: 3}


def test_a_kept_op_runs_as_eager_in_its_own_aten_segment(planted_silu):
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(4, 8)
    expected = model(x)
    config = CompilerConfig()
    planted = airgraph.explain(model, x, config=config)
    compiled = torch.compile(model, backend=airgraph.get_backend(config), fullgraph=True)
    assert not torch.allclose(compiled(x), expected, rtol=1e-4, atol=1e-4)  # the plant is live
    assert all(n.target != "aten.silu.default" for g in planted.graphs for n in g.nodes)
    torch._dynamo.reset()
    config.fallback.keep_ops = ["aten.silu"]
    compiled = torch.compile(model, backend=airgraph.get_backend(config), fullgraph=True)
    torch.testing.assert_close(compiled(x), expected)
    report = airgraph.explain(model, x, config=config)
    (graph,) = report.graphs
    (silu,) = [n for n in graph.nodes if n.target == "aten.silu.default"]
    by_id = {s.id: s for s in graph.segments}
    assert (by_id[silu.segment].backend, by_id[silu.segment].chosen_by) == ("aten", "compare")
    assert by_id[silu.segment].num_nodes == 1
    assert {s.chosen_by for s in graph.segments} == {"compare", "config"}  # its neighbours stay Inductor's
    fallback = next(p for p in graph.passes if p.name == "fallback")
    assert fallback.changed == 1 and "config.fallback.keep_ops" in fallback.details[0]


def test_aten_nodes_name_nodes_of_one_graph_kind():
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(4, 8, requires_grad=True)
    config = CompilerConfig()
    for names, expected in ((["backward:addmm"], {"config"}), (["forward:addmm"], {"config", "compare"})):
        torch._dynamo.reset()
        config.fallback.aten_nodes = names
        (forward,) = [g for g in airgraph.explain(model, x, config=config).graphs if g.kind == "forward"]
        assert {s.chosen_by for s in forward.segments} == expected


def test_the_compile_cache_key_covers_a_decomposition_replaced_at_runtime(monkeypatch, tmp_path):
    before = decomposition_digest()
    monkeypatch.setitem(inductor_decomposition.decompositions, aten.silu.default, _wrong_silu)
    assert decomposition_digest() != before
    monkeypatch.undo()
    assert decomposition_digest() == before
    # and so a compile after the plant is not served the entry compiled before it
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(4, 8)
    config = CompilerConfig()
    config.compile_cache = str(tmp_path)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(torch.compile(model, backend=airgraph.get_backend(config))(x), expected)
        assert any(tmp_path.iterdir())  # an entry was written
        torch._dynamo.reset()
        monkeypatch.setitem(inductor_decomposition.decompositions, aten.silu.default, _wrong_silu)
        planted = torch.compile(model, backend=airgraph.get_backend(config))(x)
    assert not torch.allclose(planted, expected, rtol=1e-4, atol=1e-4)
