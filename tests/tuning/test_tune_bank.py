"""The tuning bank's promises: merged under its lock (concurrent writers lose nothing), readable after a kill
mid-write, corrupt records skipped with one warning naming file and line, other versions never used."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from airgraph.store import StoreError, append_line
from airgraph.tuning.bank import FORMAT, TUNED, UNSATISFIED, Bank, BankFile, Entry, bank_file_name

ENV = {"device_type": "cpu", "device": "test cpu", "isa": "AVX2", "threads": 2, "torch": "2.13.0", "airgraph": "0.1.0"}


def entry(key: str, *, after: float = 5.0, choice: str | None = "onednn-packed", base: str | None = None) -> Entry:
    return Entry(
        key=key,
        kind="op",
        status=TUNED if choice else UNSATISFIED,
        base=base or f"base-{key}",
        name=f"layer/{key}",
        op_type="addmm",
        candidates=1,
        choice={"tune_mode": "Impl", "name": choice, "options": {"impl": choice}} if choice else None,
        before_us=10.0,
        after_us=after if choice else 10.0,
    )


def test_commit_adds_updates_and_reserves(tmp_path):
    bank = Bank(tmp_path).file_for(ENV, "d1")
    assert bank.commit(entry("k1", after=6.0)) == "add"
    assert bank.commit(entry("k1", after=7.0, choice="mkl-packed")) == "reserved"  # slower: the entry stays
    assert bank.commit(entry("k1", after=4.0, choice="mkl-packed")) == "update"
    assert bank.commit(entry("k1", after=3.0, choice="mkl-packed")) == "reserved"  # same choice
    assert bank.commit(entry("k2", choice=None)) == "unsatisfied"
    assert bank.commit(entry("k1", choice=None)) == "reserved"  # an entry is never replaced by a memo
    assert bank.commit(entry("k2", choice=None)) == "reserved"  # the memo was in the bank: it stays
    assert bank.commit(entry("k2", after=9.0)) == "update"  # a choice replaces the memo the bank had
    lines = bank.path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header == {"format": FORMAT, "version": 1, "env": ENV}
    assert len(lines) == 1 + 4  # add, update, memo, update: reserved writes nothing
    assert BankFile(bank.path).env == ENV  # another process: the header names the environment, before any lookup
    reread = BankFile(bank.path)
    assert reread.lookup("k1").choice["name"] == "mkl-packed" and reread.lookup("k1").after_us == 4.0
    assert reread.env == ENV and reread.lookup("k2").status == TUNED


def _writer(folder: str, worker: int, count: int) -> None:
    bank = Bank(folder).file_for(ENV, "d1")
    for i in range(count):
        bank.commit(entry(f"w{worker}-{i}"))  # distinct entries
        bank.commit(entry("shared", after=float(100 - worker * 10 - i), choice=f"c{worker}-{i}"))  # ever faster


def test_concurrent_writers_lose_nothing(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(str(tmp_path), w, 15)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    entries = BankFile(Bank(tmp_path).file_for(ENV, "d1").path).entries()
    assert {f"w{w}-{i}" for w in range(4) for i in range(15)} <= set(entries)
    assert entries["shared"].after_us == min(100 - w * 10 - i for w in range(4) for i in range(15))
    lines = (tmp_path / bank_file_name(ENV, "d1")).read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # no interleaved halves
    assert sum(json.loads(line).get("key") == "w0-0" for line in lines) == 1


KILL_WRITER = """
import sys
from airgraph.tuning.bank import Bank, Entry
bank = Bank(sys.argv[1]).file_for({"device_type": "cpu", "torch": "x"}, "d1")
i = 0
while True:
    bank.commit(Entry(key=f"k{i}", kind="op", status="tuned", base="b", name="n" * 4000, op_type="mm",
                      candidates=1, choice={"tune_mode": "Impl", "name": "x", "options": {}}, before_us=2.0,
                      after_us=1.0))
    i += 1
    if i == 20:
        print("ready", flush=True)
