"""Packages and the kernel library without torch: format, digests, atomic installs, crashes, concurrent installs.

The packages here are written by the real package writer with files of random bytes: installing never loads a
kernel, so what the files hold does not matter, only that their digests are checked and nothing is torn."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import zipfile
from pathlib import Path

import pytest

from airgraph.kernels.library import CLAIM_STALE_SECONDS, KernelLibrary
from airgraph.kernels.package import MANIFEST, KernelFiles, PackageError, read_manifest, verify, write_package
from airgraph.store import file_digest
from tests.helpers import exited_pid
from tests.kernels.conftest import run_python

BUILD = {"torch": "2.13.0+cpu", "airgraph": "0.1.0", "device": {"type": "cpu", "isa": "AVX512", "flags": []}}


def make_package(path: Path, kernels: dict[str, str], *, size: int = 4096, build: dict | None = None) -> Path:
    """A package at ``path`` with one kernel per ``{"<graph>/<shape>": built time}``, each a file of random bytes."""
    files = []
    for kid, built in kernels.items():
        graph, shape = kid.split("/")
        blob = path.parent / f".{path.stem}-{graph}-{shape}.bin"
        blob.write_bytes(os.urandom(size))
        info = {"built": built, "label": f"[{shape}]", "ops": 3}
        files.append(KernelFiles(graph, [["float32", [2, 16], [16, 1]]], shape, {"kernel.pt2": blob}, info))
    write_package(path, files, build or BUILD)
    return path


def check_library(library: KernelLibrary) -> dict:
    """Every indexed kernel's files exist and match their digests; no folder outside the index."""
    index = library.read_index()
    for entry in index["kernels"].values():
        for name, expected in entry["files"].items():
            assert file_digest(library.folder(entry) / name) == expected["sha256"]
    folders = {p.name for p in (library.root / "packages").iterdir()} if (library.root / "packages").exists() else set()
    assert folders == {e["package"] for e in index["kernels"].values()}
    return index


def test_a_package_holds_its_kernels_and_a_manifest_written_last(tmp_path):
    path = make_package(tmp_path / "static_kernel_1.zip", {"g1/s1": "2026-01-01T00:00:00", "g1/s2": "2026-01-01"})
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert names == ["kernels/g1/s1/kernel.pt2", "kernels/g1/s2/kernel.pt2", MANIFEST]
    manifest = read_manifest(path)
    assert manifest["format"] == "airgraph-kernel-package" and manifest["build"] == BUILD
    kernel = manifest["kernels"][0]
    assert (kernel["graph_key"], kernel["shape_id"], kernel["shape_key"]) == (
        "g1",
        "s1",
        [["float32", [2, 16], [16, 1]]],
    )
    assert kernel["files"]["kernel.pt2"]["size"] == 4096 and len(kernel["files"]["kernel.pt2"]["sha256"]) == 64
    verify(path, manifest)


