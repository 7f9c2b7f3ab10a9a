"""Offline export: ``dynamo_export`` writes an ONNX model that onnxruntime runs without PyTorch.

Importing this package imports neither torch nor onnx: ``dynamo_export`` (exporter.py, which needs torch,
onnx and onnxscript) loads on first use, and ``airgraph.export.runner`` (numpy and onnxruntime only)
runs an export in a process that never imports torch.

Modules, in the order the data flows: ``layout`` (file names, atomic commit), ``capture`` (Dynamo
capture, errors), ``collectives`` (torch collectives -> com.microsoft AllReduce/AllGather), ``convert``
(torch.onnx, optimizer, module paths), ``weights`` (inline or external weights), ``pbtxt`` (readable graph),
``exporter`` (``dynamo_export``, export.json, multi-rank), ``atc_config`` (TorchAir's deployment JSON files),
``runner`` (torch-free onnxruntime runner; launches mpiexec for multi-rank exports), ``mpi_runner`` (one rank:
onnxruntime stages between collectives served by mpi4py).
"""

from __future__ import annotations

import importlib
from typing import Any

from airgraph.export.errors import ExportError, ExportPathError
from airgraph.export.layout import ExportLayout

__all__ = ["ExportError", "ExportLayout", "ExportPathError", "ExportResult", "dynamo_export", "export_model"]

_LAZY = {
    "dynamo_export": "airgraph.export.exporter",
    "export_model": "airgraph.export.exporter",
    "ExportResult": "airgraph.export.exporter",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'airgraph.export' has no attribute {name!r}")
