"""``dynamo.pbtxt``: the exported ModelProto in protobuf text format, readable, weights summarized.

The file parses back into ``onnx.ModelProto`` with ``google.protobuf.text_format.Parse`` (its header lines
are ``#`` comments). Every initializer keeps its name, ``data_type``, ``dims`` and, for external weights,
its ``external_data`` entries (location, offset, length) and ``data_location: EXTERNAL``; its data fields
are emptied and its ``doc_string`` reads::

    airgraph summary: float32[32, 32], 4096 bytes, sha256 <hex>; data in layers.0.attention.wq.weight

(``data in <export_name>.onnx`` for weights stored inside the model). Tensors in node attributes
(``Constant`` values) larger than :data:`INLINE_LIMIT` bytes are summarized the same way; smaller ones
(shape vectors, scalars) are printed as they are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import onnx
from google.protobuf import text_format

__all__ = ["INLINE_LIMIT", "WeightSummary", "render_pbtxt"]

INLINE_LIMIT = 64
_DATA_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)


@dataclass(frozen=True)
class WeightSummary:
    """What the pbtxt and export.json say about one initializer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    sha256: str
    file: str  # relative path of the file holding its data (the model itself when inline)

    def describe(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"airgraph summary: {self.dtype}[{dims}], {self.bytes} bytes, sha256 {self.sha256}; data in {self.file}"


def _dtype_name(data_type: int) -> str:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(data_type).lower()


def _summarize_attribute_tensor(tensor: onnx.TensorProto, where: str) -> None:
    raw = tensor.raw_data if tensor.HasField("raw_data") else None
    if raw is None:
        raw = onnx.numpy_helper.to_array(tensor).tobytes()
    if len(raw) <= INLINE_LIMIT:
        return
    summary = WeightSummary(
        tensor.name or where,
        _dtype_name(tensor.data_type),
        tuple(tensor.dims),
        len(raw),
        hashlib.sha256(raw).hexdigest(),
        f"{where} (node attribute)",
    )
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    tensor.doc_string = summary.describe()


def _walk_graph(graph: onnx.GraphProto, model_file: str) -> None:
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                _summarize_attribute_tensor(attr.t, model_file)
            for tensor in attr.tensors:
                _summarize_attribute_tensor(tensor, model_file)
            if attr.HasField("g"):
                _walk_graph(attr.g, model_file)
            for sub in attr.graphs:
                _walk_graph(sub, model_file)


def render_pbtxt(proto: onnx.ModelProto, summaries: dict[str, WeightSummary], *, title: str) -> str:
    """The pbtxt text. Empties the tensor data of ``proto`` in place (the caller has serialized it already)."""
    for tensor in proto.graph.initializer:
        summary = summaries.get(tensor.name)
        for field in _DATA_FIELDS:
            tensor.ClearField(field)
        if summary is not None:
            tensor.doc_string = summary.describe()
    _walk_graph(proto.graph, "the model")
    for function in proto.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    _summarize_attribute_tensor(attr.t, "the model")
    header = (
        f"# {title}\n"
        "# ONNX ModelProto in protobuf text format (google.protobuf.text_format); tensor data is summarized\n"
        "# in each initializer's doc_string (dtype, shape, bytes, sha256, file), not dumped.\n"
    )
    return header + text_format.MessageToString(proto)
