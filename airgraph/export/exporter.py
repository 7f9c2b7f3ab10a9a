"""``dynamo_export``: capture a model through Dynamo as one graph and write an ONNX export.

Pipeline (each step its own module): layout checks (``layout.py``) -> Dynamo capture with
``torch.export.export(strict=True)`` (``trace.py``) -> eager reference run -> ONNX conversion with
torch's exporter and onnxscript's optimizer (``convert.py``) -> model and weight files (``weights.py``),
``dynamo.pbtxt`` (``pbtxt.py``), reference arrays and ``export.json``, staged and committed atomically.

Invariants:

- parameters and buffers become initializers holding their export-time values; in-place buffer updates stay
  inside the exported step and are not outputs; the eager reference run restores every buffer, so exporting
  does not change the model;
- multi-rank: each rank writes only its own files; with ``auto_atc_config_generated`` rank 0 writes the ATC
  files once every rank succeeded (exchange through the store: ``multirank.py``, ``atc_config.py``);
- when the export returns nothing of it refers to the process group or runs in a thread (``leftovers.py``).

``export.json``'s fields: docs/export.md; the design: docs/design/export-internals.md.
"""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import json
import os
import platform
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import airgraph
from airgraph.config import CompilerConfig
from airgraph.export import trace
from airgraph.export.check import TOLERANCES
from airgraph.export.convert import MODULE_PATH_KEY, describe_values, dynamic_dims, program_tensor_names, to_onnx
from airgraph.export.errors import ExportError
from airgraph.export.layout import FORMAT, FORMAT_VERSION, ExportLayout, Staging, check_export_name
from airgraph.export.leftovers import no_leftovers
from airgraph.export.multirank import distributed_metadata, rank_and_world, write_configs_from_all_ranks
from airgraph.export.pbtxt import render_pbtxt
from airgraph.export.weights import write_model
from airgraph.store import file_digest

__all__ = ["ExportResult", "dynamo_export", "export_model"]

_TRAINING_SENSITIVE = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)
_STATE_NOTE = (
    "buffers are initializers holding their export-time values; in-place buffer updates happen inside the "
    "step but are not outputs, so each call starts from the same state"
)


@dataclass(frozen=True)
class ExportResult:
    """Where an export went: its folder, the files written (relative paths) and its metadata."""

    root: Path
    files: list[str]
    metadata: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.root / self.metadata["model_file"]


def dynamo_export(
    *args: Any,
    model: torch.nn.Module,
    export_path: str | os.PathLike[str] = "export_file",
    export_name: str = "export",
    dynamic: bool = False,
    config: CompilerConfig | None = None,
    **kwargs: Any,
) -> ExportResult:
    """Export ``model`` called on ``(*args, **kwargs)`` as ONNX into ``export_path`` (TorchAir's dynamo_export).

    Writes ``<export_name>.onnx``, ``dynamo.pbtxt``, ``export.json``, reference inputs/outputs and, past
    ``config.export.external_weights_threshold``, one file per weight (layout: airgraph/export/layout.py;
    fields of export.json: this module's docstring). ``dynamic=True`` makes dims 0 and 1 of the tensor
    inputs symbolic where the model allows. Raises :class:`ExportError` (graph break, data-dependent
    control flow, unsupported op, with the user's source line) or :class:`ExportPathError`.

    With torch.distributed initialized this is one rank of a multi-rank export: ``<export_name><rank>.onnx``
    plus ``rank_<rank>/`` (see the module docstring); every rank must call it.
    """
    dist_info = rank_and_world()
    if dist_info is None:
        layout = ExportLayout(Path(export_path), export_name)
        return export_model(model, args, kwargs, layout=layout, dynamic=dynamic, config=config)
    rank, _ = dist_info
    check_export_name(export_name)
    layout = ExportLayout(Path(export_path), export_name, rank)
    config = CompilerConfig() if config is None else config
    result: ExportResult | None = None
    error: BaseException | None = None
    try:
        result = export_model(model, args, kwargs, layout=layout, dynamic=dynamic, config=config)
    except Exception as exc:  # re-raised below, after the other ranks heard of it
        error = exc
    if isinstance(config, CompilerConfig) and config.export.experimental.auto_atc_config_generated:
        written = write_configs_from_all_ranks(layout, None if result is None else result.metadata, error, args, kwargs)
        if result is not None and written:
            result.files.extend(written)
    if error is not None:
        raise error
    assert result is not None
    return result


