"""A kernel package: one file holding static kernels and the manifest that says what they are (TorchAir's ``.run``).

A package is a zip archive::

    kernels/<graph key>/<shape id>/kernel.pt2     one AOTInductor package per kernel (kernels/build.py)
    manifest.json                                 written last

The manifest (format ``airgraph-kernel-package``, version 1) names per kernel its graph key (a digest of the
segment's graph and its inputs' metadata, lowering/keys.py), its shape key (the concrete dtype, sizes and strides
of every input) and the sha256 and size of each of its files; and for the whole build the torch and airgraph
versions and the device it was built for (kernels/machine.py). Being the last member, a manifest is only there
when every kernel before it was written; the file itself is written atomically (airgraph/store.py).

:func:`read_manifest` refuses a torn file, another format or version; :func:`verify` refuses a package whose
files do not match their digests. Neither imports torch: ``airgraph kernels install`` runs without it.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airgraph.store import StoreError, check_header, write_bytes_atomic

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "KernelFiles",
    "PackageError",
    "extract",
    "kernel_id",
    "package_name",
    "read_manifest",
    "verify",
    "write_package",
]

FORMAT = "airgraph-kernel-package"
VERSION = 1
MANIFEST = "manifest.json"


class PackageError(StoreError):
    """A package that cannot be installed: torn, another format or version, or a file that fails its digest."""


@dataclass
class KernelFiles:
    """One kernel to put into a package: its keys, its files on disk, and what to tell about it."""

    graph_key: str
    shape_key: list[Any]  # JSON form of the shape key (lists for tuples)
    shape_id: str
    files: dict[str, Path]  # name in the kernel's folder -> file on disk
    info: dict[str, Any] = field(default_factory=dict)  # label, ops, build seconds, ... (shown by `kernels list`)


def kernel_id(graph_key: str, shape_id: str) -> str:
    """The name of a kernel in packages and the library: ``<graph key>/<shape id>``."""
    return f"{graph_key}/{shape_id}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_package(
    path: str | Path, kernels: list[KernelFiles], build: dict[str, Any], graphs: dict[str, dict] | None = None
) -> dict[str, Any]:
    """Write a package holding ``kernels`` built as ``build`` (kernels/machine.py's record) to ``path``,
    atomically, and return its manifest. ``graphs``: Dynamo graphs that can warm-start on these kernels (their
    warm-start key -> which segment kernels serve them and on which inputs; kernels/warm.py)."""
    buffer = io.BytesIO()
    entries = []
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for kernel in kernels:
            files = {}
            for name, source in sorted(kernel.files.items()):
                data = Path(source).read_bytes()
                archive.writestr(f"kernels/{kernel_id(kernel.graph_key, kernel.shape_id)}/{name}", data)
                files[name] = {"sha256": _sha256(data), "size": len(data)}
            entries.append(
                {
                    "graph_key": kernel.graph_key,
                    "shape_key": kernel.shape_key,
                    "shape_id": kernel.shape_id,
                    "files": files,
                    **kernel.info,
                }
            )
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "build": build,
            "kernels": entries,
            "graphs": dict(graphs or {}),
        }
        archive.writestr(MANIFEST, json.dumps(manifest, indent=2) + "\n")  # last: present only when complete
    write_bytes_atomic(path, buffer.getvalue())
    return manifest


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the package at ``path``; PackageError when it is not a complete package of this format."""
    target = Path(path)
    if not target.is_file():
        raise PackageError(f"{target}: no such package file")
    try:
        with zipfile.ZipFile(target) as archive:
            names = archive.namelist()
            if not names or names[-1] != MANIFEST:
                raise PackageError(f"{target}: no manifest at the end; the package is incomplete, rebuild it")
            manifest = json.loads(archive.read(MANIFEST))
    except (zipfile.BadZipFile, OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackageError(f"{target}: not a readable kernel package ({exc}); rebuild or copy it again") from None
    try:
        return check_header(manifest, target, format=FORMAT, version=VERSION)
    except StoreError as exc:
        raise PackageError(f"not an airgraph kernel package of this version: {exc}") from None


def package_name(path: str | Path) -> str:
    """The name a package is installed under: its file name and a digest of its manifest, so installing the same
    package twice finds it installed, and two builds that happen to share a file name do not collide."""
    target = Path(path)
    with zipfile.ZipFile(target) as archive:
        digest = _sha256(archive.read(MANIFEST))[:12]
    return f"{target.name.removesuffix('.zip')}-{digest}"


def verify(path: str | Path, manifest: dict[str, Any]) -> None:
    """Check every file of every kernel against the manifest's digest; PackageError names the first that fails."""
    target = Path(path)
    with zipfile.ZipFile(target) as archive:
        members = set(archive.namelist())
        for kernel in manifest["kernels"]:
            for name, expected in kernel["files"].items():
                member = f"kernels/{kernel_id(kernel['graph_key'], kernel['shape_id'])}/{name}"
                if member not in members:
                    raise PackageError(f"{target}: {member} is missing; the package is incomplete, rebuild it")
                try:
                    data = archive.read(member)
                except (zipfile.BadZipFile, OSError) as exc:  # a flipped byte fails the zip's own CRC first
                    raise PackageError(f"{target}: {member} cannot be read ({exc}); copy the package again") from None
                if _sha256(data) != expected["sha256"]:
                    raise PackageError(
                        f"{target}: {member} does not match its sha256 in the manifest; copy the package again"
                    )


def extract(path: str | Path, kernel: dict[str, Any], folder: Path) -> None:
    """Write the files of ``kernel`` (a manifest entry) from the package at ``path`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path) as archive:
        for name in kernel["files"]:
            member = f"kernels/{kernel_id(kernel['graph_key'], kernel['shape_id'])}/{name}"
            (folder / name).write_bytes(archive.read(member))