def test_a_flipped_byte_or_a_torn_package_is_refused(tmp_path):
    path = make_package(tmp_path / "p.zip", {"g/s": "2026-01-01"})
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.zip"
    offset = data.index(b"kernels/g/s/kernel.pt2") + 200  # inside the first member's data
    data[offset] ^= 0xFF
    flipped.write_bytes(bytes(data))
    library = KernelLibrary(tmp_path / "lib")
    with pytest.raises(PackageError, match=r"kernels/g/s/kernel.pt2 (cannot be read|does not match its sha256)"):
        library.install(flipped)
    torn = tmp_path / "torn.zip"
    torn.write_bytes(path.read_bytes()[: len(data) // 2])
    with pytest.raises(PackageError, match="not a readable kernel package"):
        library.install(torn)
    assert library.read_index()["kernels"] == {}

    # A manifest that lies about a file's digest (the zip itself intact).
    manifest = read_manifest(path)
    manifest["kernels"][0]["files"]["kernel.pt2"]["sha256"] = "0" * 64
    lying = tmp_path / "lying.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(lying, "w") as dst:
        dst.writestr("kernels/g/s/kernel.pt2", src.read("kernels/g/s/kernel.pt2"))
        dst.writestr(MANIFEST, json.dumps(manifest))
    with pytest.raises(PackageError, match="does not match its sha256 in the manifest"):
        library.install(lying)


def test_install_twice_is_a_no_op_and_newer_builds_replace_older(tmp_path):
    library = KernelLibrary(tmp_path / "lib")
    old = make_package(tmp_path / "old.zip", {"g/a": "2026-01-01T00:00:00", "g/b": "2026-01-01T00:00:00"})
    first = library.install(old)
    assert sorted(first.added) == ["g/a", "g/b"] and not first.already
    index = check_library(library)
    again = library.install(old)
    assert again.already and again.added == [] and library.read_index() == index

    new = make_package(tmp_path / "new.zip", {"g/a": "2026-02-01T00:00:00"})
    result = library.install(new)
    assert result.added == ["g/a"]
    index = check_library(library)
    assert index["kernels"]["g/a"]["package"] == result.package
    assert index["kernels"]["g/b"]["package"] == first.package

    older = make_package(tmp_path / "older.zip", {"g/a": "2025-12-01T00:00:00"})
    assert library.install(older).kept == ["g/a"]
    assert check_library(library)["kernels"]["g/a"]["package"] == result.package


def test_remove_by_package_graph_or_all(tmp_path):
    library = KernelLibrary(tmp_path / "lib")
    one = library.install(make_package(tmp_path / "one.zip", {"g1/a": "2026-01-01", "g2/a": "2026-01-01"}))
    library.install(make_package(tmp_path / "two.zip", {"g2/b": "2026-01-01", "g3/a": "2026-01-01"}))
    assert library.remove(graph_key="g2") == ["g2/a", "g2/b"]
    assert sorted(check_library(library)["kernels"]) == ["g1/a", "g3/a"]
    assert library.remove(package=one.package[:5]) == ["g1/a"]
    assert sorted(check_library(library)["kernels"]) == ["g3/a"]
    with pytest.raises(ValueError, match="no graph key 'zz' in this library; known: g3"):
        library.remove(graph_key="zz")
    assert library.remove(everything=True) == ["g3/a"]
    assert check_library(library) == {
        "format": "airgraph-kernel-library",
        "version": 1,
        "kernels": {},
        "packages": {},
        "graphs": {},
    }


CRASH = """
import os, sys
import airgraph.kernels.library as library
if sys.argv[3] == "before-rename":
    library.replace_dir = lambda *args: os._exit(3)        # staged, not yet renamed into place
else:
    library.KernelLibrary._write = lambda *args: os._exit(3)  # renamed into place, index not yet written
library.KernelLibrary(sys.argv[1]).install(sys.argv[2])
"""


@pytest.mark.parametrize("when", ["before-rename", "before-index"])
def test_a_crash_mid_install_leaves_the_library_as_it_was(tmp_path, when):
    library = KernelLibrary(tmp_path / "lib")
    library.install(make_package(tmp_path / "base.zip", {"g/a": "2026-01-01"}))
    before = library.read_index()
    package = make_package(tmp_path / "next.zip", {"g/b": "2026-01-01", "g/c": "2026-01-01"})
    done = run_python(CRASH, str(library.root), str(package), when)
    assert done.returncode == 3, done.stderr
    assert library.read_index() == before  # readers see the library as it was: nothing of the new package
    leftovers = {p.name for p in (library.root / "packages").iterdir()} - {before["kernels"]["g/a"]["package"]}
    assert leftovers  # the crash left a staging folder or an unindexed package folder behind...
    result = library.install(package)  # ...which the next install removes, installing the package whole
    assert sorted(result.added) == ["g/b", "g/c"]
    assert sorted(check_library(library)["kernels"]) == ["g/a", "g/b", "g/c"]


def start_together(script: str, library: KernelLibrary, packages: list[Path]) -> list:
    """One process per package running ``script`` (argv: the library's folder, the package), each waiting for
    :func:`go`, so that they race."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-c", script, str(library.root)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return [subprocess.Popen([*command, str(p)], text=True, env=env, **pipes) for p in packages]


def go(procs: list) -> list[tuple[str, str]]:
    """Start the processes of :func:`start_together` at once; their (stdout, stderr), once all have exited."""
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return [proc.communicate(timeout=120) for proc in procs]


INSTALL = """
import sys
from airgraph.kernels.library import CLAIM_STALE_SECONDS, KernelLibrary
sys.stdin.readline()  # start together
print(KernelLibrary(sys.argv[1]).install(sys.argv[2]).added)
"""


def test_four_processes_installing_at_once_lose_nothing_and_tear_nothing(tmp_path):

    library = KernelLibrary(tmp_path / "lib")
    packages = [
        make_package(
            tmp_path / f"p{i}.zip",
            {f"g{i}/a": "2026-01-01", f"g{i}/b": "2026-01-01", "shared/s": f"2026-01-0{i + 1}T00:00:00"},
            size=1 << 18,
        )
        for i in range(4)
    ]
    newest = read_manifest(packages[3])["kernels"][2]["files"]
    procs = start_together(INSTALL, library, packages)
    problems: list[str] = []
    errors: list[BaseException] = []  # the reader's own (a torn index it cannot parse): a thread's are not the test's
    checked = [0]
    stop = threading.Event()

    def read_while_installing() -> None:  # a reader: every indexed file whole, or the index moved on
        try:
            while not stop.is_set():
                stamp, index = library.stamp(), library.read_index()
                for kid, entry in index["kernels"].items():
                    for name, expected in entry["files"].items():
                        try:
                            ok = file_digest(library.folder(entry) / name) == expected["sha256"]
                        except FileNotFoundError:
                            ok = library.stamp() != stamp  # replaced by a newer build since it was read
                        checked[0] += 1
                        if not ok:
                            problems.append(kid)
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read_while_installing)
    reader.start()
    outputs = go(procs)
    stop.set()
    reader.join()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outputs]
    assert not errors, errors
    assert problems == []
    assert checked[0] > 0  # the reader read files while the processes installed
    index = check_library(library)
    assert sorted(index["kernels"]) == sorted([f"g{i}/{s}" for i in range(4) for s in "ab"] + ["shared/s"])
    assert index["kernels"]["shared/s"]["files"] == newest  # the newest build of the shared kernel won
    assert len(index["packages"]) == 4
    assert not list(library.root.glob("packages/.*"))  # no staging folder left


def test_claims_make_one_builder_per_kernel(tmp_path):
    library = KernelLibrary(tmp_path / "lib")
    assert library.claim("g/a") == "claimed"
    assert library.claim("g/a") == "claimed"  # this process holds it already
    holder = run_python(
        "import sys; from airgraph.kernels.library import KernelLibrary as L; print(L(sys.argv[1]).claim('g/b'))",
        str(library.root),
    )
    assert holder.stdout.strip() == "claimed"
    assert library.claim("g/b") == "claimed"  # its holder has exited: the claim is stale
    library.release("g/a")
    library.install(make_package(tmp_path / "p.zip", {"g/a": "2026-01-01"}))
    assert library.claim("g/a") == "installed"
    assert not library.held_by_other("g/b")


def test_a_claim_holds_while_its_process_runs_and_another_hosts_until_it_is_stale(tmp_path):
    library = KernelLibrary(tmp_path / "lib")
    here, dead, now = socket.gethostname(), exited_pid(), time.time()
    owners = {
        "g/live": {"pid": os.getppid(), "host": here, "time": now - 2 * CLAIM_STALE_SECONDS},
        "g/exited": {"pid": dead, "host": here, "time": now},
        "g/remote": {"pid": dead, "host": "another-host", "time": now},
        "g/remote-stale": {"pid": dead, "host": "another-host", "time": now - CLAIM_STALE_SECONDS - 1},
    }
    (library.root / "claims").mkdir(parents=True)
    for kid, owner in owners.items():
        (library.root / "claims" / f"{kid.replace('/', '-')}.json").write_text(json.dumps(owner))
    held = {"g/live": True, "g/exited": False, "g/remote": True, "g/remote-stale": False}
    assert {kid: library.held_by_other(kid) for kid in owners} == held
    assert {kid: library.claim(kid) for kid in owners} == {k: "taken" if h else "claimed" for k, h in held.items()}


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _rebuild(path: Path, original: Path, kid: str, built: str) -> Path:
    """A package at ``path`` holding kernel ``kid`` with the very bytes of ``original`` (a deterministic rebuild)."""
    graph, shape = kid.split("/")
    files = {"kernel.pt2": original}
    write_package(path, [KernelFiles(graph, [["float32", [2, 16], [16, 1]]], shape, files, {"built": built})], BUILD)
    return path


def test_a_damaged_entry_is_replaced_by_a_repair_even_with_the_same_bytes(tmp_path):
    """A rebuild of a damaged kernel may give the very bytes installed (same digests, same build time): an ordinary
    install keeps the damaged entry (it looks installed), a repair of that entry's package replaces it, once."""
    library = KernelLibrary(tmp_path / "lib")
    first = library.install(make_package(tmp_path / "p1.zip", {"g/a": "2026-01-01", "g/b": "2026-01-01"}))
    entry = library.read_index()["kernels"]["g/a"]
    assert library.damage(entry) is None
    damaged = library.folder(entry) / "kernel.pt2"
    _flip_middle_byte(damaged)
    assert library.damage(entry) == "its file kernel.pt2 does not match its sha256 (corrupted or changed after install)"
    assert library.damage(library.read_index()["kernels"]["g/b"]) is None
    same = tmp_path / ".p1-g-a.bin"  # make_package's bytes of g/a

    plain = library.install(_rebuild(tmp_path / "plain.zip", same, "g/a", "2026-01-01"))
    assert plain.kept == ["g/a"] and library.read_index()["kernels"]["g/a"]["package"] == first.package

    repair = library.install(
        _rebuild(tmp_path / "repair.zip", same, "g/a", "2026-01-01"), repairs={"g/a": first.package}
    )
    assert repair.added == ["g/a"]
    index = check_library(library)  # every indexed file intact, no folder outside the index
    assert index["kernels"]["g/a"]["package"] == repair.package and index["kernels"]["g/b"]["package"] == first.package
    assert library.damage(index["kernels"]["g/a"]) is None
    # The damaged file stays where it was, unreferenced, for as long as its package serves another kernel.
    assert damaged.read_bytes() != same.read_bytes() and damaged.stat().st_size == same.stat().st_size

    # A repair of the old entry that comes late (another process repaired it first) changes nothing.
    late = library.install(_rebuild(tmp_path / "late.zip", same, "g/a", "2026-01-01"), repairs={"g/a": first.package})
    assert late.kept == ["g/a"] and check_library(library)["kernels"]["g/a"]["package"] == repair.package
    library.remove(package=first.package)
    assert not damaged.exists() and sorted(check_library(library)["kernels"]) == ["g/a"]


def test_a_missing_file_is_damage(tmp_path):
    library = KernelLibrary(tmp_path / "lib")
    library.install(make_package(tmp_path / "p.zip", {"g/a": "2026-01-01"}))
    entry = library.read_index()["kernels"]["g/a"]
    (library.folder(entry) / "kernel.pt2").unlink()
    assert library.damage(entry) == "its file kernel.pt2 is missing (deleted after install)"


HOLD = """
import sys
from airgraph.kernels.library import CLAIM_STALE_SECONDS, KernelLibrary
print(KernelLibrary(sys.argv[1]).claim(sys.argv[2], replacing=sys.argv[3]), flush=True)
sys.stdin.readline()  # holds the claim until told
"""


def test_claims_to_build_a_damaged_entry_again(tmp_path):
    import subprocess
    import sys

    library = KernelLibrary(tmp_path / "lib")
    old = library.install(make_package(tmp_path / "p1.zip", {"g/a": "2026-01-01"})).package
    assert library.claim("g/a") == "installed"  # intact or not, an ordinary claim finds it installed
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(library.root), "g/a", old],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        assert library.claim("g/a", replacing=old) == "taken"  # a live process is building it again
    finally:
        holder.communicate("done\n", timeout=60)
    assert library.claim("g/a", replacing=old) == "claimed"  # its holder exited without installing: stale claim
    repaired = library.install(make_package(tmp_path / "p2.zip", {"g/a": "2026-01-01"}), repairs={"g/a": old})
    library.release("g/a")
    assert repaired.added == ["g/a"]
    # A process that read the index before that repair (it found the old package's files damaged) asks too late.
    assert library.claim("g/a", replacing=old) == "installed"
    assert not (library.root / "claims" / "g-a.json").exists()


REPAIR = """
import sys, time
from airgraph.kernels.library import CLAIM_STALE_SECONDS, KernelLibrary
library = KernelLibrary(sys.argv[1])
sys.stdin.readline()  # start together
entry = library.read_index()["kernels"]["g/a"]
if library.damage(entry) is None:
    print("intact")
    sys.exit()
answer = library.claim("g/a", replacing=entry["package"])
if answer == "claimed":
    time.sleep(1.0)  # building
    result = library.install(sys.argv[2], repairs={"g/a": entry["package"]})
    library.release("g/a")
    answer = "claimed " + result.package
print(answer)
"""


def test_processes_finding_the_same_damaged_entry_build_it_again_once(tmp_path):
    """Four processes find g/a's file damaged at once: one claims it and installs its rebuild; the others run on
    (the claim is taken, or the entry was replaced meanwhile, or they read the repaired index); nothing torn."""

    library = KernelLibrary(tmp_path / "lib")
    library.install(make_package(tmp_path / "p.zip", {"g/a": "2026-01-01", "g/b": "2026-01-01"}))
    before = library.read_index()
    _flip_middle_byte(library.folder(before["kernels"]["g/a"]) / "kernel.pt2")
    rebuilds = [make_package(tmp_path / f"r{i}.zip", {"g/a": "2026-01-01"}) for i in range(4)]
    procs = start_together(REPAIR, library, rebuilds)
    outputs = go(procs)
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outputs]
    answers = [out.strip() for out, _ in outputs]
    claimed = [a.split()[1] for a in answers if a.startswith("claimed")]
    assert len(claimed) == 1, answers
    assert set(answers) - {f"claimed {claimed[0]}"} <= {"taken", "installed", "intact"}
    index = check_library(library)
    assert index["kernels"]["g/a"]["package"] == claimed[0]
    assert index["kernels"]["g/b"] == before["kernels"]["g/b"]
    assert not list(library.root.glob("claims/*.json")) and not list(library.root.glob("packages/.*"))
