"""The load probe (kernels/probe.py): the first load of a package in an environment happens in a child process.

A child that dies (here it kills itself with SIGSEGV, as the package loader did on the H100 machine) leaves a
"crashed" verdict beside the library, one warning per process, and every segment on its dynamic kernels; a child
that loads and runs the real package leaves "ok", and later processes load without a probe. Child launches are
counted by wrapping ``probe._launch``; a "new process" is this one with the probe's per-process caches emptied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from airgraph.backend import AirgraphBackend
from airgraph.kernels import probe
from airgraph.kernels import static as static_module
from airgraph.kernels.static import StaticKernels
from airgraph.log import forget_warnings
from airgraph.machine import compiler
from tests.kernels.conftest import BATCHES, ROOT, run_step, static_config
from tests.kernels.test_static_kernels import library_copy

CPU = torch.device("cpu")
SEGFAULT = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
CRASH_WARNING = r"loading an AOTInductor package crashed a child process \(SIGSEGV\)"


@pytest.fixture
def launches(monkeypatch) -> list:
    """A fresh process as far as the probe knows (no verdict cached; nothing warned: tests/conftest.py); every child
    it starts."""
    monkeypatch.setattr(probe, "_VERDICTS", {})
    started: list = []
    launch = probe._launch

    def counting(command, timeout):
        started.append(command)
        return launch(command, timeout)

    monkeypatch.setattr(probe, "_launch", counting)
    return started


def child_runs(monkeypatch, code: str) -> None:
    """Make the probe's child ``python -c code`` instead of loading the package."""
    monkeypatch.setattr(probe, "_command", lambda kernel, device, shape_key: [sys.executable, "-c", code])


def verdicts(library: Path) -> list[dict]:
    document = json.loads((library / probe.FILE).read_text())
    assert document["format"] == probe.FORMAT
    return list(document["probes"].values())


def forget(monkeypatch) -> None:
    """As if a new process started: the probe's verdicts and airgraph's warn-once keys forgotten."""
    monkeypatch.setattr(probe, "_VERDICTS", {})
    forget_warnings()


@pytest.mark.slow
def test_a_child_crashing_on_load_leaves_every_process_on_dynamic_kernels(built, tmp_path, monkeypatch, launches):
    library = library_copy(built, tmp_path)
    (library / probe.FILE).unlink()  # no verdict yet for this environment
    child_runs(monkeypatch, SEGFAULT)
    loaded: list = []
    monkeypatch.setattr(static_module, "_load_aoti", lambda *args: loaded.append(args))
    config = static_config(tmp_path, library_dir=str(library), build=False)
    with pytest.warns(UserWarning, match=CRASH_WARNING) as caught:
        run_step(AirgraphBackend(config), BATCHES)  # results equal eager (run_step checks)
    crashes = [str(w.message) for w in caught if "crashed a child process" in str(w.message)]
    assert len(crashes) == 1 and str(library / probe.FILE) in crashes[0] and torch.__version__ in crashes[0]
    assert not [str(w.message) for w in caught if "not used:" in str(w.message)]  # one for the environment
    assert len(launches) == 1 and loaded == []  # the child died, this process loaded nothing
    (verdict,) = verdicts(library)
    assert (verdict["verdict"], verdict["cause"], verdict["returncode"]) == ("crashed", "SIGSEGV", -11)
    assert verdict["environment"]["torch"] == torch.__version__

    torch._dynamo.reset()  # a second backend in this process: no probe, no second warning, dynamic kernels
    backend = AirgraphBackend(config)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*crashed a child process.*")
        run_step(backend, BATCHES)
    (segment,) = backend.reports[0].segments
    assert segment.chosen_by == "config" and segment.source["dynamic_keys"] == ["[2]", "[3]"]
    assert len(launches) == 1 and loaded == []

    forget(monkeypatch)  # a later process: the verdict file says crashed, it warns once and loads nothing
    kernels = StaticKernels(config)
    kernel = built.kernel("[2]")
    with pytest.warns(UserWarning, match=CRASH_WARNING):
        assert kernels.load(kernel["graph_key"], kernel["shape_id"], CPU) is None
    assert len(launches) == 1 and loaded == []


