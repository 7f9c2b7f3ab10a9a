"""The compile cache and ``cache_compile`` load nothing from, and write nothing into, a folder another user can write
(airgraph/trust.py, issue #51); a folder listed in ``config.trusted_folders`` loads; a private folder inside a sticky
world-writable one (/tmp) loads. Tests run as root: a file of another user is made with ``os.chown``."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import torch

import airgraph
from airgraph.log import forget_warnings
from airgraph.models.mixer import MlpMixer
from tests.cache.common import cache_dir, entries, run_once
from tests.helpers import assert_close, make_config

OTHER_UID = 4242 if os.geteuid() != 4242 else 4243


def _untrusted(caught) -> list[str]:
    return [str(w.message) for w in caught if "is neither loaded from nor written to" in str(w.message)]


def _run(**options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = run_once(**options)  # the output is checked against eager
    return backend.reports[0].compile_cache, _untrusted(caught)


# -- the compile cache ---------------------------------------------------------------------------------------------


def test_a_group_writable_cache_is_neither_loaded_nor_written():
    assert _run() == ("stored", [])
    os.chmod(cache_dir(), 0o770)
    state, warned = _run()
    assert state.startswith("not stored") and len(warned) == 1
    assert f"the compile cache {cache_dir()} is neither loaded from nor written to" in warned[0]
    assert f"folder {cache_dir()} is writable by its group (mode 0770)" in warned[0]
    assert f"chmod go-w {cache_dir()}" in warned[0] and "config.trusted_folders" in warned[0]
    (entry,) = entries()
    entry.unlink()
    assert _run()[0].startswith("not stored") and not entries()  # nothing written for the next process to load
    os.chmod(cache_dir(), 0o700)
    assert _run() == ("stored", [])


def test_an_entry_of_another_user_is_refused_and_replaced_by_ones_own():
    assert _run() == ("stored", [])
    (entry,) = entries()
    os.chown(entry, OTHER_UID, -1)
    state, warned = _run()
    assert len(warned) == 1 and f"file {entry} is owned by uid {OTHER_UID}" in warned[0]
    assert state == "stored" and entry.stat().st_uid == os.geteuid()  # the folder is ours: the entry is rewritten
    assert _run() == ("hit", [])


def test_a_trusted_folder_loads_though_others_can_write_it():
    assert _run() == ("stored", [])
    os.chmod(cache_dir(), 0o777)
    assert _run(trusted_folders=[str(cache_dir())]) == ("hit", [])
    os.chown(entries()[0], OTHER_UID, -1)
    assert _run(trusted_folders=[str(cache_dir().parent)]) == ("hit", [])


def test_a_private_folder_in_a_sticky_shared_folder_loads(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    old = os.umask(0)  # a umask that would make the new folders world-writable
    try:
        assert _run(compile_cache=str(shared / "mine")) == ("stored", [])
    finally:
        os.umask(old)
    for folder in (shared / "mine", shared / "mine" / "entries"):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0
    assert _run(compile_cache=str(shared / "mine")) == ("hit", [])


# -- cache_compile -------------------------------------------------------------------------------------------------


def _mixer() -> MlpMixer:
    return MlpMixer(blocks=1, tokens=8, channels=16, token_hidden=16, channel_hidden=32, seed=0).eval()


def _cache_compiled(folder: Path, **options) -> tuple[dict, list[str]]:
    model = _mixer()
    fast = airgraph.cache_compile(model, config=make_config(compile_cache=str(folder), **options))
    x = model.example_input(2)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        assert_close(fast(x), model(x))
    return fast.stats, _untrusted(caught)


def test_cache_compile_loads_no_package_others_can_swap(tmp_path):
    folder = tmp_path / "aot"
    assert _cache_compiled(folder)[0]["compiled"] == 1
    (entry,) = (folder / "entries").glob("*.entry")
    os.chmod(folder / "entries", 0o775)
    stats, warned = _cache_compiled(folder)
    assert stats["compiled"] == 1 and stats["loaded"] == 0  # refused: compiled as if missing, equal to eager
    assert len(warned) == 1 and f"folder {folder / 'entries'} is writable by its group (mode 0775)" in warned[0]
    os.chmod(folder / "entries", 0o755)
    os.chown(entry, OTHER_UID, -1)
    stats, warned = _cache_compiled(folder, trusted_folders=[str(folder)])
    assert stats["loaded"] == 1 and warned == []  # trusted: loaded
    forget_warnings()  # the folder's warning again, as in a new process
    stats, warned = _cache_compiled(folder)
    assert stats["compiled"] == 1 and f"file {entry} is owned by uid {OTHER_UID}" in warned[0]
