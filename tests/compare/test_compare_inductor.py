"""With Inductor kernels, a divergence inside a fused kernel is found at its node (an Inductor lowering planted
wrong for the test: exp computed as exp * 1.01, fused with its neighbours)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import airgraph
from tests.helpers import make_config

aten = torch.ops.aten


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x).tanh() * 0.5
        return torch.exp(h) * 2 + h  # the planted node


_LINES = Path(__file__).read_text().splitlines()
EXP_LINE = f"{__file__}:{next(i for i, line in enumerate(_LINES, 1) if '# the planted node' in line)}"


@pytest.mark.slow
def test_a_fused_kernels_divergence_is_found_at_its_node(monkeypatch):
    from torch._inductor import config as inductor_config
    from torch._inductor import lowering

    exp, mul = lowering.lowerings[aten.exp.default], lowering.lowerings[aten.mul.Tensor]
    monkeypatch.setitem(lowering.lowerings, aten.exp.default, lambda x: mul(exp(x), 1.01))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        report = airgraph.compare(Model(), x, config=make_config(kernel_backend="inductor"))
    assert not report.ok
    first = report.first
    assert (first.op, first.source, first.backend) == ("aten.exp.default", EXP_LINE, "inductor")
    assert first.max_rel == pytest.approx(0.01, rel=1e-3)


@pytest.mark.slow
def test_a_static_kernels_divergence_is_found_in_a_fresh_and_a_warm_library(monkeypatch, tmp_path):
    """The planted lowering is built into the static kernels of the first compare, which installs them; the second
    compare, on the same library, would warm-start on them (no ATen graph); compare traces it instead and finds the
    node in the installed kernel's segment."""
    from torch._inductor import config as inductor_config
    from torch._inductor import lowering

    exp, mul = lowering.lowerings[aten.exp.default], lowering.lowerings[aten.mul.Tensor]
    monkeypatch.setitem(lowering.lowerings, aten.exp.default, lambda x: mul(exp(x), 1.01))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    config = make_config(
        kernel_backend="inductor", **{"static_kernels.enabled": True, "static_kernels.build_dir": str(tmp_path)}
    )
    for run in ("builds", "installed"):
        with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
            report = airgraph.compare(Model(), x, config=config)
        assert not report.ok, run
        first = report.first
        assert (first.op, first.source, first.chosen_by) == ("aten.exp.default", EXP_LINE, "static_kernels"), run
        assert first.max_rel == pytest.approx(0.01, rel=1e-3), run
