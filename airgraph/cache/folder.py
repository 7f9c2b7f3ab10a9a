"""The compile cache's folder: one file per entry, written and read through airgraph/store.py.

```
<cache>/
  entries/<key>.entry      one Dynamo graph: a header line (JSON), then the payload (bytes)
  inductor-isa.json        Inductor's CPU instruction-set verdicts (cache/isa.py)
```

An entry's header names its format and version (airgraph/store.py ``check_header``), the payload's size and
sha256, and what the entry is (the model, the mode, the device, the graph's size) for ``airgraph cache list``.
Written whole (``write_bytes_atomic``: a temporary file renamed over the entry) under the entry's lock, so
processes writing the same entry at once leave one whole entry. Read without a lock; a file whose header,
size or digest is wrong (torn, damaged, another version) is refused with one warning per process and entry,
and the compile that follows writes it again. Entries are pickles and shared objects: nothing is read from or
written to a folder someone else can write (airgraph/trust.py; warned once per folder, the graph compiles as if
the entry were missing) unless it is one of the ``trusted`` folders. Imports no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from airgraph import trust
from airgraph.log import warn_once
from airgraph.store import StoreError, check_header, locked, write_bytes_atomic

__all__ = ["FORMAT", "ISA_FILE", "VERSION", "CacheFolder", "EntryInfo"]

FORMAT = "airgraph-compile-cache-entry"
VERSION = 1
SUFFIX = ".entry"
ISA_FILE = "inductor-isa.json"  # cache/isa.py's record
MAX_HEADER = 1 << 20  # bytes: a header line longer than this is not one


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One entry file as ``airgraph cache list`` shows it: its header, or why it cannot be read."""

    key: str
    path: Path
    size: int
    header: dict[str, Any] | None
    problem: str | None


class CacheFolder:
    """The entries of one compile-cache folder (module docstring)."""

    def __init__(self, root: str | os.PathLike[str], trusted: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.entries = self.root / "entries"
        self.trusted = tuple(trusted)  # config.trusted_folders

    def __repr__(self) -> str:
        return f"CacheFolder({str(self.root)!r})"

    def path(self, key: str) -> Path:
        return self.entries / f"{key}{SUFFIX}"

    def write(self, key: str, payload: bytes, info: dict[str, Any]) -> Path:
        """Write entry ``key`` whole (module docstring); ``info``: what it is, for listings. trust.Untrusted when
        others can write the folder."""
        trust.check(self.entries, self.trusted)
        trust.make_folder(self.entries, self.trusted)
        header = {
            "format": FORMAT,
            "version": VERSION,
            "key": key,
            "payload_bytes": len(payload),
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
            **info,
        }
        data = json.dumps(header, sort_keys=False).encode("utf-8") + b"\n" + payload
        path = self.path(key)
        with locked(path):
            write_bytes_atomic(path, data)
        return path

    def store(self, key: str, payload: bytes, info: dict[str, Any]) -> bool:
        """:meth:`write`, or False when this process cannot write the folder (warned once per folder): a cache
        that cannot be filled leaves the compile to go on."""
        try:
            self.write(key, payload, info)
        except trust.Untrusted as exc:
            self._untrusted(str(exc))
            return False
        except OSError as exc:
            warn_once(
                ("compile cache unwritable", str(self.root)),
                f"airgraph: the compile cache {self.root} cannot be written ({exc}); set config.compile_cache to a "
                "folder this process can write, or to False",
                stacklevel=3,
            )
            return False
        return True

    def read(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        """Entry ``key``'s header and payload; None when there is none. A damaged one is refused with a warning
        (once per process) naming the file, and None is answered: the caller compiles and writes it again."""
        path = self.path(key)
        reason = trust.problem(path, self.trusted)
        if reason is not None:
            self._untrusted(reason)
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse(path, f"it cannot be read ({exc})")
            return None
        try:
            return _parse(data, path)
        except StoreError as exc:
            self._refuse(path, str(exc).removeprefix(f"{path}: "))
            return None

    def refuse(self, key: str, reason: str) -> None:
        """Entry ``key`` read whole but unusable (its payload does not load): warned as a damaged one."""
        self._refuse(self.path(key), reason)

    def _untrusted(self, reason: str) -> None:
        warn_once(
            ("compile cache untrusted", str(self.root)),
            f"airgraph: the compile cache {self.root} is neither loaded from nor written to: {reason}; graphs "
            "compile as if it were empty",
            stacklevel=4,
        )

    def _refuse(self, path: Path, reason: str) -> None:
        warn_once(
            ("compile cache entry", str(path)),
            f"airgraph: compile cache entry {path} is refused: {reason}; the graph is compiled again and the "
            "entry rewritten",
            stacklevel=4,
        )

    def scan(self) -> list[EntryInfo]:
        """Every entry file, its header read (not its payload's digest: ``airgraph cache list --check`` does)."""
        found = []
        for path in sorted(self.entries.glob(f"*{SUFFIX}")) if self.entries.is_dir() else []:
            key = path.name.removesuffix(SUFFIX)
            try:
                size = path.stat().st_size
                with open(path, "rb") as f:
                    line = f.readline(MAX_HEADER)
                header = _header(line, path)
                problem = None
            except FileNotFoundError:  # removed since listed
                continue
            except (OSError, StoreError) as exc:
                header, problem = None, str(exc).removeprefix(f"{path}: ")
                size = path.stat().st_size if path.exists() else 0
            found.append(EntryInfo(key, path, size, header, problem))
        return found

    def check(self, key: str) -> str | None:
        """Why entry ``key`` would be refused (its header, size or digest), or None when it is whole."""
        try:
            _parse(self.path(key).read_bytes(), self.path(key))
        except (OSError, StoreError) as exc:
            return str(exc).removeprefix(f"{self.path(key)}: ")
        return None

    def remove(self, key: str) -> int:
        """Remove entry ``key`` (under its lock); the bytes freed."""
        path = self.path(key)
        with locked(path):
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                size = 0
        Path(f"{path}.lock").unlink(missing_ok=True)
        return size

    def clear(self) -> tuple[int, int]:
        """Remove every entry and the leftovers of interrupted writes; (entries removed, bytes freed). Files that
        are not the cache's are left alone."""
        count = freed = 0
        for info in self.scan():
            freed += self.remove(info.key)
            count += 1
        if self.entries.is_dir():
            for stray in self.entries.iterdir():  # a crash mid-write leaves .<key>.entry.*.tmp behind
                if stray.name.startswith(".") and stray.name.endswith(".tmp") and SUFFIX in stray.name:
                    freed += stray.stat().st_size
                    stray.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.entries.rmdir()  # only when empty
        return count, freed


def _header(line: bytes, path: Path) -> dict[str, Any]:
    if not line.endswith(b"\n"):
        raise StoreError(f"{path}: no header line (a torn or foreign file)")
    try:
        document = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: its header is not JSON ({exc})") from None
    return check_header(document, path, format=FORMAT, version=VERSION, remedy="it is compiled again")


def _parse(data: bytes, path: Path) -> tuple[dict[str, Any], bytes]:
    end = data.find(b"\n", 0, MAX_HEADER)
    header = _header(data[: end + 1] if end >= 0 else data[:MAX_HEADER], path)
    payload = data[end + 1 :]
    if len(payload) != header.get("payload_bytes"):
        raise StoreError(f"{path}: {len(payload)} payload bytes, its header says {header.get('payload_bytes')} (torn)")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise StoreError(f"{path}: its payload does not match its sha256 (damaged)")
    return header, payload
