"""Dumps: each compared tensor, eager's and compiled, as ``torch.save`` files, with ``index.json`` naming them.

A tensor file holds one plain tensor (on the CPU, contiguous), so it loads with
``torch.load(path, weights_only=True)``. ``index.json`` (``{"version": 1, "tensors": [...]}``) has one entry per
compared value: its name, kind (output, grad, node), graph, node, op, shape, dtype, source (``file:line``), module,
its largest differences, whether it was within the tolerance, and the two file names. Files are written to a
temporary name and renamed, the index last.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from airgraph.precision.locate import Divergence
from airgraph.precision.source import module_path, node_source
from airgraph.precision.tolerance import TensorDiff

__all__ = ["INDEX", "write_dumps"]

INDEX = "index.json"
VERSION = 1


def write_dumps(
    folder: str | os.PathLike[str],
    values: list[tuple[TensorDiff, Any, Any]],
    divergences: list[Divergence],
) -> Path:
    """Write every compared value (``(diff, eager, compiled)`` for outputs and gradients, and each divergence's
    checked values) into ``folder``; returns the index's path."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for diff, eager, compiled in values:
        entries.append(_write(root, len(entries), diff, eager, compiled, {"graph": None, "node": None, "op": None}))
    for div in divergences:
        for checked in div.checked:
            source, _ = node_source(checked.node)
            info = {
                "graph": div.graph,
                "segment": div.segment,
                "node": checked.node.name,
                "op": div.op if checked.node.name == div.node else _op(checked.node),
                "source": source,
                "module": module_path(checked.node),
                "first": checked.node.name == div.node,
            }
            entries.append(_write(root, len(entries), checked.diff, checked.eager, checked.compiled, info))
    index = root / INDEX
    _atomic(index, json.dumps({"version": VERSION, "tensors": entries}, indent=1).encode())
    return index


def _op(node: torch.fx.Node) -> str:
    from airgraph.graph.analysis import target_name

    return target_name(node)


def _write(root: Path, number: int, diff: TensorDiff, eager: Any, compiled: Any, info: dict[str, Any]) -> dict:
    stem = f"{number:04d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', diff.name)[:60]}"
    files = {}
    for which, value in (("eager", eager), ("compiled", compiled)):
        if isinstance(value, torch.Tensor):
            name = f"{stem}.{which}.pt"
            path = root / name
            tmp = path.with_suffix(".tmp")
            torch.save(value.detach().to("cpu").contiguous().clone(), tmp)
            os.replace(tmp, path)
            files[which] = name
    entry = {"name": diff.name, "kind": diff.kind, **info, "shape": list(diff.shape), "dtype": diff.dtype}
    entry.update(max_abs=_number(diff.max_abs), max_rel=_number(diff.max_rel), ok=diff.ok, note=diff.note, files=files)
    entry.setdefault("source", None)
    return entry


def _number(value: float) -> float | str:
    """JSON has no infinity: a value that is not finite is written as a string ("inf", "nan")."""
    return value if math.isfinite(value) else str(value)


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
