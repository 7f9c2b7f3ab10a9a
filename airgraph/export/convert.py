"""Conversion: ExportedProgram -> ONNX (torch's exporter), optimized, with airgraph's metadata.

- First the program's layout-dependent reshapes get contiguous inputs (``views.py``: torch.onnx retraces
  the program with fake tensors whose strides can disagree, and a ``view`` legal in one trace is refused
  in the next); the program is edited in place.
- ``torch.onnx.export(program, dynamo=True, optimize=False)`` translates the captured graph; then
  onnxscript's optimizer folds constants and shape arithmetic, with the parameters, buffers and constants
  of the program shielded from folding so that every weight stays one initializer named after it (the
  optimizer would otherwise fold ``Transpose(weight)`` into an anonymous ``val_N``).
- Node metadata: torch's exporter writes ``namespace`` and ``pkg.torch.onnx.*`` entries (name scopes,
  class hierarchy, FX node, stack trace) on every node. They are removed; with
  ``config.export.experimental.enable_record_nn_module_stack`` each node gets :data:`MODULE_PATH_KEY`
  instead: the dotted path of the innermost module that ran it (``layers.0.attention.wq``), ``""`` for
  the root module. A node the optimizer created takes the path of a neighbour (its consumer, else producer).
- Dynamic dims get readable names: the symbol first seen at dim 0 of an input is ``batch``, at dim 1
  ``seq`` (``batch_2``, ``seq_2`` for further distinct symbols).
"""

from __future__ import annotations

import ast
import re
from typing import Any, NamedTuple

import numpy as np
import torch
from onnxscript import ir

from airgraph.export.errors import ExportError
from airgraph.export.trace import call_quietly, conversion_error
from airgraph.export.views import contiguous_view_inputs
from airgraph.passes.base import PassResult

__all__ = ["MODULE_PATH_KEY", "Converted", "describe_values", "dynamic_dims", "program_tensor_names", "to_onnx"]

MODULE_PATH_KEY = "module_path"
_TORCH_NODE_KEYS = ("namespace",)
_TORCH_NODE_PREFIX = "pkg.torch."
_AXIS_NAMES = {0: "batch", 1: "seq"}


def output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


class Converted(NamedTuple):
    """What :func:`to_onnx` made: the optimized model, the renaming of its dynamic dims, and what the passes
    run on the program before conversion changed (``{pass name: PassResult}``)."""

    model: ir.Model
    renamed: dict[str, str]
    passes: dict[str, PassResult]


def to_onnx(
    program: torch.export.ExportedProgram,
    args: tuple,
    kwargs: dict,
    *,
    n_outputs: int,
    record_module_path: bool,
    translations: dict[Any, Any] | None = None,
) -> Converted:
    """The optimized ONNX model (onnx_ir) of a captured program, and the renaming of its dynamic dims.

    ``translations`` is torch.onnx's ``custom_translation_table`` (the collectives, ``collectives.py``).
    """
    names = output_names(n_outputs)
    passes = {"contiguous_view_inputs": contiguous_view_inputs(program.graph_module)}

    def convert() -> Any:
        return torch.onnx.export(
            program,
            args,
            kwargs=kwargs,
            dynamo=True,
            optimize=False,
            verbose=False,
            output_names=names,
            custom_translation_table=translations,
        )

    try:
        onnx_program = call_quietly(convert)
    except Exception as exc:
        raise conversion_error(exc, program) from exc
    model: ir.Model = onnx_program.model
    if len(model.graph.outputs) != n_outputs:
        raise ExportError(
            "conversion failed", f"the ONNX graph has {len(model.graph.outputs)} outputs, eager returned {n_outputs}"
        )
    _concrete_dims(model)
    _optimize_keeping_weights(model, program_tensor_names(program))
    _set_module_paths(model, record_module_path)
    mapping = _axis_names(model)
    if mapping and hasattr(onnx_program, "rename_axes"):  # torch >= 2.8
        onnx_program.rename_axes(mapping)
    else:
        mapping = {}
    return Converted(model, mapping, passes)


def _concrete_dims(model: ir.Model) -> None:
    """Dims torch marked dynamic but then specialized come out as symbols named "2": make them ints."""

    def fix(value: ir.Value) -> None:
        shape = value.shape
        if shape is not None and any(isinstance(d, ir.SymbolicDim) and str(d.value).isdigit() for d in shape):
            dims = [int(d.value) if isinstance(d, ir.SymbolicDim) and str(d.value).isdigit() else d for d in shape]
            value.shape = ir.Shape(dims)

    for value in [*model.graph.inputs, *model.graph.outputs]:
        fix(value)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            fix(value)


