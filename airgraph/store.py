"""Every file airgraph keeps for later runs goes through here: the kernel library, the tuning bank, exports.

Four promises, whoever writes:

- **atomic**: a file is written beside its target and renamed over it (``os.replace``), a folder is staged
  beside its target and renamed into place; a reader sees the old version or the new one, never half of one,
  and a crash leaves at most a hidden temporary behind (``.<name>.*.tmp``, ``.<name>.*.staging``);
- **locked**: writers that read, merge and write (a bank, a library index) hold a cross-process file lock
  (``filelock``) on ``<path>.lock`` for the whole read-modify-write, so two processes lose nothing;
- **versioned**: a JSON document starts with a header naming its format and version (``{"format": ...,
  "version": ...}``); :func:`read_json` refuses another format, a newer version, or a torn file, with a
  :class:`StoreError` that names the file and what to do;
- **digested**: :func:`file_digest` (sha256) lets a manifest say what each file must hold.

Files that name the process that wrote them (a build claim, a node registration) ask :func:`process_alive`
whether it still runs.

Importable without torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

__all__ = [
    "LOCK_TIMEOUT",
    "StoreError",
    "append_line",
    "check_header",
    "file_digest",
    "locked",
    "read_json",
    "replace_dir",
    "staging_dir",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

# Seconds a writer waits for another process's lock before giving up with a StoreError.
LOCK_TIMEOUT = 600.0


class StoreError(ValueError):
    """A stored file or folder that cannot be used (torn, another format or version, a refused path)."""


def _check_target(target: Path) -> None:
    if target.is_symlink() or target.is_dir():
        raise StoreError(f"target file {target} is a symbolic link or a folder; give the path of a regular file")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, flushed to disk, then renamed.
    ``durable=False`` skips the flush (fsync): still never torn by a crash of the process, but the newest version
    may be lost to a crash of the machine; for records written by the hundred (static kernels' shape records)."""
    target = Path(path)
    _check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(
    path: str | os.PathLike[str], data: Any, *, format: str, version: int, durable: bool = True
) -> None:
    """Write ``data`` (a dict) as JSON under a header ``{"format": format, "version": version}``, atomically."""
    document = {"format": format, "version": version, **data}
    write_text_atomic(path, json.dumps(document, indent=2, sort_keys=False) + "\n", durable=durable)


def read_json(path: str | os.PathLike[str], *, format: str, version: int) -> dict[str, Any]:
    """A JSON document written by :func:`write_json_atomic`: refused (StoreError) if it is torn, of another
    format, or of a version this airgraph does not read (older versions are the caller's to migrate)."""
    target = Path(path)
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{target}: not a readable JSON document ({exc}); remove it or restore it") from None
    return check_header(document, target, format=format, version=version)


def check_header(
    document: Any,
    target: str | os.PathLike[str],
    *,
    format: str,
    version: int,
    remedy: str = "rebuild it with this airgraph",
) -> dict[str, Any]:
    """``document`` (read from ``target``) if its header names ``format`` and ``version``; StoreError otherwise
    (``remedy``: what to do about another version)."""
    if not isinstance(document, dict) or document.get("format") != format:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise StoreError(f"{target}: expected a {format!r} document, found {found!r}")
    if document.get("version") != version:
        raise StoreError(
            f"{target}: {format} version {document.get('version')!r}, this airgraph reads version {version}; {remedy}"
        )
    return document


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(path: str | os.PathLike[str], *, timeout: float | None = None) -> Iterator[None]:
    """Hold the cross-process lock of ``path`` (the file ``<path>.lock``) for the duration.

    Re-entrant within a process (filelock counts); another process waits up to ``timeout`` seconds
    (:data:`LOCK_TIMEOUT` by default), then a :class:`StoreError` names the lock file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{target}.lock", timeout=LOCK_TIMEOUT if timeout is None else timeout)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(
            f"{target}: another process has held {target}.lock for more than {lock.timeout:.0f} s; "
            "wait for it, or remove the lock file if no airgraph process is running"
        ) from None
    try:
        yield
    finally:
        lock.release()


def process_alive(pid: int, host: str | None = None) -> bool:
    """Whether process ``pid`` of ``host`` (this machine when None) runs. Only a pid that no process of this machine
    has is dead: another machine's cannot be checked from here, and one this process may not signal exists."""
    if host is not None and host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (a record of an append-only file) in a single write, flushed to disk. A process killed
    mid-write leaves at most a torn last line, which readers skip; call under :func:`locked` when several
    processes append."""
    if "\n" in line:
        raise ValueError("a record is one line")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "ab") as f:
        if f.tell() and not _ends_with_newline(target):
            f.write(b"\n")  # a torn last record stays on its own line
        f.write(line.encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh hidden folder beside ``target`` to build its next version in; removed on exit unless it was
    moved into place (:func:`replace_dir`)."""
    final = Path(target)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".staging", dir=final.parent))
    try:
        yield stage
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def replace_dir(stage: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move the folder ``stage`` to ``target``, replacing what is there, so that a reader sees the old folder or
    the new one. A folder cannot be renamed over a non-empty one, so the old one is first renamed aside (a
    reader between the two renames finds nothing, never a mixture), then removed. Call under :func:`locked`."""
    stage, final = Path(stage), Path(target)
    if final.is_symlink():
        raise StoreError(f"{final} is a symbolic link; airgraph replaces only folders it owns")
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
        os.replace(final, old / final.name)
    try:
        os.replace(stage, final)
    except BaseException:
        if old is not None:
            os.replace(old / final.name, final)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
