"""Whether a folder airgraph loads code from (or writes code into) can be written by someone else.

The compile cache unpickles its entries, ``cache_compile`` and the kernel library load shared objects: whoever can
rewrite such a file, with its digest, runs code in every process that loads it. Like OpenSSH's ``StrictModes``
and git's ``safe.directory``, a path is safe when the file and every folder above it, up to ``/``, are

- owned by the current user or by root, and
- not writable by group or others, except a sticky folder (``/tmp``: others cannot remove or rename what is ours).

``config.trusted_folders`` (``AIRGRAPH_TRUSTED_FOLDERS``) lists folders trusted on purpose (a team's NFS folder
for the kernel library): a path inside one, or the folder itself, is not checked at all. It lists folders, never
"everything". :func:`problem` says what is wrong with a path, or None; :func:`check` raises :class:`Untrusted`;
:func:`make_folder` creates a store's folders so that they pass (no group or other write, whatever the umask).
Both the path as given and the path its symbolic links resolve to are checked. Imports no torch.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from airgraph.store import StoreError

__all__ = ["FolderFacts", "Untrusted", "check", "describe", "is_trusted", "make_folder", "problem"]

FIX_OWNER = "use a folder of your own"
TRUST_HINT = "or, if you trust everyone who can write it, list it in config.trusted_folders (AIRGRAPH_TRUSTED_FOLDERS)"


class Untrusted(StoreError):
    """A file or folder that someone other than this user (or root) can write: nothing is loaded from it."""


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def is_trusted(path: str | os.PathLike[str], trusted: Iterable[str]) -> bool:
    """Whether ``path`` is one of the ``trusted`` folders or inside one (either as given or resolved)."""
    forms = {Path(os.path.abspath(path)), Path(os.path.realpath(path))}
    for folder in trusted:
        roots = {Path(os.path.abspath(folder)), Path(os.path.realpath(folder))}
        if any(form == root or root in form.parents for form in forms for root in roots):
            return True
    return False


def _chains(path: str | os.PathLike[str]) -> list[list[Path]]:
    """The paths from ``/`` down to ``path``: as its symbolic links resolve, and as given (when that differs)."""
    forms = dict.fromkeys((Path(os.path.realpath(path)), Path(os.path.abspath(path))))
    return [[*reversed(form.parents), form] for form in forms]


def _stat_problem(item: Path, info: os.stat_result) -> str | None:
    what = "folder" if stat.S_ISDIR(info.st_mode) else "file"
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (os.geteuid(), 0):
        return (
            f"{what} {item} is owned by {_user(info.st_uid)}, not by you ({_user(os.geteuid())}) or root; "
            f"{FIX_OWNER}, {TRUST_HINT}"
        )
    sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
    if mode & 0o022 and not sticky:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit)
        return f"{what} {item} is writable by {who} (mode {mode:04o}); run `chmod go-w {item}`, {TRUST_HINT}"
    return None


def problem(path: str | os.PathLike[str], trusted: Iterable[str] = ()) -> str | None:
    """What makes ``path`` unsafe to load from or write to (module docstring), or None when it is safe. A path that
    does not exist yet is judged by the folders above it that do."""
    trusted = tuple(trusted)
    if is_trusted(path, trusted):
        return None
    for chain in _chains(path):
        for item in chain:
            try:
                info = os.stat(item)
            except (FileNotFoundError, NotADirectoryError):
                break  # nothing below exists: what airgraph creates there is its own (make_folder)
            except OSError as exc:
                return f"{item} cannot be examined ({exc}); {TRUST_HINT}"
            reason = _stat_problem(item, info)
            if reason is not None:
                return reason
    return None


def check(path: str | os.PathLike[str], trusted: Iterable[str] = ()) -> None:
    """Raise :class:`Untrusted` naming what is wrong with ``path`` and the fix (:func:`problem`)."""
    reason = problem(path, trusted)
    if reason is not None:
        raise Untrusted(reason)


def make_folder(path: str | os.PathLike[str], trusted: Iterable[str] = ()) -> Path:
    """Create ``path`` and the folders above it that are missing, none writable by group or others (mode 0755 at
    most, whatever the umask); inside a trusted folder they take the umask's mode, for the others who share it."""
    target = Path(path)
    shared = is_trusted(target, trusted)
    missing = [p for p in [*reversed(target.parents), target] if not p.exists()]
    for item in missing:
        with contextlib.suppress(FileExistsError):
            os.mkdir(item, 0o777 if shared else 0o755)
    return target


@dataclass(frozen=True)
class FolderFacts:
    """A store's folder as the CLI shows it: owner, mode, whether it is trusted, and why it is refused."""

    path: Path
    owner: str | None  # None: the folder does not exist
    mode: str | None
    trusted: bool
    problem: str | None

    def verdict(self) -> str:
        if self.trusted:
            return "trusted (config.trusted_folders)"
        return "safe" if self.problem is None else f"REFUSED: {self.problem}"


def describe(path: str | os.PathLike[str], trusted: Iterable[str] = ()) -> FolderFacts:
    """``path``'s owner and mode, and the verdict of :func:`problem`."""
    trusted = tuple(trusted)
    target = Path(path)
    try:
        info = os.stat(target)
        owner, mode = _user(info.st_uid), f"{stat.S_IMODE(info.st_mode):04o}"
    except OSError:
        owner = mode = None
    return FolderFacts(target, owner, mode, is_trusted(target, trusted), problem(target, trusted))
