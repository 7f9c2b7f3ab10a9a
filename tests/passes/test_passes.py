"""The pass pipeline's passes on hand-made ATen graphs."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airgraph.config import CompilerConfig
from airgraph.passes import PIPELINE, CompileContext, run_pipeline
from airgraph.passes.dce import dead_code_elimination
from airgraph.passes.remove_noops import remove_noops
from airgraph.report.schema import GraphReport

aten = torch.ops.aten


def context(config: CompilerConfig | None = None) -> CompileContext:
    config = config or CompilerConfig()
    report = GraphReport(id=0, mode=config.mode, kind="inference", device="cpu")
    return CompileContext(config=config, report=report, kind="inference", device=torch.device("cpu"))


def targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def trace(fn, *args) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def test_every_pass_has_a_config_switch():
    switches = CompilerConfig().passes.as_dict()
    assert [name for name, _ in PIPELINE] == [
        "streams",
        "concat_linear",
        "host_placement",
        "remove_noops",
        "dead_code_elimination",
        "fallback",
    ]
    assert all(name in switches for name, _ in PIPELINE)


def test_dce_removes_dead_chains_but_keeps_mutations_and_random_ops():
    def fn(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        dead = torch.cos(torch.sin(x))  # dead chain
        torch.rand(3)  # dead but random: removing it would shift the RNG stream
        buf.add_(1)  # result unused but a mutation
        del dead
        return x * 2

    gm = trace(fn, torch.randn(3), torch.zeros(3))
    result = dead_code_elimination(gm, context())
    remaining = targets(gm)
    assert aten.sin.default not in remaining and aten.cos.default not in remaining
    assert aten.rand.default in remaining and aten.add_.Tensor in remaining
    assert result.changed == 2
    assert sorted(line.split(" = ")[1] for line in result.details) == ["aten.cos.default", "aten.sin.default"]


def test_remove_noops_replaces_identities_and_keeps_real_work():
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x.view(4, 3) + 0  # both no-ops
        b = a[:, 0:3] * 1.0  # full slice and *1: no-ops
        c = b.permute(0, 1).clone()  # identity permute, clone: no-ops
        d = c.view(12)  # real reshape
        return d * 2 + 1  # real arithmetic

    x = torch.randn(4, 3)
    gm = trace(fn, x)
    result = remove_noops(gm, context())
    dead_code_elimination(gm, context())
    gm.recompile()
    remaining = targets(gm)
    assert remaining.count(aten.view.default) == 1  # only the real reshape
    assert aten.permute.default not in remaining and aten.clone.default not in remaining
    assert aten.slice.Tensor not in remaining
    assert result.changed == 6
    torch.testing.assert_close(gm(x), fn(x))


def test_remove_noops_keeps_copies_of_mutated_values_and_outputs():
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.clone()
        y.add_(1)  # the clone protects x: must stay
        return y, x + 0  # a graph output: must stay (output aliasing is fixed)

    x = torch.randn(3)
    gm = trace(fn, x)
    result = remove_noops(gm, context())
    assert result.changed == 0
    out = gm(x.clone())
    torch.testing.assert_close(out[0], x + 1)


def test_remove_noops_keeps_dtype_changing_identities():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x + 0).to(torch.float64) * 2  # int + 0 stays int (no-op), to() changes dtype (kept)

    x = torch.arange(4)
    gm = trace(fn, x)
    remove_noops(gm, context())
    assert aten._to_copy.default in targets(gm)
    torch.testing.assert_close(gm(x), fn(x))


def test_pipeline_honours_switches_and_reports(tmp_path):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x.view(3)) + 0

    config = CompilerConfig()
    config.passes.dead_code_elimination = False
    config.debug.graph_dump = str(tmp_path)
    gm = trace(fn, torch.randn(3))
    reports = run_pipeline(gm, context(config))
    by_name = {r.name: r for r in reports}
    assert by_name["dead_code_elimination"].enabled is False and by_name["dead_code_elimination"].changed == 0
    assert by_name["remove_noops"].changed == 1  # the view; "+ 0" is the graph output and stays
    assert (tmp_path / "graph_0_inference" / "04_remove_noops.txt").exists()
