"""A TorchAir-style script runs with airgraph after changing only its imports (and device)."""

import torch

from airgraph.backend import AirgraphBackend
from airgraph.compat import torchair as tng
from airgraph.compat.torchair import CompilerConfig


def test_torchair_names_compile_and_match_eager():
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.mm(x, y) + torch.add(x, y)

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    backend = tng.get_npu_backend(compiler_config=config)
    assert isinstance(backend, AirgraphBackend) and backend.config.mode == "reduce-overhead"
    model = torch.compile(Model(), backend=backend, dynamic=False, fullgraph=True)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(model(x, y), Model()(x, y))
    assert len(backend.reports) == 1
    assert tng.CompilerConfig is CompilerConfig and isinstance(tng.get_compiler(config), AirgraphBackend)