@pytest.mark.slow
def test_the_child_loads_and_runs_the_real_package_and_later_processes_trust_it(built, tmp_path, monkeypatch, launches):
    (verdict,) = verdicts(built.library)  # the building process loaded its kernels: the probe ran first
    ids = {f"{k['graph_key']}/{k['shape_id']}" for k in built.manifest["kernels"]}
    assert (verdict["verdict"], verdict["returncode"], verdict["kernel"] in ids) == ("ok", 0, True)
    (probed,) = (k for k in built.manifest["kernels"] if f"{k['graph_key']}/{k['shape_id']}" == verdict["kernel"])
    tensors = sum(isinstance(k, list) for k in probed["shape_key"])
    assert verdict["child"] == {"loaded": "kernel.pt2", "inputs": tensors, "outputs": 1}  # loaded, ran once
    assert verdict["environment"]["torch"] == torch.__version__ and verdict["environment"]["device_type"] == "cpu"
    assert verdict["environment"]["compiler"] == compiler() and compiler()["version"]  # what built the package

    library = library_copy(built, tmp_path)  # a later process of this environment: reads "ok", loads in-process
    kernels = StaticKernels(static_config(tmp_path, library_dir=str(library), build=False))
    kernel = built.kernel("[3]")
    assert kernels.load(kernel["graph_key"], kernel["shape_id"], CPU) is not None
    assert launches == []

    (library / probe.FILE).unlink()  # deleted: the next process probes again, with the real child
    forget(monkeypatch)
    gone = tmp_path / "gone"  # from a working folder removed meanwhile (torch's import in it would exit 2)
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    kernels = StaticKernels(static_config(tmp_path, library_dir=str(library), build=False))
    assert kernels.load(kernel["graph_key"], kernel["shape_id"], CPU) is not None
    assert len(launches) == 1 and launches[0][1:3] == ["-m", "airgraph.kernels.probe"]
    (verdict,) = verdicts(library)
    assert verdict["verdict"] == "ok" and verdict["kernel"] == f"{kernel['graph_key']}/{kernel['shape_id']}"


@pytest.mark.parametrize(
    "content",
    [
        "{torn",
        json.dumps({"format": "something-else", "version": 1, "probes": {}}),
        json.dumps({"format": probe.FORMAT, "version": 99, "probes": {}}),
        json.dumps({"format": probe.FORMAT, "version": 1, "probes": ["ok"]}),
        "SAME-DIGEST-GARBAGE",
    ],
    ids=["torn", "other-format", "newer-version", "probes-not-a-dict", "entry-not-a-verdict"],
)
def test_a_corrupt_verdict_file_is_probed_again_and_rewritten(tmp_path, monkeypatch, launches, content):
    if content == "SAME-DIGEST-GARBAGE":
        digest = probe._digest(probe.environment(CPU))
        content = json.dumps({"format": probe.FORMAT, "version": 1, "probes": {digest: {"verdict": "maybe"}}})
    (tmp_path / probe.FILE).write_text(content)
    child_runs(monkeypatch, "pass")
    verdict = probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU)
    assert verdict.status == "ok" and len(launches) == 1
    (record,) = verdicts(tmp_path)
    assert record["verdict"] == "ok"
    forget(monkeypatch)
    assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "ok"
    assert len(launches) == 1  # the rewritten file is read: no second child


def test_a_child_that_hangs_counts_as_crashed(tmp_path, monkeypatch, launches):
    child_runs(monkeypatch, "import time; time.sleep(60)")
    monkeypatch.setattr(probe, "TIMEOUT", 1.0)
    with pytest.warns(UserWarning, match=r"crashed a child process \(timed out after 1 s\)") as caught:
        assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "crashed"
        assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "crashed"
    assert len(caught) == 1 and len(launches) == 1
    (record,) = verdicts(tmp_path)
    assert (record["verdict"], record["returncode"]) == ("crashed", None)
    forget(monkeypatch)  # a later process reads the verdict and warns once too
    with pytest.warns(UserWarning, match=r"crashed a child process \(timed out after 1 s\)") as again:
        assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "crashed"
        assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "crashed"
    assert len(again) == 1 and len(launches) == 1


