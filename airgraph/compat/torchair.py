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
"""

from __future__ import annotations

from types import SimpleNamespace

from airgraph import dynamo_export
from airgraph import ops as _ops
from airgraph import scope as _scope
from airgraph.backend import AirgraphBackend, get_backend
from airgraph.config import CompilerConfig

__all__ = ["CompilerConfig", "dynamo_export", "get_compiler", "get_npu_backend", "ops", "scope"]

# tng.scope.npu_stream_switch(tag, priority) and the tagged-event ops, under TorchAir's names.
scope = SimpleNamespace(npu_stream_switch=_scope.stream_switch)
ops = SimpleNamespace(
    npu_create_tagged_event=_ops.create_tagged_event,
    npu_tagged_event_record=_ops.tagged_event_record,
    npu_tagged_event_wait=_ops.tagged_event_wait,
    npu_record_tagged_stream=_ops.record_tagged_stream,
)


def get_npu_backend(*, compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_npu_backend``: the airgraph backend for CUDA (or the CPU)."""
    return get_backend(compiler_config)


def get_compiler(compiler_config: CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_compiler``; airgraph has one object for both roles."""
    return get_backend(compiler_config)
