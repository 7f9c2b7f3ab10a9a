"""The kernel library: installed packages, and the one index that says which kernel answers each (graph, shape) key.

Layout: ``<library>/index.json`` (kernel ids -> files, installed packages, warm-start graphs),
``packages/<package>/<graph key>/<shape id>/kernel.pt2``, ``claims/<graph key>-<shape id>.json`` (who builds it).

Invariants:

- an install verifies digests, stages under the library's lock, renames the folder into ``packages/``, then
  replaces ``index.json``: a reader without a lock sees the library before or after, never half a package;
- per kernel id: the same kernel is kept (installing twice is a no-op), a newer build replaces an older one, an
  older one is skipped, a repair replaces a damaged entry (its damaged files stay, unreferenced, in their package);
- a package folder no index entry points to is removed after the index is written; a reader finding a folder
  gone treats it as not installed and reads the index again (:meth:`KernelLibrary.changed`);
- claims make each kernel built once on a node (:meth:`claim`).

Imports no torch. The rules in full: docs/design/static-kernel-loading.md.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airgraph.config import CompilerConfig
from airgraph.kernels import package as pkg
from airgraph.store import (
    file_digest,
    locked,
    process_alive,
    read_json,
    replace_dir,
    staging_dir,
    write_json_atomic,
    write_text_atomic,
)

__all__ = ["FORMAT", "VERSION", "InstallResult", "KernelLibrary", "library_path"]

FORMAT = "airgraph-kernel-library"
VERSION = 1
CLAIM_STALE_SECONDS = 3600.0  # a claim by a process on another host is trusted this long


def library_path(config: CompilerConfig) -> Path:
    """The library ``config`` names: ``static_kernels.library_dir``, else ``<build_dir>/static_kernel_library`` (the
    working directory when build_dir is None)."""
    options = config.static_kernels
    if options.library_dir:
        return Path(options.library_dir).resolve()
    return Path(options.build_dir or os.getcwd()).resolve() / "static_kernel_library"


@dataclass
class InstallResult:
    package: str  # the name it is installed under
    added: list[str] = field(default_factory=list)  # kernel ids now answered by this package
    kept: list[str] = field(default_factory=list)  # already installed (same build, or a newer one)
    already: bool = False  # the same package was installed before: nothing changed


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def _claim_held(owner: dict[str, Any]) -> bool:
    """Whether the process a claim names still holds it: one of another host until the claim is stale."""
    if owner.get("host") != socket.gethostname():
        return time.time() - float(owner.get("time", 0)) < CLAIM_STALE_SECONDS
    try:
        pid = int(owner["pid"])
    except (KeyError, ValueError):
        return True
    return process_alive(pid)


class KernelLibrary:
    """A kernel library folder (created on first install)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.index_path = self.root / "index.json"

    def __repr__(self) -> str:
        return f"KernelLibrary({str(self.root)!r})"

    # -- reading: no lock, the index is replaced atomically -----------------------------------------------
    def read_index(self) -> dict[str, Any]:
        try:
            index = read_json(self.index_path, format=FORMAT, version=VERSION)
        except FileNotFoundError:
            return {"kernels": {}, "packages": {}, "graphs": {}}
        index.setdefault("kernels", {})
        index.setdefault("packages", {})
        index.setdefault("graphs", {})  # Dynamo graph (warm-start key) -> the segment kernels serving it
        return index

    def stamp(self) -> tuple[int, int, int] | None:
        """Changes whenever the index is replaced (a new file: another inode and mtime); None without one."""
        try:
            st = os.stat(self.index_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def folder(self, entry: dict[str, Any]) -> Path:
        """The folder holding an index entry's files."""
        return self.root / "packages" / entry["package"] / entry["graph_key"] / entry["shape_id"]

    def kernels(self) -> dict[str, dict[str, Any]]:
        """Kernel id -> its index entry."""
        return self.read_index()["kernels"]

    def damage(self, entry: dict[str, Any]) -> str | None:
        """Why an index entry's files are not what was installed (one is gone, or differs from its sha256), or None
        when they are intact. A file gone may also mean the entry was replaced since the index was read (its old
        package collected): read the index again before calling that damage."""
        folder = self.folder(entry)
        for name, expected in entry["files"].items():
            try:
                if file_digest(folder / name) != expected["sha256"]:
                    return f"its file {name} does not match its sha256 (corrupted or changed after install)"
            except FileNotFoundError:
                return f"its file {name} is missing (deleted after install)"
        return None

    # -- installing ---------------------------------------------------------------------------------------
    def install(self, package_path: str | os.PathLike[str], *, repairs: dict[str, str] | None = None) -> InstallResult:
        """Install the package at ``package_path`` (see the module docstring). PackageError for a package that is
        torn, of another format or version, or whose files fail their digests; nothing is installed then.
        ``repairs``: kernel id -> the package of its installed entry whose files are damaged; the package's kernel
        replaces that entry even where it is no newer (a rebuild may give the same bytes)."""
        repairs = repairs or {}
        manifest = pkg.read_manifest(package_path)
        pkg.verify(package_path, manifest)
        name = pkg.package_name(package_path)
        with locked(self.index_path):
            index = self.read_index()
            result = InstallResult(name)
            if name in index["packages"]:
                result.already = True
                return result
            self._collect(index)  # what a crashed writer left behind
            taken = []
            for kernel in manifest["kernels"]:
                kid = pkg.kernel_id(kernel["graph_key"], kernel["shape_id"])
                current = index["kernels"].get(kid)
                built = kernel.get("built", manifest["created"])
                repaired = current is not None and repairs.get(kid) == current["package"]
                if (
                    current is not None
                    and not repaired
                    and (current["files"] == kernel["files"] or current["built"] >= built)
                ):
                    result.kept.append(kid)
                else:
                    taken.append((kid, kernel, built))
            if taken:
                target = self.root / "packages" / name
                with staging_dir(target) as stage:
                    for _, kernel, _ in taken:
                        pkg.extract(package_path, kernel, stage / kernel["graph_key"] / kernel["shape_id"])
                    replace_dir(stage, target)
            for kid, kernel, built in taken:
                index["kernels"][kid] = {
                    **{k: v for k, v in kernel.items() if k != "built"},
                    "package": name,
                    "built": built,
                    "build": manifest["build"],
                    "size": sum(f["size"] for f in kernel["files"].values()),
                }
                result.added.append(kid)
            served = {e["graph_key"] for e in index["kernels"].values()}
            index["graphs"].update({k: g for k, g in manifest.get("graphs", {}).items() if g["graph_key"] in served})
            index["packages"][name] = {
                "file": Path(package_path).name,
                "installed": _now(),
                "created": manifest["created"],
                "build": manifest["build"],
                "kernels": len(manifest["kernels"]),
            }
            self._write(index)
            self._collect(index)
        return result

    def remove(
        self, *, package: str | None = None, graph_key: str | None = None, everything: bool = False
    ) -> list[str]:
        """Remove installed kernels: those a package brought (its name, or its name's unique prefix), those of a
        graph key (or a unique prefix of one), or all; returns the kernel ids removed. ValueError when nothing
        matches."""
        if (package is None) + (graph_key is None) + (not everything) != 2:
            raise ValueError("give exactly one of: a package name, a graph key, or everything=True")
        with locked(self.index_path):
            index = self.read_index()
            if everything:
                removed = list(index["kernels"])
                index["packages"].clear()
            elif package is not None:
                name = _unique(package, index["packages"], "installed package")
                removed = [kid for kid, e in index["kernels"].items() if e["package"] == name]
                del index["packages"][name]
            else:
                keys = {e["graph_key"] for e in index["kernels"].values()}
                key = _unique(graph_key, keys, "graph key")
                removed = [kid for kid, e in index["kernels"].items() if e["graph_key"] == key]
            for kid in removed:
                del index["kernels"][kid]
            served = {e["graph_key"] for e in index["kernels"].values()}
            index["graphs"] = {k: g for k, g in index["graphs"].items() if g["graph_key"] in served}
            self._write(index)
            self._collect(index)
        return removed

    def _write(self, index: dict[str, Any]) -> None:
        write_json_atomic(
            self.index_path,
            {"kernels": index["kernels"], "packages": index["packages"], "graphs": index["graphs"]},
            format=FORMAT,
            version=VERSION,
        )

    def _collect(self, index: dict[str, Any]) -> None:
        """Remove package folders no kernel of ``index`` points to, and a crashed writer's staging folders (call
        under the lock: only the lock holder stages)."""
        packages = self.root / "packages"
        if not packages.is_dir():
            return
        used = {e["package"] for e in index["kernels"].values()}
        for folder in packages.iterdir():
            if folder.name not in used:
                shutil.rmtree(folder, ignore_errors=True)

    # -- claims: one builder per kernel on a node ---------------------------------------------------------
    def claim(self, kid: str, *, replacing: str | None = None) -> str:
        """Ask to build kernel ``kid``: "claimed" (build it, then :meth:`release`), "installed" (it already is), or
        "taken" (a live process is building it). ``replacing``: the package of a damaged entry of ``kid`` to build
        again; "installed" then means another package's entry has replaced it."""
        path = self._claim_path(kid)
        with locked(self.index_path):
            current = self.read_index()["kernels"].get(kid)
            if current is not None and current["package"] != replacing:
                return "installed"
            if path.exists():
                try:
                    owner = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    owner = {}
                if owner.get("pid") != os.getpid() and _claim_held(owner):
                    return "taken"
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
            write_text_atomic(path, json.dumps(owner), durable=False)  # read without the lock: never torn
            return "claimed"

    def release(self, kid: str) -> None:
        """Give up this process's claim of ``kid`` (built and installed, or failed)."""
        path = self._claim_path(kid)
        with locked(self.index_path):
            try:
                owner = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                return
            if owner.get("pid") == os.getpid():
                path.unlink(missing_ok=True)

    def held_by_other(self, kid: str) -> bool:
        """Whether another live process holds the claim of ``kid`` (read without the lock: a hint)."""
        try:
            owner = json.loads(self._claim_path(kid).read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return owner.get("pid") != os.getpid() and _claim_held(owner)

    def _claim_path(self, kid: str) -> Path:
        return self.root / "claims" / (kid.replace("/", "-") + ".json")


def _unique(prefix: str, names: Any, what: str) -> str:
    matches = sorted(n for n in names if n == prefix) or sorted(n for n in names if n.startswith(prefix))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted(names)) or "none"
        raise ValueError(f"no {what} {prefix!r} in this library; known: {known}")
    raise ValueError(f"{prefix!r} names several {what}s ({', '.join(matches)}); give more of it")
