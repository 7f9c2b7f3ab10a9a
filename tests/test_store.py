"""The store's promises: atomic files and folders, cross-process locks, versioned documents, digests."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
from pathlib import Path

import pytest

from airgraph import store
from tests.helpers import exited_pid


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "bank.json"
    store.write_text_atomic(target, "old\n")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        store.write_text_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank.json"]


def test_a_symlink_or_folder_target_is_refused(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep")
    (tmp_path / "link").symlink_to(precious)
    with pytest.raises(store.StoreError, match="symbolic link or a folder"):
        store.write_text_atomic(tmp_path / "link", "x")
    assert precious.read_text() == "keep"


def test_versioned_documents_refuse_other_formats_versions_and_torn_files(tmp_path):
    path = tmp_path / "doc.json"
    store.write_json_atomic(path, {"entries": [1, 2]}, format="airgraph-test", version=2)
    assert store.read_json(path, format="airgraph-test", version=2)["entries"] == [1, 2]
    with pytest.raises(store.StoreError, match="expected a 'airgraph-kernels' document, found 'airgraph-test'"):
        store.read_json(path, format="airgraph-kernels", version=2)
    with pytest.raises(store.StoreError, match="version 2, this airgraph reads version 3"):
        store.read_json(path, format="airgraph-test", version=3)
    path.write_text(path.read_text()[:20])  # torn
    with pytest.raises(store.StoreError, match="not a readable JSON document"):
        store.read_json(path, format="airgraph-test", version=2)


def test_digest_is_the_files_sha256(tmp_path):
    import hashlib

    path = tmp_path / "blob"
    path.write_bytes(b"x" * 3_000_000)
    assert store.file_digest(path) == hashlib.sha256(b"x" * 3_000_000).hexdigest()


def _append_many(path: str, worker: int, count: int) -> None:
    for i in range(count):
        with store.locked(path):  # read-modify-write of a JSON document, then one appended record
            counter = Path(path + ".count")
            n = int(counter.read_text()) if counter.exists() else 0
            store.write_text_atomic(counter, str(n + 1))
            store.append_line(path, json.dumps({"worker": worker, "i": i}))


@pytest.mark.slow
def test_four_processes_under_the_lock_lose_nothing(tmp_path):
    path = str(tmp_path / "records.jsonl")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(path, w, 25)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in range(4) for i in range(25)]
    assert Path(path + ".count").read_text() == "100"


def test_a_lock_held_elsewhere_times_out_with_a_clear_error(tmp_path):
    from filelock import FileLock

    path = tmp_path / "library"
    other = FileLock(f"{path}.lock")
    other.acquire()  # another "process" (a separate lock object holds it)
    try:
        with pytest.raises(store.StoreError, match=r"library.lock for more than 0 s"), store.locked(path, timeout=0.05):
            pass
    finally:
        other.release()


def test_a_torn_last_record_stays_on_its_own_line(tmp_path):
    path = tmp_path / "bank.jsonl"
    store.append_line(path, '{"a": 1}')
    with open(path, "ab") as f:
        f.write(b'{"b": ')  # a writer killed mid-record
    store.append_line(path, '{"c": 3}')
    assert path.read_text().splitlines() == ['{"a": 1}', '{"b": ', '{"c": 3}']


def test_replace_dir_swaps_a_folder_whole(tmp_path):
    target = tmp_path / "kernels"
    target.mkdir()
    (target / "old.so").write_text("old")
    with store.staging_dir(target) as stage:
        (stage / "new.so").write_text("new")
        store.replace_dir(stage, target)
    assert sorted(p.name for p in target.iterdir()) == ["new.so"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels"]  # nothing staged or old left behind


def test_a_staging_folder_that_is_not_moved_is_removed(tmp_path):
    target = tmp_path / "kernels"
    with pytest.raises(RuntimeError, match="build failed"), store.staging_dir(target) as stage:
        (stage / "half.so").write_text("half")
        raise RuntimeError("build failed")
    assert list(tmp_path.iterdir()) == []


def test_only_a_pid_no_process_of_this_machine_has_is_dead(monkeypatch):
    assert store.process_alive(os.getpid()) and store.process_alive(os.getpid(), socket.gethostname())
    dead = exited_pid()
    assert not store.process_alive(dead) and not store.process_alive(dead, socket.gethostname())
    assert store.process_alive(dead, "another-host")  # cannot be checked from here

    def refused(pid: int, signal: int) -> None:
        raise PermissionError("not ours to signal")

    monkeypatch.setattr(os, "kill", refused)
    assert store.process_alive(dead)  # it exists
