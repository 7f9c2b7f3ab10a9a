"""TorchAir's names for airgraph's features, so a TorchAir script runs after changing imports and device.

# import torchair as tng                        ->  from airgraph.compat import torchair as tng
# from torchair.configs.compiler_config import CompilerConfig
from airgraph.compat.torchair import CompilerConfig, get_npu_backend

config = CompilerConfig()
config.mode = "reduce-overhead"
backend = get_npu_backend(compiler_config=config)
model = torch.compile(model, backend=backend, fullgraph=True)   # .npu() -> .cuda()

tng.dynamo_export(x, y, model=model, dynamic=False)  # export_file/export.onnx (ONNX, not AIR)

with tng.scope.npu_stream_switch("1"):                # in-graph multi-stream
    tng.ops.npu_tagged_event_wait(event)

config.experimental_config.aclgraph._aclnn_static_shape_kernel = True             # static kernels (airgraph/kernels):
config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = "/path"  # config.static_kernels.*
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

from airgraph import dynamo_export
from airgraph import ops as _ops
from airgraph import scope as _scope
from airgraph.backend import AirgraphBackend, get_backend
from airgraph.config import CompilerConfig as _CompilerConfig
from airgraph.config import ExperimentalConfig as _ExperimentalConfig

__all__ = ["CompilerConfig", "dynamo_export", "get_compiler", "get_npu_backend", "ops", "scope"]

# tng.scope.npu_stream_switch(tag, priority) and the tagged-event ops, under TorchAir's names.
scope = SimpleNamespace(npu_stream_switch=_scope.stream_switch)
ops = SimpleNamespace(
    npu_create_tagged_event=_ops.create_tagged_event,
    npu_tagged_event_record=_ops.tagged_event_record,
    npu_tagged_event_wait=_ops.tagged_event_wait,
    npu_record_tagged_stream=_ops.record_tagged_stream,
)


class _AclGraph:
    """TorchAir's ``experimental_config.aclgraph``: its static-kernel names, read and written through to
    ``config.static_kernels`` (validated there), so the configuration has one value for each."""

    NAMES: ClassVar[dict[str, str]] = {
        "_aclnn_static_shape_kernel": "enabled",
        "_aclnn_static_shape_kernel_build_dir": "build_dir",
    }

    def __init__(self, root: _CompilerConfig) -> None:
        object.__setattr__(self, "_root", root)

    def __getattr__(self, name: str) -> object:
        if name in _AclGraph.NAMES:
            return getattr(self._root.static_kernels, _AclGraph.NAMES[name])
        raise AttributeError(self._unknown(name))

    def __setattr__(self, name: str, value: object) -> None:
        if name not in _AclGraph.NAMES:
            raise AttributeError(self._unknown(name))
        setattr(self._root.static_kernels, _AclGraph.NAMES[name], value)

    @staticmethod
    def _unknown(name: str) -> str:
        return (
            f"experimental_config.aclgraph has no option {name!r} in airgraph; known: {', '.join(_AclGraph.NAMES)} "
            "(they set config.static_kernels.enabled and .build_dir)"
        )


class _TorchAirExperimentalConfig(_ExperimentalConfig):
    @property
    def aclgraph(self) -> _AclGraph:
        return _AclGraph(object.__getattribute__(self, "_root"))


class CompilerConfig(_CompilerConfig):
    """airgraph's CompilerConfig, also answering to TorchAir's names (``experimental_config.aclgraph...``)."""

    experimental_config = _TorchAirExperimentalConfig

    def __init__(self, path: str | None = None) -> None:
        super().__init__(path)
        object.__setattr__(self.experimental_config, "_root", self)

    def __deepcopy__(self, memo: dict) -> CompilerConfig:
        new = super().__deepcopy__(memo)
        object.__setattr__(new.experimental_config, "_root", new)
        return new  # type: ignore[return-value]


def get_npu_backend(*, compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_npu_backend``: the airgraph backend for CUDA (or the CPU)."""
    return get_backend(compiler_config)


def get_compiler(compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_compiler``; airgraph has one object for both roles."""
    return get_backend(compiler_config)