"""


def test_a_writer_killed_mid_write_leaves_every_completed_entry(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    path = next(tmp_path.glob("*.jsonl"))
    if path.read_bytes().endswith(b"\n"):  # the kill fell between two records: tear the last one ourselves
        with open(path, "ab") as f:
            f.write(b'{"key": "torn", "kind": "op", "sta')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bank = BankFile(path)
        entries = bank.entries()
    complete = len(path.read_bytes().split(b"\n")) - 2  # header and the torn tail
    assert len(entries) == complete >= 20
    assert not caught  # a torn last line is not read yet (it may still be being written)
    with pytest.warns(UserWarning, match=rf"{path.name}:{complete + 2}: corrupt tuning bank record skipped"):
        assert bank.commit(entry("after-the-crash")) == "add"  # appending puts the torn line on its own
    reread = BankFile(path).entries()
    assert "after-the-crash" in reread and len(reread) == complete + 1


def test_a_corrupt_record_is_skipped_with_one_warning_naming_file_and_line(tmp_path):
    bank = Bank(tmp_path).file_for(ENV, "d1")
    bank.commit(entry("a"))
    with open(bank.path, "a") as f:
        f.write('{"key": "b", "kind": "op"}\n')  # a record missing fields
        f.write("not json at all\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bank.commit(entry("c"))  # the writer reads them first
        entries = BankFile(bank.path).entries()
        BankFile(bank.path).entries()  # read again in this process: no second warning
    assert sorted(entries) == ["a", "c"]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert f"{bank.path}:3: corrupt tuning bank record skipped (missing after_us, base" in messages[0]
    assert f"{bank.path}:4: corrupt tuning bank record skipped" in messages[1]


def test_another_version_or_device_is_never_used_and_counted_stale(tmp_path):
    old_env = {**ENV, "torch": "2.12.0"}
    old = Bank(tmp_path).file_for(old_env, "old")
    old.commit(entry("k-old", base="unit-1"))
    bank = Bank(tmp_path)
    current = bank.file_for(ENV, "new")
    assert current.lookup("k-old") is None  # another environment's file is never read for lookups
    assert bank.stale_bases(current, {"op": 1}) == {"unit-1"}
    current.commit(entry("k-new", base="unit-2"))
    outdated = entry("k-cand", base="unit-3")
    outdated.candidates = 0  # measured with an older candidate set
    current.commit(outdated)
    assert bank.stale_bases(current, {"op": 1}) == {"unit-1", "unit-3"}
    counts = bank.prune([current], {"op": 1})
    assert counts == {"files_removed": 1, "kept": 1, "dropped": 2}
    assert [p.name for p in tmp_path.glob("*.jsonl")] == [current.path.name]
    assert set(BankFile(current.path).entries()) == {"k-new"}


def test_another_environments_file_is_read_once_then_only_what_is_appended(tmp_path, monkeypatch):
    other = Bank(tmp_path).file_for({**ENV, "torch": "2.12.0"}, "old")
    for i in range(3):
        other.commit(entry(f"k{i}", base=f"unit-{i}"))
    bank = Bank(tmp_path)
    current = bank.file_for(ENV, "new")
    parsed = []  # (file, line) of every line parsed from now on
    take = BankFile._take
    monkeypatch.setattr(
        BankFile, "_take", lambda self, raw, n: parsed.append((self.path.name, n)) or take(self, raw, n)
    )
    assert [f.path for f in bank.files()] == [other.path] and not parsed  # listing the files parses none
    assert bank.stale_bases(current, {"op": 1}) == {"unit-0", "unit-1", "unit-2"}
    assert parsed == [(other.path.name, n) for n in range(1, 5)]  # its header and records, once
    assert bank.stale_bases(current, {"op": 1}) == {"unit-0", "unit-1", "unit-2"}  # the tuner's next graph
    assert len(parsed) == 4
    append_line(other.path, entry("k3", base="unit-3").to_json())  # another process commits one more
    assert bank.stale_bases(current, {"op": 1}) == {"unit-0", "unit-1", "unit-2", "unit-3"}
    assert parsed[4:] == [(other.path.name, 5)]


def test_a_file_of_another_format_version_is_refused(tmp_path):
    path = tmp_path / bank_file_name(ENV, "d1")
    path.write_text(json.dumps({"format": FORMAT, "version": 99, "env": ENV}) + "\n" + entry("k").to_json() + "\n")
    bank = Bank(tmp_path).file_for(ENV, "d1")
    refused = "airgraph-tuning-bank version 99, this airgraph reads version 1; its records are not used"
    with pytest.warns(UserWarning, match=refused):
        assert bank.lookup("k") is None
    with pytest.raises(StoreError, match=rf"{refused}.*; remove it, or tune into another bank folder"):
        bank.commit(entry("k2"))
    assert path.read_text().count("\n") == 2  # untouched
    other = tmp_path / bank_file_name(ENV, "d2")  # the store's header check (airgraph/store.py), as every file's
    other.write_text(json.dumps({"format": "airgraph-kernel-index", "version": 1}) + "\n" + entry("k").to_json() + "\n")
    other_format = "expected a 'airgraph-tuning-bank' document, found 'airgraph-kernel-index'"
    with pytest.warns(UserWarning, match=other_format):
        assert Bank(tmp_path).file_for(ENV, "d2").lookup("k") is None


def test_a_bank_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "bank").write_text("")
    with pytest.raises(StoreError, match="is a file; give a folder"):
        Bank(Path(tmp_path / "bank"))


def test_a_commit_waits_for_the_lock_another_writer_holds(tmp_path):
    import threading

    from filelock import FileLock

    bank = Bank(tmp_path).file_for(ENV, "d1")
    other = FileLock(f"{bank.path}.lock")  # another process's lock object
    other.acquire()
    done = threading.Event()
    writer = threading.Thread(target=lambda: (bank.commit(entry("k")), done.set()))
    writer.start()
    try:
        assert not done.wait(0.5)  # the read-decide-append waits for the other writer
        assert not bank.path.exists()
    finally:
        other.release()
    writer.join(30)
    assert done.is_set() and "k" in BankFile(bank.path).entries()
