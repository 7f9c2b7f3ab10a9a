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


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(6, 12), torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _run_batches(backend, model, first: torch.Tensor, sim) -> list[tuple[torch.Tensor, torch.Tensor]]:
    run = torch.compile(model, backend=backend, fullgraph=True)
    outputs = []
    with torch.no_grad():
        for x in [first, *(torch.randn(b, 6, generator=torch.Generator().manual_seed(b)) for b in (3, 5, 8, 2, 7))]:
            with sim.call():
                outputs.append((run(x).clone(), model(x)))
    sim.check()
    return outputs


def test_torchairs_dim_gears_capture_as_capture_sizes_do():
    """``tng.inference.set_dim_gears`` (TorchAir's dynamic gears) gives the same graphs, padding and results as
    config.reduce_overhead.capture_sizes with the dimension marked dynamic."""
    from airgraph.runtime.simulated import SimulatedCuda

    model = _Mlp().eval()
    reports = []
    for torchair_names in (True, False):
        torch._dynamo.reset()
        config = CompilerConfig()
        config.mode = "reduce-overhead"
        config.kernel_backend = "aten"
        first = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
        if torchair_names:
            tng.inference.set_dim_gears(first, dim_gears={0: [8, 2, 4]})
        else:
            config.reduce_overhead.capture_sizes = [2, 4, 8]
            torch._dynamo.mark_dynamic(first, 0)
        sim = SimulatedCuda()
        backend = tng.TorchAirBackend(config, runtime=sim)
        for got, want in _run_batches(backend, model, first, sim):
            torch.testing.assert_close(got, want)
        (report,) = backend.reports
        reports.append((report.capture_sizes, report.capture_keys, report.padded_calls, report.padded_rows))
        assert backend.config.reduce_overhead.capture_sizes == (2, 4, 8)
    assert reports[0] == reports[1] and reports[0][0] == [2, 4, 8] and reports[0][2] > 0, reports


def test_dim_gears_on_another_dimension_set_capture_dim():
    from airgraph.runtime.simulated import SimulatedCuda

    class Rows(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * 2  # x: [features, batch]

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    sim = SimulatedCuda()
    backend = tng.TorchAirBackend(config, runtime=sim)
    x = torch.randn(3, 4)
    tng.inference.set_dim_gears(x, dim_gears={1: [4, 8]})
    run = torch.compile(Rows(), backend=backend, fullgraph=True)
    with torch.no_grad():
        for y in (x, torch.randn(3, 6), torch.randn(3, 7)):
            with sim.call():
                torch.testing.assert_close(run(y).clone(), Rows()(y))
    assert backend.config.reduce_overhead.capture_dim == 1
    (report,) = backend.reports
    assert report.capture_sizes == [4, 8] and report.capture_keys == 2 and report.padded_rows == 2 + 1


def test_get_npu_backend_reads_dim_gears_and_refuses_other_sizes():
    import pytest

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    config.reduce_overhead.capture_sizes = [2, 16]
    backend = tng.get_npu_backend(compiler_config=config)
    assert isinstance(backend, tng.TorchAirBackend)
    x = torch.randn(4, 6)
    tng.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as failed:
        torch.compile(_Mlp().eval(), backend=backend, fullgraph=True)(x)
    cause = getattr(failed.value, "inner_exception", None) or failed.value.__cause__
    assert isinstance(cause, ValueError)
    assert "set_dim_gears gives dimension 0 the sizes [2, 4], but config.reduce_overhead has capture_sizes=[2, 16]" in (
        str(cause)
    )


def test_bad_dim_gears_are_refused_naming_the_problem():
    import pytest

    x = torch.randn(4, 6)
    with pytest.raises(ValueError, match=r"airgraph pads one dimension \(the batch\): give one \{dim: \[sizes\]\}"):
        tng.inference.set_dim_gears(x, dim_gears={0: [2, 4], 1: [6]})
    with pytest.raises(ValueError, match=r"dim 2: must be an int in \[0, 1\]"):
        tng.inference.set_dim_gears(x, dim_gears={2: [2, 4]})
    with pytest.raises(ValueError, match=r"gears \[2, 0\] of dim 0: must be a non-empty list of ints >= 1"):
        tng.inference.set_dim_gears(x, dim_gears={0: [2, 0]})
    tng.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    with pytest.raises(ValueError, match=r"already has the gears \{0: \[2, 4\]\}, not \{0: \[8\]\}"):
        tng.inference.set_dim_gears(x, dim_gears={0: [8]})


def test_torchairs_recapture_limit_is_capture_limit():
    import copy

    import pytest

    config = CompilerConfig()
    assert config.debug.aclgraph.static_capture_size_limit == 64
    config.debug.aclgraph.static_capture_size_limit = 9
    assert config.reduce_overhead.capture_limit == 9
    clone = copy.deepcopy(config)
    clone.debug.aclgraph.static_capture_size_limit = 3
    assert clone.reduce_overhead.capture_limit == 3 and config.reduce_overhead.capture_limit == 9
    assert tng.get_npu_backend(compiler_config=config).config.reduce_overhead.capture_limit == 9
    with pytest.raises(ValueError, match=r"reduce_overhead\.capture_limit: invalid value 0"):
        config.debug.aclgraph.static_capture_size_limit = 0
    with pytest.raises(AttributeError, match=r"debug\.aclgraph has no option 'capture_limit'.*reduce_overhead"):
        config.debug.aclgraph.capture_limit = 3
