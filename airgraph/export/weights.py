"""Writing the model: weights inside the .onnx file, or one external data file per weight.

Weights stay inside the model unless the serialized model would exceed
``config.export.external_weights_threshold`` bytes (default 2 GiB - 200 MiB, under protobuf's 2 GiB
limit). Past it, every initializer that is a parameter, buffer or constant of the captured program, and
every other initializer over :data:`SMALL_TENSOR_BYTES`, is written to its own file in the export's files
folder, named after it (:func:`airgraph.export.layout.weight_file_names`), as ONNX external data (raw
little-endian bytes, offset 0); small folded constants stay inside the model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnxscript import ir

from airgraph.export.layout import ExportLayout, Staging, weight_file_names
from airgraph.export.pbtxt import WeightSummary

__all__ = ["SMALL_TENSOR_BYTES", "WrittenModel", "write_model"]

SMALL_TENSOR_BYTES = 1024
_PROTOBUF_LIMIT = 2**31 - 1


@dataclass
class WrittenModel:
    proto: onnx.ModelProto  # as written (external weights: without their data)
    external: bool
    model_bytes: int
    weight_bytes: int
    summaries: dict[str, WeightSummary] = field(default_factory=dict)


def _tensor_bytes(tensor: ir.TensorProtocol) -> bytes:
    return tensor.tobytes()


def _summary(name: str, tensor: ir.TensorProtocol, data: bytes, file: str) -> WeightSummary:
    dtype = np.dtype(tensor.dtype.numpy()).name
    shape = tuple(int(d) for d in tensor.shape.numpy())
    return WeightSummary(name, dtype, shape, len(data), hashlib.sha256(data).hexdigest(), file)


def write_model(
    model: ir.Model, stage: Staging, layout: ExportLayout, *, threshold: int, program_tensors: set[str]
) -> WrittenModel:
    """Serialize ``model`` into the staging folder as ``layout.model`` (plus weight files when too large)."""
    initializers = {name: v for name, v in model.graph.initializers.items() if v.const_value is not None}
    weight_bytes = sum(v.const_value.nbytes for v in initializers.values())
    data: bytes | None = None
    if weight_bytes <= min(threshold, _PROTOBUF_LIMIT):
        proto = ir.to_proto(model)
        try:
            data = proto.SerializeToString()
        except ValueError:  # over protobuf's 2 GiB
            data = None
        if data is not None and len(data) > threshold:
            data = None
    if data is not None:
        summaries = {
            name: _summary(name, v.const_value, _tensor_bytes(v.const_value), layout.model)
            for name, v in initializers.items()
        }
        stage.path(layout.model).write_bytes(data)
        return WrittenModel(proto, False, len(data), weight_bytes, summaries)

    chosen = [n for n, v in initializers.items() if n in program_tensors or v.const_value.nbytes > SMALL_TENSOR_BYTES]
    files = weight_file_names(chosen, layout.reserved_names())
    summaries = {}
    for name in chosen:
        value = initializers[name]
        tensor = value.const_value
        rel = layout.rel(files[name])
        payload = _tensor_bytes(tensor)
        stage.path(rel).write_bytes(payload)
        summaries[name] = _summary(name, tensor, payload, rel)
        value.const_value = ir.ExternalTensor(
            rel, 0, len(payload), tensor.dtype, shape=tensor.shape, name=name, base_dir=stage.dir
        )
    for name, value in initializers.items():
        if name not in summaries:
            summaries[name] = _summary(name, value.const_value, _tensor_bytes(value.const_value), layout.model)
    proto = ir.to_proto(model)
    data = proto.SerializeToString()
    stage.path(layout.model).write_bytes(data)
    return WrittenModel(proto, True, len(data), weight_bytes, summaries)