def program_tensor_names(program: torch.export.ExportedProgram) -> set[str]:
    """Names of the program's parameters, buffers and lifted constants (its initializers in ONNX)."""
    names = {name for name, _ in program.named_parameters()}
    names |= {name for name, _ in program.named_buffers()}
    return names | set(program.constants)


def _optimize_keeping_weights(model: ir.Model, protected: set[str]) -> None:
    """onnxscript's optimizer, with the program's tensors hidden from constant folding."""
    import onnxscript.optimizer

    hidden = {}
    for name, value in model.graph.initializers.items():
        if name in protected and value.const_value is not None:
            hidden[name] = value.const_value
            value.const_value = None
    try:
        call_quietly(lambda: onnxscript.optimizer.optimize(model))
    except Exception as exc:
        raise ExportError("conversion failed", f"onnxscript's optimizer failed: {exc}") from exc
    finally:
        for name, tensor in hidden.items():
            value = model.graph.initializers.get(name)
            if value is not None:
                value.const_value = tensor


def _scope_path(node: ir.Node) -> str | None:
    """The innermost module path of a node from torch's ``pkg.torch.onnx.name_scopes``, or None."""
    raw = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if raw is None:
        return None
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2:
        return ""
    path = str(scopes[-2])
    return "" if path.startswith("_empty_nn_module_stack") else path


def _set_module_paths(model: ir.Model, record: bool) -> None:
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    paths = {id(node): _scope_path(node) for node in nodes}
    for node in nodes:
        for key in [k for k in node.metadata_props if k.startswith(_TORCH_NODE_PREFIX) or k in _TORCH_NODE_KEYS]:
            del node.metadata_props[key]
    if not record:
        return
    for _ in range(len(nodes)):  # fill nodes the optimizer created from their neighbours
        missing = [n for n in nodes if paths[id(n)] is None]
        if not missing:
            break
        changed = False
        for node in missing:
            near = [*node.successors(), *node.predecessors()]
            found = next((paths[id(n)] for n in near if paths.get(id(n)) is not None), None)
            if found is not None:
                paths[id(node)], changed = found, True
        if not changed:
            break
    for node in nodes:
        node.metadata_props[MODULE_PATH_KEY] = paths[id(node)] or ""


def _axis_names(model: ir.Model) -> dict[str, str]:
    mapping: dict[str, str] = {}
    used: set[str] = set()
    for value in model.graph.inputs:
        if value.shape is None:
            continue
        for axis, base in _AXIS_NAMES.items():
            if axis >= len(value.shape):
                continue
            dim = value.shape[axis]
            symbol = dim.value if isinstance(dim, ir.SymbolicDim) else None
            if not isinstance(symbol, str) or not symbol.isidentifier() or symbol in mapping:
                continue
            name, n = base, 1
            while name in used:
                n += 1
                name = f"{base}_{n}"
            mapping[symbol], used = name, used | {name}
    return mapping


def describe_values(values: Any) -> list[dict[str, Any]]:
    """``[{"name", "dtype", "shape"}]`` of graph inputs or outputs; a symbolic dim is its name (str)."""
    out = []
    for value in values:
        shape: list[int | str | None] = []
        for dim in value.shape or ():
            if isinstance(dim, int):
                shape.append(dim)
            else:
                shape.append(None if dim.value is None else str(dim.value))
        dtype = np.dtype(value.dtype.numpy()).name if value.dtype is not None else None
        out.append({"name": value.name, "dtype": dtype, "shape": shape})
    return out


def dynamic_dims(
    program: torch.export.ExportedProgram,
    renamed: dict[str, str],
    inputs: list[dict[str, Any]],
    examples: list[torch.Tensor],
) -> dict[str, dict[str, Any]]:
    """``{name: {"min", "max", "example", "axes"}}`` for each symbolic dim of the inputs.

    min/max come from torch.export's range constraints (None: unbounded); sizes 0 and 1 fall outside them
    because of torch's 0/1 specialization, though the graph usually runs at them too.
    """
    ranges = {renamed.get(str(sym), str(sym)): vr for sym, vr in program.range_constraints.items()}
    out: dict[str, dict[str, Any]] = {}
    for desc, example in zip(inputs, examples, strict=True):
        for axis, dim in enumerate(desc["shape"]):
            if not isinstance(dim, str):
                continue
            entry = out.setdefault(dim, {"min": None, "max": None, "example": int(example.shape[axis]), "axes": []})
            entry["axes"].append(f"{desc['name']}[{axis}]")
            if dim in ranges:
                entry["min"], entry["max"] = _bound(ranges[dim].lower), _bound(ranges[dim].upper)
    return out


def _bound(value: Any) -> int | None:
    if re.fullmatch(r"-?(int_)?oo", str(value)):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None
