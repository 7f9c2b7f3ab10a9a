"""Dumps: each compared tensor, eager's and compiled, as ``torch.save`` files, with ``index.json`` naming them.

A tensor file holds one plain tensor (on the CPU, contiguous), so it loads with
``torch.load(path, weights_only=True)``. ``index.json`` (``{"version": 1, "tensors": [...]}``) has one entry per
compared value: its name, kind (output, grad, node), graph, node, op, shape, dtype, source (``file:line``), module,
its largest differences, whether it was within the tolerance, and the two file names. When the divergence was made
before the kernels (precision/before.py), each output and gradient has a third file, ``original``: the value
compiled without the decomposition or pass found (TorchAir's "original" stage; ``compiled`` is its "optimized"),
and the index's ``before_kernels`` names what was switched off. Files are written to a temporary name and renamed,
the index last.
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
    *,
    original: dict[str, Any] | None = None,
    before: Any = None,
) -> Path:
    """Write every compared value (``(diff, eager, compiled)`` for outputs and gradients, and each divergence's
    checked values) into ``folder``; ``original``: by name, the values compiled without what ``before`` (a
    ``BeforeKernels``) found. Returns the index's path."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for diff, eager, compiled in values:
        info = {"graph": None, "node": None, "op": None}
        stage = (original or {}).get(diff.name)
        entries.append(_write(root, len(entries), diff, eager, compiled, info, stage))
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
    contents: dict[str, Any] = {"version": VERSION, "tensors": entries}
    if before is not None:
        contents["before_kernels"] = before.to_dict()
    _atomic(index, json.dumps(contents, indent=1).encode())
    return index


def _op(node: torch.fx.Node) -> str:
    from airgraph.graph.analysis import target_name

    return target_name(node)


def _write(
    root: Path, number: int, diff: TensorDiff, eager: Any, compiled: Any, info: dict[str, Any], original: Any = None
) -> dict:
    stem = f"{number:04d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', diff.name)[:60]}"
    files = {}
    for which, value in (("eager", eager), ("compiled", compiled), ("original", original)):
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
