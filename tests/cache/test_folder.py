"""The compile cache's files (airgraph/cache/folder.py): whole entries whoever writes, damaged ones named."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from airgraph.cache.folder import CacheFolder

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().parent / "writer.py"


def test_two_processes_writing_one_entry_never_show_a_torn_one(tmp_path):
    """Two processes rewrite one entry with payloads of their own (2 MiB, 25 times each) while this one reads it:
    every read is the whole of one writer's entry, never a mixture or a part, and one whole entry is left."""
    folder, size = CacheFolder(tmp_path / "cache"), 2 << 20
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen([sys.executable, str(WRITER), str(folder.root), "k", str(tag), "25", str(size)], env=env)
        for tag in (1, 2)
    ]
    reads = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while any(w.poll() is None for w in writers):
            found = folder.read("k")
            if found is not None:
                header, payload = found
                assert len(payload) == size and payload == bytes([payload[0]]) * size
                assert header["model"] == f"writer {payload[0]}"
                reads += 1
            time.sleep(0.001)
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    assert not [str(w.message) for w in caught if "refused" in str(w.message)]
    assert reads > 0 and folder.check("k") is None
    assert [p.name for p in (folder.root / "entries").iterdir() if not p.name.endswith(".lock")] == ["k.entry"]


def test_entries_are_listed_checked_and_removed(tmp_path):
    folder = CacheFolder(tmp_path)
    folder.write("a", b"x" * 10, {"model": "A.forward"})
    folder.write("b", b"y" * 10, {"model": "B.forward"})
    (folder.root / "entries" / "b.entry").write_bytes(b'{"format": "other"}\n')
    (folder.root / "entries" / ".a.entry.123.tmp").write_bytes(b"left by a crash")
    (folder.root / "entries" / "notes.txt").write_text("not the cache's")
    listed = {i.key: i for i in folder.scan()}
    assert listed["a"].header["model"] == "A.forward" and listed["a"].problem is None
    assert listed["b"].header is None and "expected a 'airgraph-compile-cache-entry' document" in listed["b"].problem
    assert folder.check("a") is None
    assert folder.clear() == (2, listed["a"].size + listed["b"].size + len(b"left by a crash"))
    assert [p.name for p in (folder.root / "entries").iterdir()] == ["notes.txt"]
    assert folder.read("a") is None


def test_a_folder_that_cannot_be_written_is_warned_of_once_and_the_compile_goes_on(tmp_path):
    from airgraph.log import forget_warnings

    (tmp_path / "a-file").write_text("not a folder")
    folder = CacheFolder(tmp_path / "a-file" / "cache")
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert folder.store("k1", b"payload", {}) is False
        assert folder.store("k2", b"payload", {}) is False
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "a-file/cache cannot be written" in messages[0]
    assert "set config.compile_cache to a folder this process can write, or to False" in messages[0]
    writable = CacheFolder(tmp_path / "cache")
    assert writable.store("k1", b"payload", {"model": "M.forward"}) is True
    assert writable.read("k1")[1] == b"payload"
