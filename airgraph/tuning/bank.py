"""The tuning bank: measured choices, kept on disk for every later compile, in any process (AOE's knowledge bank).

Layout: one folder (``config.tuning.bank_dir``), one append-only file of JSON lines per environment (tuning/env.py)::

    <bank_dir>/cpu-torch2.13.0-<digest>.jsonl
      {"format": "airgraph-tuning-bank", "version": 1, "env": {"device": ..., "isa": ..., "torch": ...}}   header
      {"key": ..., "kind": "op", "status": "tuned", "choice": {...}, "before_us": ..., "after_us": ..., ...}
      ...

- **one entry per key**: the key (tuning/keys.py) digests the operator's or segment's canonical graph, its input
  shapes, strides and dtypes, the environment and the candidate set's version; of several records with one key,
  the last one counts (an update appends; ``prune`` compacts);
- **merged under a lock**: a writer takes the file's lock (airgraph/store.py), reads what other processes appended
  meanwhile, decides (add, update, reserved: :meth:`BankFile.commit`) and appends one line; two processes tuning
  into one bank at once lose nothing;
- **torn or corrupt records** (a process killed mid-write, a hand edit) are skipped with one warning naming the
  file and line; every complete record stays readable;
- **stale records** (another device, torch, airgraph or candidate-set version) live in other files, or carry another
  candidate version, and are never used (:func:`is_stale`, the one rule): counted, listed by ``airgraph bank list``,
  removed by ``airgraph bank prune``;
- **unsatisfied memos**: a unit where nothing beat the default is not a bank entry (the seam never uses it), but
  its record (``status: "unsatisfied"``) spares the next tuning run from measuring it again (unless ``repeat``).

Readable values only (JSON), never pickles. Importable without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airgraph.log import warn_once
from airgraph.store import StoreError, append_line, check_header, locked, write_text_atomic

__all__ = ["FORMAT", "FORMAT_VERSION", "Bank", "BankFile", "Entry", "bank_file_name", "is_stale"]

FORMAT = "airgraph-tuning-bank"
FORMAT_VERSION = 1
TUNED, UNSATISFIED = "tuned", "unsatisfied"


@dataclass
class Entry:
    """One record: a unit's measured choice (``status`` "tuned") or an unsatisfied memo (``choice`` None)."""

    key: str
    kind: str  # "op" (OPAT) or "subgraph" (SGAT)
    status: str  # TUNED or UNSATISFIED
    base: str  # the unit without environment and candidate version: how stale records of it are found
    name: str  # op name (module path/node) or segment name, for reports
    op_type: str
    candidates: int  # the candidate set's version
    choice: dict[str, Any] | None  # {"tune_mode": "Impl"|"Format"|"Schedule"|"Subgraph", "name": ..., "options": ...}
    before_us: float
    after_us: float
    spread: float = 0.0  # the run-to-run spread the choice had to beat (relative)
    time: str = ""
    pid: int = field(default_factory=os.getpid)

    @property
    def improvement(self) -> float:
        """before / after - 1 (the seed's performance_improvement)."""
        return self.before_us / self.after_us - 1 if self.after_us > 0 else 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        names = set(cls.__dataclass_fields__)
        missing = {"key", "kind", "status", "base", "candidates", "before_us", "after_us"} - set(data)
        if missing:
            raise ValueError(f"missing {', '.join(sorted(missing))}")
        if data["status"] not in (TUNED, UNSATISFIED):
            raise ValueError(f"status {data['status']!r}")
        if data["status"] == TUNED and not isinstance(data.get("choice"), dict):
            raise ValueError("a tuned record without a choice")
        values = {k: v for k, v in data.items() if k in names}
        values.setdefault("name", "")
        values.setdefault("op_type", "")
        values.setdefault("choice", None)
        return cls(**values)


def bank_file_name(env: dict[str, Any], digest: str) -> str:
    return f"{env.get('device_type', 'device')}-torch{env.get('torch', '?')}-{digest}.jsonl"