def test_a_crash_is_kept_per_build_compiler_and_its_warning_names_the_compiler(tmp_path, monkeypatch, launches):
    """On the H200 machine packages built by its ``CXX`` wrapper crashed the loader and the system g++'s loaded:
    the verdict of one compiler's packages says nothing about another's, and the warning says which built them."""
    wrapper = {"command": "/opt/gcc/bin/g++", "path": "/opt/gcc/bin/g++", "version": "g++-real (Ubuntu) 13.3.0"}
    system = {"command": "g++", "path": "/usr/bin/x86_64-linux-gnu-g++-13", "version": "g++ (Ubuntu) 13.3.0"}
    probes, kernel = probe.LoadProbes(tmp_path), tmp_path / "kernel.pt2"
    child_runs(monkeypatch, SEGFAULT)
    with pytest.warns(UserWarning, match=CRASH_WARNING) as caught:
        assert probes.check(kernel, [], CPU, "a/1", wrapper).status == "crashed"
    (message,) = [str(w.message) for w in caught]
    assert "built with the C++ compiler /opt/gcc/bin/g++ (/opt/gcc/bin/g++, g++-real (Ubuntu) 13.3.0)" in message
    assert "set CXX, then rebuild the library" in message
    child_runs(monkeypatch, "pass")
    assert probes.check(kernel, [], CPU, "b/1", system).status == "ok"  # probed on its own: its own verdict
    assert probes.check(kernel, [], CPU, "a/2", wrapper).status == "crashed"  # the wrapper's verdict stands
    assert len(launches) == 2
    records = {r["kernel"]: r for r in verdicts(tmp_path)}
    assert records["a/1"]["environment"]["compiler"] == wrapper and records["a/1"]["verdict"] == "crashed"
    assert records["b/1"]["environment"]["compiler"] == system and records["b/1"]["verdict"] == "ok"


def test_a_child_that_raises_refuses_that_kernel_and_records_nothing(tmp_path, monkeypatch, launches):
    child_runs(monkeypatch, "raise SystemExit('RuntimeError: this file is not a package')")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a crash: no warning from the probe (the loader's caller warns)
        verdict = probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU)
    assert verdict.status == "failed" and verdict.cause == "exit 1: RuntimeError: this file is not a package"
    assert not (tmp_path / probe.FILE).exists()
    assert probe.LoadProbes(tmp_path).check(tmp_path / "kernel.pt2", [], CPU).status == "failed"
    assert len(launches) == 2  # nothing learned about the environment: the next kernel probes again


RACER = """
import sys
from pathlib import Path
import torch
from airgraph.kernels import probe
child = "import os, sys, time; open(sys.argv[1], 'a').write(str(os.getpid()) + chr(10)); time.sleep(1)"
probe._command = lambda kernel, device, shape_key: [sys.executable, "-c", child, sys.argv[2]]
print(probe.LoadProbes(sys.argv[1]).check(Path(sys.argv[1]) / "kernel.pt2", [], torch.device("cpu")).status)
"""


def test_processes_starting_together_probe_once_and_tear_nothing(tmp_path):
    children = tmp_path / "children.txt"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(children)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(3)
    ]
    outputs = [racer.communicate(timeout=120) for racer in racers]
    assert [(r.returncode, o.strip()) for r, (o, _) in zip(racers, outputs, strict=True)] == [(0, "ok")] * 3, outputs
    assert len(children.read_text().splitlines()) == 1  # one child for the three processes
    (record,) = verdicts(tmp_path)
    assert record["verdict"] == "ok"


def test_a_package_holding_a_torn_json_file_fails_its_build(tmp_path):
    """Two processes building the same code at once once packaged an empty metadata file (kernels/build.py)."""
    from airgraph.kernels.build import check_package

    path = tmp_path / "kernel.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("kernel/data/aotinductor/model/x.wrapper_metadata.json", '{"AOTI_DEVICE_KEY": "cpu"}')
    check_package(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("kernel/data/aotinductor/model/x.kernel_metadata.json", "")
    with pytest.raises(RuntimeError, match=r"torn file, kernel/data/aotinductor/model/x\.kernel_metadata\.json"):
        check_package(path)
