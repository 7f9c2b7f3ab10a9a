"""What an export holds and how its outputs are checked, shared by the runner (runner.py) and the MPI rank
worker (mpi_runner.py). Imports only the standard library, numpy and the torch-free layout and store."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airgraph.export.layout import FORMAT, FORMAT_VERSION, METADATA_FILE, rank_metadata_files
from airgraph.store import file_digest, write_bytes_atomic

__all__ = [
    "TOLERANCES",
    "ExportInfo",
    "RunError",
    "check_inputs",
    "check_outputs",
    "compare",
    "describe",
    "load_export",
    "multi_rank_world",
    "read_npz",
    "reference",
    "save_npz",
]

# (rtol, atol) per output dtype for --check; integer and bool outputs must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


class RunError(Exception):
    """An export that cannot be run as asked (missing files, wrong inputs, bad options): exit code 2."""


@dataclass(frozen=True)
class ExportInfo:
    """A loaded export: its folder and its ``export.json``."""

    root: Path
    metadata: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.root / self.metadata["model_file"]

    def path(self, rel: str) -> Path:
        return self.root / rel


def multi_rank_world(export_dir: str | os.PathLike[str]) -> int | None:
    """The world size of a multi-rank export in ``export_dir`` (None: a single-process export or none).

    Raises :class:`RunError` if a rank's ``rank_<r>/export.json`` is missing (an incomplete export).
    """
    root = Path(export_dir)
    _check_dir(root)
    if (root / METADATA_FILE).is_file():
        return None
    metas = rank_metadata_files(root)
    if not metas:
        return None
    try:
        first = json.loads(next(iter(metas.values())).read_text(encoding="utf-8"))
        world = int(first["distributed"]["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunError(
            f"{root}: a rank's {METADATA_FILE} is unreadable or has no distributed.world_size: {exc}"
        ) from None
    missing = [r for r in range(world) if r not in metas]
    if missing:
        raise RunError(f"{root}: incomplete multi-rank export: no rank_<r>/{METADATA_FILE} for ranks {missing}")
    return world


def _check_dir(root: Path) -> None:
    if not root.exists():
        raise RunError(f"{root}: no such directory; give the export_path an export was written to")
    if not root.is_dir():
        raise RunError(f"{root}: not a directory; give the export_path an export was written to")


def load_export(export_dir: str | os.PathLike[str], rank: int | None = None) -> ExportInfo:
    """Read ``EXPORT_DIR/export.json`` (``rank_<rank>/export.json`` with a rank) and check the files it lists."""
    root = Path(export_dir)
    _check_dir(root)
    meta_path = root / METADATA_FILE if rank is None else root / f"rank_{rank}" / METADATA_FILE
    if not meta_path.is_file():
        if rank is None and rank_metadata_files(root):
            raise RunError(f"{root} holds a multi-rank export; run it with `airgraph run` (one process per rank)")
        raise RunError(f"{meta_path}: missing: not an airgraph export, or an incomplete one")
    try:
        metadata = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"{meta_path}: unreadable: {exc}") from None
    if metadata.get("format") != FORMAT or not isinstance(metadata.get("format_version"), int):
        raise RunError(f"{meta_path}: not an airgraph export (format {metadata.get('format')!r})")
    if metadata["format_version"] > FORMAT_VERSION:
        raise RunError(f"{meta_path}: format version {metadata['format_version']} is newer than this runner's")
    info = ExportInfo(root, metadata)
    for rel, entry in metadata.get("files", {}).items():
        path = info.path(rel)
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            raise RunError(f"{path}: missing or not the size export.json records ({entry['bytes']} bytes)")
    return info


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: cannot read as .npz: {exc}") from None


def check_inputs(info: ExportInfo, feeds: dict[str, np.ndarray]) -> list[str]:
    """Raise :class:`RunError` if ``feeds`` do not fit the model's inputs; return warnings."""
    specs = info.metadata["inputs"]
    names = [s["name"] for s in specs]
    missing, extra = [n for n in names if n not in feeds], [n for n in feeds if n not in names]
    if missing or extra:
        raise RunError(f"inputs: missing {missing}, unexpected {extra}; the model takes {names}")
    sizes: dict[str, tuple[int, str]] = {}
    warnings = []
    for spec in specs:
        array, name = feeds[spec["name"]], spec["name"]
        if array.dtype.name != spec["dtype"]:
            raise RunError(f"input {name!r}: dtype {array.dtype.name}, the model takes {spec['dtype']}")
        if array.ndim != len(spec["shape"]):
            raise RunError(f"input {name!r}: shape {list(array.shape)}, the model takes {spec['shape']}")
        for axis, (size, dim) in enumerate(zip(array.shape, spec["shape"], strict=True)):
            where = f"{name}[{axis}]"
            if isinstance(dim, int) and size != dim:
                raise RunError(f"input {name!r}: shape {list(array.shape)}, the model takes {spec['shape']}")
            if isinstance(dim, str):
                if dim in sizes and sizes[dim][0] != size:
                    raise RunError(f"dynamic dim {dim!r}: {where} is {size} but {sizes[dim][1]} is {sizes[dim][0]}")
                sizes[dim] = (size, where)
    for dim, (size, where) in sizes.items():
        high = info.metadata.get("dynamic_dims", {}).get(dim, {}).get("max")
        if high is not None and size > high:
            warnings.append(
                f"dynamic dim {dim!r} = {size} ({where}) is above the range torch.export validated (max {high})"
            )
    return warnings