class BankFile:
    """One environment's records: read incrementally (appends by other processes are picked up), written under
    the file's lock."""

    def __init__(self, path: str | os.PathLike[str], env: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self._env = env  # None: read from the header (the env property)
        self._entries: dict[str, Entry] = {}
        self._offset = 0  # bytes consumed (complete lines only)
        self._lines = 0
        self._stat: tuple[int, int] | None = None  # (inode, size) at the last read
        self.records = 0  # complete records read (superseded ones included)
        self.problem: str | None = None  # why the file cannot be used (a bad header)

    @property
    def env(self) -> dict[str, Any] | None:
        """The environment the file's records were measured in: the one it was opened for, else its header's (read
        on first use; None while the file does not exist)."""
        if self._env is None:
            self.entries()
        return self._env

    # -- reading -------------------------------------------------------------------------------------------
    def entries(self) -> dict[str, Entry]:
        """key -> its latest record; re-reads only what was appended since the last call."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._reset()
            return self._entries
        if self._stat is not None and (stat.st_ino != self._stat[0] or stat.st_size < self._offset):
            self._reset()  # replaced (prune compacted it) or truncated: read again from the start
        if self._stat is None or stat.st_size != self._stat[1]:
            self._read_from_offset()
            self._stat = (stat.st_ino, stat.st_size)
        return self._entries

    def _reset(self) -> None:
        self._entries, self._offset, self._lines, self._stat, self.records, self.problem = {}, 0, 0, None, 0, None

    def _read_from_offset(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a last line without its newline may still be being written: not yet
        for raw in data[:end].splitlines():
            self._lines += 1
            self._take(raw, self._lines)
        self._offset += end

    def _take(self, raw: bytes, lineno: int) -> None:
        try:
            record = json.loads(raw.decode("utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except (UnicodeDecodeError, ValueError) as exc:
            if lineno == 1:
                self.problem = f"{self.path}: the header line is not readable ({exc})"
            else:
                self._warn(lineno, str(exc))
            return
        if lineno == 1:
            self._check_header(record)
            return
        if self.problem is not None:
            return
        try:
            entry = Entry.from_dict(record)
        except (TypeError, ValueError) as exc:
            self._warn(lineno, str(exc))
            return
        self.records += 1
        self._entries[entry.key] = entry

    def _check_header(self, header: dict[str, Any]) -> None:
        try:  # the store's check (airgraph/store.py), with the bank's remedy for another version
            remedy = "its records are not used (airgraph bank prune removes them)"
            check_header(header, self.path, format=FORMAT, version=FORMAT_VERSION, remedy=remedy)
        except StoreError as exc:
            self.problem = str(exc)
            return
        if self._env is None:
            self._env = header.get("env") or {}
        elif header.get("env") != self._env:
            self.problem = f"{self.path}: its header names another environment than this file's name says"

    def _warn(self, lineno: int, reason: str) -> None:
        message = f"airgraph: {self.path}:{lineno}: corrupt tuning bank record skipped ({reason[:120]})"
        warn_once(("tuning bank", str(self.path), lineno), message, stacklevel=4)

    def usable(self) -> bool:
        self.entries()
        if self.problem is not None:
            warn_once(("tuning bank", str(self.path), 0), f"airgraph: {self.problem}", stacklevel=3)
        return self.problem is None

    def lookup(self, key: str) -> Entry | None:
        return self.entries().get(key) if self.usable() else None

    # -- writing -------------------------------------------------------------------------------------------
    def commit(self, entry: Entry) -> str:
        """Merge ``entry`` under the lock, counted as the seed counts (a memo that the default won is in the bank
        like an entry): "add" (a choice for a key the bank did not have), "update" (a faster choice replaces an
        entry, or a choice replaces a memo), "reserved" (what the bank had stays), or "unsatisfied" (a memo for a
        key the bank did not have: no choice was written)."""
        if self.env is None:
            raise StoreError(f"{self.path}: a bank file is created for an environment, or read from its header")
        with locked(self.path):
            current = self.entries().get(entry.key)
            if self.problem is not None:
                raise StoreError(f"{self.problem}; remove it, or tune into another bank folder")
            if entry.status == UNSATISFIED:
                if current is not None:
                    return "reserved"
                outcome = "unsatisfied"
            elif current is None:
                outcome = "add"
            elif current.status == UNSATISFIED:
                outcome = "update"
            elif current.choice == entry.choice or entry.after_us >= current.after_us:
                return "reserved"
            else:
                outcome = "update"
            self._append(entry)
            return outcome

    def _append(self, entry: Entry) -> None:
        if self._offset == 0:  # no complete header yet: a new file, or one whose header write was torn
            header = {"format": FORMAT, "version": FORMAT_VERSION, "env": self.env}
            write_text_atomic(self.path, json.dumps(header, sort_keys=True) + "\n")
            self._reset()
            self.entries()
        append_line(self.path, entry.to_json())
        self.entries()

    def rewrite(self, keep: list[Entry]) -> None:
        """Replace the file by its header and ``keep`` (compaction); call under :func:`locked`."""
        header = {"format": FORMAT, "version": FORMAT_VERSION, "env": self.env}
        lines = [json.dumps(header, sort_keys=True), *(e.to_json() for e in keep)]
        write_text_atomic(self.path, "\n".join(lines) + "\n")
        self._reset()


Versions = dict[str, Any]  # kind -> the current version of its candidate set, or device type -> version


def is_stale(file: BankFile, entry: Entry | None, current: Collection[Path], candidates: Versions) -> bool:
    """Whether ``entry`` of ``file`` (``entry`` None: the whole file) is never used: a file that is not one of the
    ``current`` environments' files (their paths) or that cannot be read (its ``problem``), or an entry measured
    with another version of its kind's candidate set on the file's device type (``candidates``: kind -> current
    version, or kind -> device type -> current version)."""
    if file.path not in current or file.problem is not None:
        return True
    if entry is None:
        return False
    version = candidates.get(entry.kind)
    if isinstance(version, dict):
        version = version.get((file.env or {}).get("device_type", "cpu"))
    return entry.candidates != version


class Bank:
    """A bank folder: one :class:`BankFile` per environment."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise StoreError(f"tuning bank {self.folder} is a file; give a folder (config.tuning.bank_dir)")
        self._files: dict[str, BankFile] = {}  # by name: opened for their environment (file_for)
        self._found: dict[str, BankFile] = {}  # by name: found in the folder (files()), their header's environment

    def file_for(self, env: dict[str, Any], digest: str) -> BankFile:
        name = bank_file_name(env, digest)
        if name not in self._files:
            self._files[name] = BankFile(self.folder / name, env)
        return self._files[name]

    def files(self) -> list[BankFile]:
        """Every environment's file in the folder (their headers say which environment). None is read here: each
        is read when asked (``entries()``, ``env``) and kept, so that a later call (the tuner asks for every graph
        it tunes) re-reads only what was appended since."""
        found = []
        for path in sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []:
            if path.name not in self._files and path.name not in self._found:
                self._found[path.name] = BankFile(path)
            found.append(self._files.get(path.name) or self._found[path.name])
        return found

    def stale_bases(self, current: BankFile, candidates: Versions) -> set[str]:
        """Units with stale records (:func:`is_stale`; ``current``: this environment's file)."""
        return {
            entry.base
            for bank_file in self.files()
            for entry in bank_file.entries().values()
            if is_stale(bank_file, entry, {current.path}, candidates)
        }

    def prune(self, current: list[BankFile], candidates: Versions, *, everything: bool = False) -> dict:
        """Remove what is never used: stale files and records (:func:`is_stale`), superseded records (and with
        ``everything``, all). Returns counts: files removed, records kept and dropped."""
        current_paths = {f.path for f in current}
        counts = {"files_removed": 0, "kept": 0, "dropped": 0}
        for bank_file in self.files():
            with locked(bank_file.path):
                bank_file.entries()  # what other processes appended, read under the lock
                records = bank_file.records
                if everything or is_stale(bank_file, None, current_paths, candidates):
                    bank_file.path.unlink(missing_ok=True)
                    counts["files_removed"] += 1
                    counts["dropped"] += records
                    continue
                keep = [
                    e for e in bank_file.entries().values() if not is_stale(bank_file, e, current_paths, candidates)
                ]
                if len(keep) != records:
                    bank_file.rewrite(keep)
                counts["kept"] += len(keep)
                counts["dropped"] += records - len(keep)
        return counts
