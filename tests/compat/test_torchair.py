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


def test_torchair_static_kernel_names_set_airgraph_options(tmp_path):
    import copy

    import pytest

    config = CompilerConfig()
    config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
    config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(tmp_path)
    assert config.static_kernels.enabled is True and config.static_kernels.build_dir == str(tmp_path)
    assert config.experimental_config.aclgraph._aclnn_static_shape_kernel is True
    backend = tng.get_npu_backend(compiler_config=config)
    assert backend.static_kernels is not None and backend.static_kernels.build_dir == tmp_path.resolve()
    clone = copy.deepcopy(config)  # the names follow the copy, not the original
    clone.experimental_config.aclgraph._aclnn_static_shape_kernel = False
    assert clone.static_kernels.enabled is False and config.static_kernels.enabled is True
    with pytest.raises(ValueError, match=r"static_kernels\.enabled: invalid value 'on'"):
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = "on"
    with pytest.raises(AttributeError, match="has no option '_aclnn_static_shape_kernel_dir'"):
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_dir = "/x"


def test_a_copy_of_a_torchair_config_keeps_its_aoe_config_file(tmp_path):
    import copy
    import json

    ops_file = tmp_path / "ops.json"
    ops_file.write_text(json.dumps({"tune_ops_type": ["addmm"], "tune_ops_name": []}))
    config = CompilerConfig()
    config.aoe_config.aoe_config_file = str(ops_file)
    clone = copy.deepcopy(config)
    assert clone.aoe_config.aoe_config_file == str(ops_file) and list(clone.tuning.ops) == ["addmm"]
    clone.aoe_config.aoe_config_file = None  # the copy's own: the original keeps its file
    assert config.aoe_config.aoe_config_file == str(ops_file) and list(config.tuning.ops) == ["addmm"]
    assert clone.aoe_config.aoe_config_file is None and clone.tuning.ops is None