def export_model(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    layout: ExportLayout,
    dynamic: bool = False,
    config: CompilerConfig | None = None,
) -> ExportResult:
    """:func:`dynamo_export` with an explicit layout (one rank of a multi-rank export passes its own)."""
    config = CompilerConfig() if config is None else config
    if not isinstance(config, CompilerConfig):
        raise ExportError("invalid argument", f"config must be an airgraph CompilerConfig, got {type(config).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise ExportError("invalid argument", f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(dynamic, bool):
        raise ExportError("invalid argument", f"dynamic must be a bool, got {dynamic!r}")
    layout.check_targets()
    if model.training and any(isinstance(m, _TRAINING_SENSITIVE) for m in model.modules()):
        warnings.warn(
            f"dynamo_export: {type(model).__name__} is in training mode and holds dropout or batch norm; "
            "call model.eval() first for an inference export",
            stacklevel=4,
        )
    with no_leftovers():  # Dynamo's globals, default arguments holding the process group, tqdm's monitor
        result = _export(model, args, kwargs, layout, dynamic, config)
    if (result.metadata["distributed"] or {}).get("collectives"):
        # the captured graph of a model with collectives refers to the process group from reference cycles
        # (nodes, Dynamo's variable trackers): free them now, so that destroy_process_group() destroys the
        # group, not whenever the collector next runs, which may be during interpreter finalization
        gc.collect()
    return result


def _export(
    model: torch.nn.Module, args: tuple, kwargs: dict, layout: ExportLayout, dynamic: bool, config: CompilerConfig
) -> ExportResult:
    """The export proper: capture, eager reference run, conversion, files (see the module docstring)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    program, _ = trace.capture(model, args, kwargs, dynamic=dynamic)
    timings["capture"] = time.perf_counter() - start
    tick = time.perf_counter()
    reference = trace.eager_reference(model, args, kwargs)
    timings["eager_reference"] = time.perf_counter() - tick
    tick = time.perf_counter()
    record = config.export.experimental.enable_record_nn_module_stack
    translations = None
    if layout.rank is not None:
        from airgraph.export.collectives import translation_table

        translations = translation_table()
    onnx_model, renamed, passes = to_onnx(
        program,
        args,
        kwargs,
        n_outputs=len(reference.outputs),
        record_module_path=record,
        translations=translations,
    )
    inputs, outputs = describe_values(onnx_model.graph.inputs), describe_values(onnx_model.graph.outputs)
    if len(inputs) != len(reference.inputs):
        raise ExportError(
            "conversion failed", f"the ONNX graph has {len(inputs)} inputs for {len(reference.inputs)} tensors"
        )
    timings["convert"] = time.perf_counter() - tick

    tick = time.perf_counter()
    metadata = _metadata(layout, model, program, onnx_model, inputs, outputs, dynamic, config)
    if layout.rank is not None:
        metadata["distributed"] = distributed_metadata(onnx_model)
    metadata["passes"] = {name: result.changed for name, result in passes.items()}
    metadata["dynamic_dims"] = dynamic_dims(program, renamed, inputs, reference.inputs)
    metadata["pinned_dims"] = _pinned(inputs, reference.inputs) if dynamic else {}
    if dynamic and any(size <= 1 for size in metadata["pinned_dims"].values()):
        warnings.warn(
            f"dynamo_export: dims of size 0 or 1 stay static (torch.export specializes them): "
            f"{metadata['pinned_dims']}; export with sizes >= 2 for dims that should vary",
            stacklevel=5,
        )
    program_tensors = program_tensor_names(program)
    with layout.staging() as stage:
        threshold = config.export.external_weights_threshold
        written = write_model(onnx_model, stage, layout, threshold=threshold, program_tensors=program_tensors)
        metadata["weights"] = {
            "external": written.external,
            "threshold_bytes": threshold,
            "total_bytes": written.weight_bytes,
            "count": len(written.summaries),
            "files": {n: s.file for n, s in written.summaries.items() if s.file != layout.model},
        }
        title = f"airgraph export {layout.name!r}: {metadata['model_class']}, opset {metadata['opset']}"
        stage.path(layout.pbtxt).write_text(render_pbtxt(written.proto, written.summaries, title=title), "utf-8")
        metadata["reference"] = _write_reference(stage, layout, inputs, outputs, reference)
        timings["write"] = time.perf_counter() - tick
        timings["total"] = time.perf_counter() - start
        metadata["timings_s"] = {k: round(v, 4) for k, v in timings.items()}
        metadata["files"] = {
            rel: {"bytes": (stage.dir / rel).stat().st_size, "sha256": file_digest(stage.dir / rel)}
            for rel in stage.files
        }
        stage.path(layout.metadata).write_text(json.dumps(metadata, indent=2) + "\n", "utf-8")
        files = stage.commit()
    return ExportResult(layout.root, files, metadata)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _metadata(
    layout: ExportLayout,
    model: torch.nn.Module,
    program: torch.export.ExportedProgram,
    onnx_model: Any,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    dynamic: bool,
    config: CompilerConfig,
) -> dict[str, Any]:
    opsets = dict(onnx_model.opset_imports)
    mutated = getattr(program.graph_signature, "buffers_to_mutate", {}) or {}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "export_name": layout.name,
        "rank": layout.rank,
        "model_file": layout.model,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "opset": opsets.get(""),
        "opset_imports": opsets,
        "ir_version": onnx_model.ir_version,
        "inputs": inputs,
        "outputs": outputs,
        "dynamic": dynamic,
        "dynamic_dims": {},  # filled by export_model
        "pinned_dims": {},
        "state": {
            "buffers": sorted(name for name, _ in program.named_buffers()),
            "mutated_buffers": sorted(mutated.values()),
            "note": _STATE_NOTE,
        },
        "module_paths": {"recorded": config.export.experimental.enable_record_nn_module_stack, "key": MODULE_PATH_KEY},
        "weights": None,  # filled by export_model from here on
        "reference": None,
        "check_tolerances": {k: list(v) for k, v in TOLERANCES.items()},
        "timings_s": None,
        "config": config.export.as_dict(),
        "versions": {
            "airgraph": airgraph.__version__,
            "torch": torch.__version__,
            "onnx": _version("onnx"),
            "onnxscript": _version("onnxscript"),
            "onnxruntime": _version("onnxruntime"),
            "python": platform.python_version(),
        },
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "files": None,
        "distributed": None,
    }


def _pinned(inputs: list[dict[str, Any]], examples: list[torch.Tensor]) -> dict[str, int]:
    pinned = {}
    for desc, example in zip(inputs, examples, strict=True):
        for axis in trace.DYNAMIC_AXES:
            if axis < example.ndim and isinstance(desc["shape"][axis], int):
                pinned[f"{desc['name']}[{axis}]"] = int(example.shape[axis])
    return pinned


def _write_reference(
    stage: Staging, layout: ExportLayout, inputs: list[dict], outputs: list[dict], reference: trace.Reference
) -> dict[str, Any]:
    arrays = {}
    for side, descs, tensors in (("inputs", inputs, reference.inputs), ("outputs", outputs, reference.outputs)):
        try:
            arrays[side] = {d["name"]: _to_numpy(t) for d, t in zip(descs, tensors, strict=True)}
        except TypeError as exc:
            return {"inputs": None, "outputs": None, "skipped": str(exc)}
    out: dict[str, Any] = {}
    for side, rel in (("inputs", layout.reference_inputs), ("outputs", layout.reference_outputs)):
        with open(stage.path(rel), "wb") as f:
            np.savez(f, **arrays[side])
        out[side] = rel
    return out


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype in (torch.bfloat16, torch.complex32) or (
        tensor.dtype.is_floating_point and tensor.element_size() == 1
    ):
        raise TypeError(f"numpy cannot store {tensor.dtype} reference arrays")
    return tensor.detach().cpu().contiguous().numpy()
