"""Where an export's files go, and how they get there atomically. Importable without torch.

Single process: ``export_path/<export_name>.onnx``, ``dynamo.pbtxt``, ``export.json``, ``reference_inputs.npz``,
``reference_outputs.npz`` and weight files past the threshold. With a rank, the model is
``export_path/<export_name><rank>.onnx`` and every other file goes to ``export_path/rank_<rank>/`` (TorchAir's
layout); weight locations are relative to export_path either way.

Invariants:

- everything is staged in a hidden directory beside export_path, then moved in with ``os.replace``: weights,
  pbtxt and references, the model, ``export.json`` last (an old one is removed before the first move), so a
  folder without ``export.json`` is not a complete export and a failed export leaves export_path as it was;
- each rank stages and commits only its own files, so ranks exporting into one folder never clobber each other;
- other files in export_path are never touched.

The layout in full: docs/export.md and docs/design/export-internals.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from airgraph.export.errors import ExportPathError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "PBTXT_FILE",
    "REFERENCE_INPUTS_FILE",
    "REFERENCE_OUTPUTS_FILE",
    "ExportLayout",
    "Staging",
    "check_export_name",
    "rank_metadata_files",
    "weight_file_names",
]

FORMAT = "airgraph-export"
FORMAT_VERSION = 1
METADATA_FILE = "export.json"
PBTXT_FILE = "dynamo.pbtxt"
REFERENCE_INPUTS_FILE = "reference_inputs.npz"
REFERENCE_OUTPUTS_FILE = "reference_outputs.npz"
_MAX_FILE_NAME = 200


def check_export_name(name: object) -> str:
    """``name`` if it is a plain file-name stem; :class:`ExportPathError` if it is empty or holds a path."""
    if not isinstance(name, str):
        raise ExportPathError(f"export_name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise ExportPathError("export_name is empty")
    if name in (".", "..") or any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/")):
        raise ExportPathError(f"export_name {name!r} holds a path; give a plain name and put the folder in export_path")
    if any(ord(c) < 32 for c in name) or len(name) > _MAX_FILE_NAME:
        raise ExportPathError(f"export_name {name!r}: control characters or longer than {_MAX_FILE_NAME} characters")
    return name


@dataclass(frozen=True)
class ExportLayout:
    """The files of one export (one rank of it) under ``root`` (export_path); paths are relative to root."""

    root: Path
    name: str
    rank: int | None = None

    def __post_init__(self) -> None:
        check_export_name(self.name)
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0):
            raise ValueError(f"rank={self.rank!r}: must be None or an int >= 0")
        object.__setattr__(self, "root", Path(os.path.abspath(os.fspath(self.root))))

    @property
    def files_dir(self) -> str:
        """Folder (relative to root) of everything but the model: ``""`` or ``"rank_<rank>"``."""
        return "" if self.rank is None else f"rank_{self.rank}"

    def rel(self, file_name: str) -> str:
        return f"{self.files_dir}/{file_name}" if self.files_dir else file_name

    @property
    def model(self) -> str:
        return f"{self.name}.onnx" if self.rank is None else f"{self.name}{self.rank}.onnx"

    @property
    def pbtxt(self) -> str:
        return self.rel(PBTXT_FILE)

    @property
    def metadata(self) -> str:
        return self.rel(METADATA_FILE)

    @property
    def reference_inputs(self) -> str:
        return self.rel(REFERENCE_INPUTS_FILE)

    @property
    def reference_outputs(self) -> str:
        return self.rel(REFERENCE_OUTPUTS_FILE)

    def reserved(self) -> set[str]:
        """Relative paths of the fixed files, which a weight file must not take."""
        return {self.model, self.pbtxt, self.metadata, self.reference_inputs, self.reference_outputs}

    def reserved_names(self) -> set[str]:
        """File names of the fixed files inside :attr:`files_dir`, which a weight file must not take."""
        prefix = f"{self.files_dir}/" if self.files_dir else ""
        names = (rel[len(prefix) :] for rel in self.reserved() if rel.startswith(prefix))
        return {name for name in names if "/" not in name}

    def check_targets(self, rels: Iterable[str] = ()) -> None:
        """Refuse a symlinked or non-directory export_path (or rank folder), and symlinked or folder targets."""
        if self.root.is_symlink():
            raise ExportPathError(f"export_path {self.root} is a symbolic link; give the real folder")
        if self.root.exists() and not self.root.is_dir():
            raise ExportPathError(f"export_path {self.root} exists and is not a folder")
        if self.files_dir:
            sub = self.root / self.files_dir
            if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
                raise ExportPathError(f"{sub} is a symbolic link or not a folder")
        for rel in {*self.reserved(), *rels}:
            target = self.root / rel
            if target.is_symlink():
                raise ExportPathError(f"target file {target} is a symbolic link; remove it or export elsewhere")
            if target.is_dir():
                raise ExportPathError(f"target file {target} is a folder")

    @contextlib.contextmanager
    def staging(self) -> Iterator[Staging]:
        """A fresh staging directory, removed on exit whether or not the export was committed."""
        stage = Staging(self)
        try:
            yield stage
        finally:
            shutil.rmtree(stage.dir, ignore_errors=True)


class Staging:
    """Files of an export being written; :meth:`commit` moves them into the export folder."""

    def __init__(self, layout: ExportLayout) -> None:
        self.layout = layout
        root = layout.root
        prefix = f".{root.name or 'export'}.{layout.name}.staging-"
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir=root.parent))
        except OSError:  # the parent is not writable: stage inside export_path (same file system either way)
            root.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix=".airgraph-staging-", dir=root))
        self.files: list[str] = []

    def path(self, rel: str) -> Path:
        """Where to write the file that will become ``export_path/rel``."""
        if rel in self.files:
            raise ValueError(f"{rel} is written twice")
        target = self.dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        self.files.append(rel)
        return target

    def commit(self) -> list[str]:
        """Move every staged file into export_path, the metadata last; returns their relative paths."""
        layout, root = self.layout, self.layout.root
        layout.check_targets(self.files)
        root.mkdir(parents=True, exist_ok=True)
        metadata = layout.metadata
        with contextlib.suppress(FileNotFoundError):
            (root / metadata).unlink()  # from here on the folder does not look like a complete export
        ordered = sorted(self.files, key=lambda rel: (rel == metadata, rel == layout.model, rel))
        for rel in ordered:
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.dir / rel, target)
        return ordered


def weight_file_names(names: Iterable[str], reserved: Iterable[str] = ()) -> dict[str, str]:
    """A safe, unique file name per weight, named after it: ``layers.0.attn.wq.weight`` stays as it is.

    Characters outside ``[A-Za-z0-9._-]`` become ``_``, a leading dot becomes ``_``, long names are cut and
    suffixed with a hash, and clashes (also case-insensitive ones, and the reserved names) get ``_2``, ``_3``.
    """
    taken = {r.lower() for r in reserved}
    out: dict[str, str] = {}
    for name in names:
        base = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"
        if base.startswith("."):
            base = "_" + base[1:]
        if len(base) > _MAX_FILE_NAME:
            base = f"{base[: _MAX_FILE_NAME - 17]}_{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        candidate, n = base, 1
        while candidate.lower() in taken:
            n += 1
            candidate = f"{base}_{n}"
        taken.add(candidate.lower())
        out[name] = candidate
    return out


def rank_metadata_files(root: str | os.PathLike[str]) -> dict[int, Path]:
    """``{rank: root/rank_<rank>/export.json}`` of the rank folders of a multi-rank export that have one."""
    out = {}
    for path in Path(root).glob(f"rank_*/{METADATA_FILE}"):
        suffix = path.parent.name.removeprefix("rank_")
        if suffix.isdigit():
            out[int(suffix)] = path
    return dict(sorted(out.items()))
