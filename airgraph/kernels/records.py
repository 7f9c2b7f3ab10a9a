"""Shape records: what ran, at which shapes, in TorchAir's layout (TorchAir's ``aclnn_static_shape_kernel_outputs``).

::

    <build_dir>/static_kernel_outputs/
      <timestamp>_<pid>_outputs/          one folder per process (created when it first records)
        <pid>/                            one JSON per (operator, shapes) that a static kernel covers
          mm_float32_contiguous_2_16_0.json
        <pid>_debug/                      the same for every operator of the graph: views, host ops included
        static_kernel_<datetime>.zip      the package built from this process's records (kernels/package.py)

A file is named ``<op>_<dtype>_<layout>_<dims>_<index>.json``, from its first tensor input (as TorchAir's
``MatMulV2_float_ND_1_2048_0.json``): the operator's name, dtype, layout (contiguous, channels_last, expanded,
strided), sizes, and an index telling apart records that share the rest of the name. It holds the operator
(``aten.mm.default``), its inputs and outputs (dtype, shape, stride, layout, device), its arguments (tensors as
``{"input": i}``), ``count`` (how often it ran with these shapes in the recorded runs: the first run of each new
shape key, as TorchAir records one run per shape), and for covered operators the segment and its graph key.

Records are statistics, written when a shape key is first seen: atomically (a crashed process leaves complete files
only) but without a flush to disk each (airgraph/store.py ``durable=False``), as a graph writes hundreds.
"""

from __future__ import annotations

import datetime
import json
import operator
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from airgraph.graph.analysis import target_name
from airgraph.kernels.shapes import Bindings, dtype_name, spec
from airgraph.store import write_json_atomic

__all__ = ["FORMAT", "VERSION", "Recorder", "is_view"]

FORMAT = "airgraph-op-record"
VERSION = 1
OUTPUTS = "static_kernel_outputs"


def is_view(node: torch.fx.Node) -> bool:
    """An op returning a view of an argument (no kernel of its own), or an element of a multi-output op."""
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    returns = schema.returns if schema is not None else ()
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _op_type(node: torch.fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return getattr(node.target, "__name__", str(node.target)).strip("_") or "op"


class Recorder:
    """This process's shape records under ``<build_dir>/static_kernel_outputs/``."""

    def __init__(self, build_dir: str | os.PathLike[str]) -> None:
        self.root = Path(build_dir) / OUTPUTS
        self.pid = os.getpid()
        self._outputs: Path | None = None
        self._records: dict[tuple[str, str], dict[str, Any]] = {}  # (folder, signature) -> {"path", "doc"}
        self._indices: dict[tuple[str, str], int] = {}  # (folder, name prefix) -> next index
        self._package: Path | None = None

    @property
    def outputs(self) -> Path:
        """``<timestamp>_<pid>_outputs``, created on first use."""
        if self._outputs is None:
            stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S%f")
            self._outputs = self.root / f"{stamp}_{self.pid}_outputs"
            self._outputs.mkdir(parents=True, exist_ok=True)
        return self._outputs

    @property
    def kernel_dir(self) -> Path:
        return self.outputs / str(self.pid)

    @property
    def debug_dir(self) -> Path:
        return self.outputs / f"{self.pid}_debug"

    def package_path(self) -> Path:
        """``static_kernel_<datetime>.zip``: one per process (its name is fixed when first asked for)."""
        if self._package is None:
            stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S")
            self._package = self.outputs / f"static_kernel_{stamp}.zip"
        return self._package

    def record(
        self,
        nodes: Iterable[torch.fx.Node],
        bindings: Bindings,
        covered: Callable[[torch.fx.Node], dict[str, Any] | None],
    ) -> None:
        """Record every operator of ``nodes`` at the shapes ``bindings`` give: in ``<pid>_debug/``, and those for
        which ``covered(node)`` answers (what a static kernel runs) also in ``<pid>/``, with its answer."""
        dirty: dict[tuple[str, str], None] = {}
        for node in nodes:
            if node.op != "call_function":
                continue
            doc = _describe(node, bindings)
            signature = json.dumps(doc, sort_keys=True, default=str)
            where = covered(node)
            places = [("debug", {})] + ([("kernel", where)] if where is not None and not is_view(node) else [])
            for folder, extra in places:
                key = (folder, signature)
                if key not in self._records:
                    self._records[key] = {"path": self._name(folder, doc), "doc": {**doc, **extra, "count": 0}}
                self._records[key]["doc"]["count"] += 1
                dirty[key] = None
        for key in dirty:
            record = self._records[key]
            write_json_atomic(record["path"], record["doc"], format=FORMAT, version=VERSION, durable=False)

    def _name(self, folder: str, doc: dict[str, Any]) -> Path:
        first = next((s for s in doc["inputs"] if s and "dtype" in s), None)
        if first is None:
            first = next((s for s in doc["outputs"] if s and "dtype" in s), None)
        if first is None:
            dtype, layout, dims = "none", "none", "scalar"
        else:
            dtype, layout = first["dtype"], first["layout"]
            dims = "_".join(str(d) for d in first["shape"]) or "scalar"
        prefix = f"{doc['op_type']}_{dtype}_{layout}_{dims}"
        index = self._indices.get((folder, prefix), 0)
        self._indices[(folder, prefix)] = index + 1
        base = self.kernel_dir if folder == "kernel" else self.debug_dir
        return base / f"{prefix}_{index}.json"


def _describe(node: torch.fx.Node, bindings: Bindings) -> dict[str, Any]:
    """An operator's record (without count): op, inputs, outputs, arguments, at the bound shapes."""
    inputs: list[Any] = []
    positions: dict[torch.fx.Node, int] = {}

    def arg(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            if value not in positions:
                positions[value] = len(inputs)
                inputs.append(spec(value.meta.get("val"), bindings) or {"data_dependent": True})
            return {"input": positions[value]}
        if isinstance(value, (list, tuple)):
            return [arg(v) for v in value]
        if isinstance(value, dict):
            return {k: arg(v) for k, v in value.items()}
        if isinstance(value, torch.dtype):
            return dtype_name(value)
        described = spec(value, bindings)
        return described["value"] if described is not None and "value" in described else repr(value)

    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        names = [a.name for a in schema.arguments]
        args = {names[i] if i < len(names) else str(i): arg(v) for i, v in enumerate(node.args)}
    else:
        args = {str(i): arg(v) for i, v in enumerate(node.args)}
    args.update({k: arg(v) for k, v in node.kwargs.items()})
    val = node.meta.get("val")
    outs = val if isinstance(val, (list, tuple)) else [val]
    return {
        "op": target_name(node),
        "op_type": _op_type(node),
        "inputs": inputs,
        "outputs": [spec(v, bindings) or {"data_dependent": True} for v in outs],
        "args": args,
    }