def reference(info: ExportInfo, which: str) -> dict[str, np.ndarray]:
    """The reference ``"inputs"`` or ``"outputs"`` saved at export."""
    rel = (info.metadata.get("reference") or {}).get(which)
    if rel is None:
        reason = (info.metadata.get("reference") or {}).get("skipped", "none was saved")
        raise RunError(f"no reference {which} in this export ({reason})")
    return read_npz(info.path(rel))


def compare(
    outputs: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[dict[str, Any]]:
    """One record per expected output: name, ok, max_abs_diff, rtol, atol, and a reason when not ok."""
    records = []
    for name, want in expected.items():
        got = outputs.get(name)
        default = TOLERANCES.get(want.dtype.name, (0.0, 0.0))
        r, a = default[0] if rtol is None else rtol, default[1] if atol is None else atol
        record: dict[str, Any] = {"name": name, "ok": False, "max_abs_diff": None, "rtol": r, "atol": a}
        if got is None:
            record["reason"] = "no such output"
        elif got.shape != want.shape or got.dtype != want.dtype:
            record["reason"] = f"got {got.dtype.name}{list(got.shape)}, expected {want.dtype.name}{list(want.shape)}"
        else:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            record["max_abs_diff"] = float(diff.max()) if diff.size else 0.0
            record["ok"] = bool(np.allclose(got, want, rtol=r, atol=a, equal_nan=True))
            if not record["ok"]:
                record["reason"] = f"max abs diff {record['max_abs_diff']:.3g} beyond rtol={r:g}, atol={a:g}"
        records.append(record)
    return records


def save_npz(arrays: dict[str, np.ndarray], path: str) -> None:
    """One array per name, written atomically (airgraph/store.py)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(path, buffer.getvalue())


def describe(array: np.ndarray) -> str:
    """``float32[2, 3]``."""
    return f"{array.dtype.name}[{', '.join(str(d) for d in array.shape)}]"


def check_outputs(
    info: Any,
    outputs: dict[str, np.ndarray],
    expected_path: str | None,
    *,
    rtol: float | None,
    atol: float | None,
    say: Callable[[str], Any],
) -> int:
    """``--check``: the export's files still hash as written, and ``outputs`` match the expected outputs
    (``expected_path``, else the reference saved at export). Says one line per failure, or one ok line;
    returns the exit code (0 or 1). Shared by the single-process and the MPI runner."""
    for rel, entry in info.metadata.get("files", {}).items():
        if file_digest(info.path(rel)) != entry["sha256"]:
            say(f"check: FAILED: {rel} differs from the file written at export (sha256)")
            return 1
    expected = read_npz(expected_path) if expected_path else reference(info, "outputs")
    records = compare(outputs, expected, rtol=rtol, atol=atol)
    bad = [r for r in records if not r["ok"]]
    for r in bad:
        say(f"check: FAILED: output {r['name']!r}: {r['reason']}")
    if bad:
        return 1
    worst = max((r["max_abs_diff"] or 0.0 for r in records), default=0.0)
    tol = ", ".join(sorted({f"rtol={r['rtol']:g}, atol={r['atol']:g}" for r in records}))
    say(f"check: ok: {len(records)} output(s) match the reference ({tol}; max abs diff {worst:.3g})")
    return 0
