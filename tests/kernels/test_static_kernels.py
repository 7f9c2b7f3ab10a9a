"""Static kernels end to end on the CPU: records, the package of a process, using installed kernels (nothing compiled),
refusing ones built elsewhere, lazily compiled dynamic kernels, reduce-overhead, reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.compat import torchair as tng
from airgraph.kernels.dispatch import RECHECK_SECONDS
from airgraph.kernels.library import KernelLibrary
from airgraph.kernels.static import StaticKernels
from airgraph.runtime.simulated import SimulatedCuda
from airgraph.store import file_digest
from tests.helpers import assert_close
from tests.kernels.conftest import BATCHES, run_python, run_step, static_config
from tests.kernels.models import Step, inputs
from tests.kernels.test_library import HOLD


@pytest.fixture
def inductor_compiles(monkeypatch) -> list:
    """Every graph Inductor lowers in this process: dynamic kernels and static builds (AOTInductor) alike."""
    from torch._inductor.graph import GraphLowering

    calls: list = []
    original = GraphLowering.__init__

    def counting(self, gm, *args, **kwargs):
        calls.append(gm)
        original(self, gm, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "__init__", counting)
    return calls


def library_copy(built, tmp_path: Path) -> Path:
    target = tmp_path / "library"
    shutil.copytree(built.library, target, ignore=shutil.ignore_patterns("*.lock", "claims"))
    return target


def test_records_follow_the_seed_layout(tmp_path):
    """Records are written whatever runs the kernels (here nothing is built: the aten backend, build off)."""
    backend = AirgraphBackend(static_config(tmp_path, config={"kernel_backend": "aten"}, build=False))
    run_step(backend, (2, 3, 2))
    (outputs,) = (tmp_path / "static_kernel_outputs").glob("*_outputs")
    stamp, pid, suffix = outputs.name.split("_")
    assert (len(stamp), pid, suffix) == (20, str(os.getpid()), "outputs")
    kernel_dir, debug_dir = outputs / pid, outputs / f"{pid}_debug"
    kernel_files = {p.name for p in kernel_dir.iterdir()}
    debug_files = {p.name for p in debug_dir.iterdir()}
    assert {"relu_float32_contiguous_2_16_0.json", "relu_float32_contiguous_3_16_0.json"} <= kernel_files
    assert kernel_files < debug_files  # the debug folder also has the views
    assert any(name.startswith(("permute_", "t_")) for name in debug_files - kernel_files)
    relu = json.loads((kernel_dir / "relu_float32_contiguous_3_16_0.json").read_text())
    assert relu["format"] == "airgraph-op-record" and relu["op"] == "aten.relu.default"
    expected = {"dtype": "float32", "shape": [3, 16], "stride": [16, 1], "layout": "contiguous", "device": "cpu"}
    assert relu["inputs"] == [expected] and relu["outputs"] == [expected]
    assert relu["args"] == {"self": {"input": 0}} and relu["count"] == 1 and relu["segment"] == 0
    summed = json.loads((kernel_dir / "sum_float32_contiguous_8_16_0.json").read_text())
    assert summed["count"] == 2  # the same shapes in both keys' runs (the third call was batch 2 again: not new)
    assert summed["args"]["dim"] == [0] and summed["outputs"][0]["shape"] == [16]
    assert not list(outputs.glob("static_kernel_*.zip"))  # nothing built


@pytest.mark.slow
def test_a_process_writes_one_package_and_installs_it(built):
    assert [p.name for p in built.outputs.glob("static_kernel_*.zip")] == [built.package.name]
    manifest = built.manifest
    assert sorted(k["label"] for k in manifest["kernels"]) == ["[2]", "[3]"]
    assert len({k["graph_key"] for k in manifest["kernels"]}) == 1
    build = manifest["build"]
    assert build["torch"] == torch.__version__ and build["airgraph"] == airgraph.__version__
    assert build["device"]["type"] == "cpu" and build["device"]["isa"] == torch.backends.cpu.get_cpu_capability()
    kernel = built.kernel("[3]")
    assert ["int64", [3], [1]] in kernel["shape_key"] and kernel["build_seconds"] > 0
    # The Dynamo graph can warm-start on these kernels; its first trace (the embedding's float an input) restarted.
    restart, record = sorted(manifest["graphs"].values(), key=lambda r: "inputs" in r)
    assert record["graph_key"] == restart["graph_key"] == kernel["graph_key"]
    assert len(record["inputs"]) == len(kernel["shape_key"]) and len(restart["restart"]) == 1
    library = KernelLibrary(built.library)
    index = library.read_index()
    assert sorted(index["kernels"]) == sorted(f"{k['graph_key']}/{k['shape_id']}" for k in manifest["kernels"])
    for entry in index["kernels"].values():
        path = library.folder(entry) / "kernel.pt2"
        assert file_digest(path) == entry["files"]["kernel.pt2"]["sha256"]
    (segment,) = built.backend.reports[0].segments
    assert (segment.backend, segment.chosen_by) == ("static_kernels", "static_kernels")
    assert segment.source["static_keys"] == ["[2]", "[3]"] and segment.source["dynamic_keys"] == []


FRESH = """
import json, sys, warnings
import torch
import torch._dynamo.backends.common as common
from torch._inductor.graph import GraphLowering
lowered, traced = [], []
original, aot = GraphLowering.__init__, common.aot_module_simplified
def counting(self, *args, **kwargs):
    lowered.append(1)
    original(self, *args, **kwargs)
GraphLowering.__init__ = counting
common.aot_module_simplified = lambda *args, **kwargs: traced.append(1) or aot(*args, **kwargs)
import airgraph.kernels.probe as probe
launched, launch = [], probe._launch
probe._launch = lambda *args: launched.append(1) or launch(*args)
from airgraph.compat.torchair import CompilerConfig, get_npu_backend
from tests.kernels.models import Step, inputs
config = CompilerConfig()
config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = sys.argv[1]
backend = get_npu_backend(compiler_config=config)
model, reference = Step(), Step()
compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
diffs = []
with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # a refused kernel would warn
    for batch in (2, 3, 2):
        x, pos = inputs(batch)
        diffs.append((compiled(x, pos) - reference(x, pos)).abs().max().item())
        diffs.append((model.cache - reference.cache).abs().max().item())
segment = backend.reports[0].segments[0]
print(json.dumps({"lowered": len(lowered), "traced": len(traced), "diff": max(diffs), "chosen_by": segment.chosen_by,
                  "probes": len(launched), **segment.source}))
"""


@pytest.mark.slow
def test_a_fresh_process_with_the_library_compiles_nothing_and_equals_eager(built, tmp_path):
    build_dir = tmp_path / "serving"
    build_dir.mkdir()
    library = library_copy(built, build_dir)
    library.rename(build_dir / "static_kernel_library")
    done = run_python(FRESH, str(build_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lowered"] == 0  # Inductor lowered no graph: every key ran a prebuilt kernel
    assert result["traced"] == 0  # not even AOTAutograd traced one: a warm start, with the float restart asked at once
    assert result["diff"] <= 1e-5
    assert result["probes"] == 0  # the library's verdict for this environment (kernels/probe.py) said "ok"
    assert result["chosen_by"] == "static_kernels" and result["static_keys"] == ["[2]", "[3]"]
    assert result["dynamic_keys"] == [] and result["warm_start"]  # not even traced to ATen (kernels/warm.py)


def _edit_index(library: Path, edit) -> None:
    path = library / "index.json"
    index = json.loads(path.read_text())
    for entry in index["kernels"].values():
        edit(entry)
    path.write_text(json.dumps(index))


def _repackage(package: Path, target: Path, edit) -> Path:
    """``package`` with its build record changed by ``edit`` (as if built elsewhere); files and digests intact."""
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(target, "w") as dst:
        manifest = json.loads(src.read("manifest.json"))
        for name in src.namelist()[:-1]:
            dst.writestr(name, src.read(name))
        edit(manifest)
        dst.writestr("manifest.json", json.dumps(manifest))
    return target


def _other_isa(build: dict) -> None:
    build["device"]["isa"] = "AVX2" if build["device"]["isa"] != "AVX2" else "AVX512"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda build: build.__setitem__("torch", "2.11.0+cpu"), r"built for torch 2\.11\.0\+cpu, this is"),
        (_other_isa, r"built for CPU isa AVX"),
        (lambda build: build["device"]["flags"].append("amx_tile_x"), "flags this CPU lacks: amx_tile_x"),
        ("flip", r"its file kernel.pt2 does not match its sha256"),
    ],
    ids=["torch-version", "isa", "isa-flag", "flipped-byte"],
)
def test_a_kernel_built_elsewhere_or_corrupted_is_refused_once(built, tmp_path, change, reason):
    library = tmp_path / "library"
    if change == "flip":  # a byte of an installed kernel changes on disk
        library = library_copy(built, tmp_path)
        for path in library.glob("packages/*/*/*/kernel.pt2"):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x01
            path.write_bytes(bytes(data))
    else:  # a package built on another machine, installed here
        package = _repackage(built.package, tmp_path / "elsewhere.zip", lambda m: change(m["build"]))
        assert KernelLibrary(library).install(package).added
    kernels = StaticKernels(static_config(tmp_path, library_dir=str(library), build=False))
    kernel = built.kernel("[2]")
    with pytest.warns(UserWarning, match=reason) as caught:
        assert kernels.load(kernel["graph_key"], kernel["shape_id"], torch.device("cpu")) is None
    assert len(caught) == 1 and f"{kernel['graph_key']}/{kernel['shape_id']}" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: asking again is quiet
        assert kernels.load(kernel["graph_key"], kernel["shape_id"], torch.device("cpu")) is None


def _flip_middle_byte(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def _shipped_library(built, build_dir: Path) -> KernelLibrary:
    """The session's package installed as a serving machine gets it: one package folder holding both kernels."""
    library = KernelLibrary(build_dir / "static_kernel_library")
    assert sorted(library.install(built.package).added) == sorted(library.read_index()["kernels"])
    return library


def _intact(library: KernelLibrary) -> dict:
    index = library.read_index()
    assert [kid for kid, e in index["kernels"].items() if library.damage(e) is not None] == []
    return index


@pytest.mark.slow
def test_a_damaged_kernel_is_built_again_and_the_next_process_is_warm(built, tmp_path):
    """Issue #20: a byte flipped in the middle of the largest file of an installed library. With building on, that
    kernel is built again and installed (a new package, atomically, as any install), the results equal eager, and
    the next process, a fresh one, warm-starts on every kernel with no warning and compiles nothing."""
    build_dir = tmp_path / "serving"
    library = _shipped_library(built, build_dir)
    index = library.read_index()
    largest = max((p for p in library.root.glob("packages/**/*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = _flip_middle_byte(largest)
    (damaged,) = [kid for kid, e in index["kernels"].items() if largest == library.folder(e) / "kernel.pt2"]

    backend = AirgraphBackend(static_config(tmp_path / "rebuild", library_dir=str(library.root), build=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_step(backend, BATCHES)  # equals eager
    about = [str(w.message) for w in caught if damaged in str(w.message)]
    assert len(about) == 1 and "does not match its sha256" in about[0] and "building it again" in about[0]
    after = _intact(library)
    assert after["kernels"][damaged]["package"] not in index["packages"]  # a new package answers it
    assert {k: e for k, e in after["kernels"].items() if k != damaged} == {
        k: e for k, e in index["kernels"].items() if k != damaged
    }
    assert largest.read_bytes() == data  # the damaged file stays where it was while its package serves the other key

    done = run_python(FRESH, str(build_dir))  # warnings are errors there
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["lowered"], result["traced"], result["probes"]) == (0, 0, 0) and result["warm_start"]
    assert result["static_keys"] == ["[2]", "[3]"] and result["dynamic_keys"] == [] and result["diff"] <= 1e-5


@pytest.mark.slow
def test_a_damaged_key_leaves_the_warm_start_to_its_other_keys(built, tmp_path, inductor_compiles):
    """With building on, the warm start steps aside for the damaged key only: batch 2 runs warm, batch 3 (its file
    damaged) compiles the graph the ordinary way, which builds its kernel again and runs it."""
    library = _shipped_library(built, tmp_path / "serving")
    kid = f"{built.kernel('[3]')['graph_key']}/{built.kernel('[3]')['shape_id']}"
    _flip_middle_byte(library.folder(library.read_index()["kernels"][kid]) / "kernel.pt2")
    backend = AirgraphBackend(static_config(tmp_path / "run", library_dir=str(library.root), build=True))
    with pytest.warns(UserWarning, match="building it again") as caught:
        run_step(backend, BATCHES)
    about = [str(w.message) for w in caught if kid in str(w.message)]
    assert len(about) == 1 and "building it again" in about[0]
    warm, ordinary = (r.segments[0] for r in backend.reports)
    assert warm.source.get("warm_start") and warm.source["static_keys"] == ["[2]"]
    assert ordinary.source["static_keys"] == ["[3]"] and ordinary.source["dynamic_keys"] == []
    assert len(inductor_compiles) == 1  # the rebuild (AOTInductor); no dynamic kernel
    _intact(library)


@pytest.mark.slow
def test_a_process_finding_a_damaged_kernel_rebuilt_elsewhere_waits_then_switches(built, tmp_path):
    """Two processes find the same kernel damaged: the one that does not hold the claim builds nothing, leaves the
    library alone and runs the dynamic kernel, then switches to the repaired kernel once the other installed it."""
    library = _shipped_library(built, tmp_path / "serving")
    index = library.read_index()
    kid = f"{built.kernel('[2]')['graph_key']}/{built.kernel('[2]')['shape_id']}"
    old = index["kernels"][kid]["package"]
    _flip_middle_byte(library.folder(index["kernels"][kid]) / "kernel.pt2")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-c", HOLD, str(library.root), kid, old]
    holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "claimed"  # the other process, building it again
        backend = AirgraphBackend(static_config(tmp_path / "run", library_dir=str(library.root), build=True))
        model, reference = Step(), Step()
        compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
        tokens, pos = inputs(2)
        with torch.no_grad(), pytest.warns(UserWarning, match="not used: its file kernel.pt2 does not match") as caught:
            assert_close(compiled(tokens, pos), reference(tokens, pos))
        assert not [w for w in caught if "building it again" in str(w.message)]
        assert backend.reports[-1].segments[0].source["dynamic_keys"] == ["[2]"]
        assert library.read_index() == index  # this process built and installed nothing
        repair = shutil.copy(built.package, tmp_path / "static_kernel_elsewhere.zip")  # what the other one built
        assert library.install(repair, repairs={kid: old}).added == [kid]
    finally:
        holder.communicate("done\n", timeout=60)
    time.sleep(RECHECK_SECONDS)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(compiled(tokens, pos), reference(tokens, pos))
    assert_close(model.cache, reference.cache)
    source = backend.reports[-1].segments[0].source
    assert (source["static_keys"], source["dynamic_keys"]) == (["[2]"], [])


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flip", "delete"])
@pytest.mark.parametrize("build", [False, True], ids=["building-off", "building-on"])
def test_a_damaged_or_missing_kernel_file_is_refused_or_built_again(built, tmp_path, damage, build):
    """Without building, a damaged or deleted file is refused with one warning, the results equal eager and the
    library stays as it is; with building on, that kernel is built again (the file of the first shape run)."""
    library = _shipped_library(built, tmp_path / "serving")
    index = library.read_index()
    kid = f"{built.kernel('[2]')['graph_key']}/{built.kernel('[2]')['shape_id']}"
    path = library.folder(index["kernels"][kid]) / "kernel.pt2"
    if damage == "flip":
        _flip_middle_byte(path)
        reason = "its file kernel.pt2 does not match its sha256"
    else:
        path.unlink()
        reason = "its file kernel.pt2 is missing"
    files = sorted((p, p.stat().st_mtime_ns) for p in library.root.glob("packages/**/*"))
    backend = AirgraphBackend(static_config(tmp_path / "run", library_dir=str(library.root), build=build))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_step(backend, BATCHES)  # equals eager
    (about,) = [str(w.message) for w in caught if kid in str(w.message)]
    assert reason in about
    if build:
        assert "building it again" in about
        assert _intact(library)["kernels"][kid]["package"] != index["kernels"][kid]["package"]
    else:
        assert "not used" in about and "the segment runs its dynamic kernels" in about
        assert library.read_index() == index
        assert sorted((p, p.stat().st_mtime_ns) for p in library.root.glob("packages/**/*")) == files


@pytest.mark.slow
def test_a_refused_kernel_leaves_the_segment_to_its_dynamic_kernel(built, tmp_path, inductor_compiles):
    library = library_copy(built, tmp_path)
    _edit_index(library, lambda entry: entry["build"].__setitem__("airgraph", "0.0.1"))
    backend = AirgraphBackend(static_config(tmp_path, library_dir=str(library), build=False))
    with pytest.warns(UserWarning, match="built for airgraph 0.0.1") as caught:
        run_step(backend, (2, 2))
    assert len([w for w in caught if "not used" in str(w.message)]) == 1
    (segment,) = backend.reports[0].segments
    assert (segment.backend, segment.chosen_by, segment.source["dynamic_keys"]) == ("inductor", "config", ["[2]"])
    assert len(inductor_compiles) == 1


@pytest.mark.slow
def test_a_key_missing_from_the_library_compiles_its_dynamic_kernel_then_only(built, tmp_path, inductor_compiles):
    backend = AirgraphBackend(static_config(tmp_path, library_dir=str(library_copy(built, tmp_path)), build=False))
    run_step(backend, BATCHES)
    assert inductor_compiles == []  # every key so far in the library: nothing compiled, not even lazily
    assert [r.segments[0].source.get("warm_start") is not None for r in backend.reports] == [True]
    run_step(backend, (4,))  # a new key: the graph compiles again, the ordinary way; its dynamic kernel now
    assert len(inductor_compiles) == 1
    warm, ordinary = (r.segments[0] for r in backend.reports)
    assert warm.chosen_by == "static_kernels" and warm.source["static_keys"] == ["[2]", "[3]"]
    assert (ordinary.chosen_by, ordinary.source["dynamic_keys"]) == ("config", ["[4]"])
    assert list((tmp_path / "static_kernel_outputs").glob("*_outputs/*/relu_float32_contiguous_4_16_0.json"))


@pytest.mark.slow
def test_a_warm_process_that_builds_a_new_key_keeps_the_warm_start_records(built, tmp_path):
    """Batch 2 and 3 run warm, batch 4 compiles the graph again and builds its kernel: the package installed records
    the graph as it is (not as a frame Dynamo restarted, which made every later process trace it through
    AOTAutograd), and a fresh process still warm-starts."""
    build_dir = tmp_path / "serving"
    library = _shipped_library(built, build_dir)
    graphs = library.read_index()["graphs"]
    backend = AirgraphBackend(static_config(tmp_path / "run", library_dir=str(library.root), build=True))
    run_step(backend, (*BATCHES, 4))
    assert [r.segments[0].source.get("warm_start") is not None for r in backend.reports] == [True, False]
    index = _intact(library)
    assert len(index["kernels"]) == 3 and index["graphs"] == graphs
    done = run_python(FRESH, str(build_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["lowered"], result["traced"]) == (0, 0) and result["warm_start"]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "simulated-cuda"])
def test_reduce_overhead_runs_static_kernels_captured_or_not(built, tmp_path, device, inductor_compiles):
    config = static_config(
        tmp_path, config={"mode": "reduce-overhead"}, library_dir=str(library_copy(built, tmp_path)), build=False
    )
    runtime = SimulatedCuda() if device == "simulated-cuda" else None
    backend = AirgraphBackend(config, runtime=runtime)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*reduce-overhead captures CUDA graphs.*")
        run_step(backend, (2, 3, 2, 3, 3))
    (report,) = backend.reports
    assert report.captured is (device == "simulated-cuda") and report.capture_keys == (2 if runtime else 0)
    assert report.segments[0].source["static_keys"] == ["[2]", "[3]"] and inductor_compiles == []


@pytest.mark.slow
def test_explain_and_inspect_show_the_keys_that_run_static_kernels(built, tmp_path, monkeypatch, capsys):
    from airgraph.cli import main

    monkeypatch.setenv("AIRGRAPH_STATIC_KERNELS", "1")
    monkeypatch.setenv("AIRGRAPH_STATIC_KERNELS_BUILD", "0")
    monkeypatch.setenv("AIRGRAPH_STATIC_KERNELS_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("AIRGRAPH_KERNEL_LIBRARY", str(library_copy(built, tmp_path)))
    tokens, pos = inputs(3)
    torch._dynamo.mark_dynamic(tokens, 0)  # the batch varies: the graph the library's kernels were built for
    with torch.no_grad():  # an inference graph: static kernels cover inference (training graphs: their kernels)
        report = airgraph.explain(Step(), tokens, pos, config=tng.CompilerConfig())
    segment = report.to_dict()["graphs"][0]["segments"][0]
    assert (segment["chosen_by"], segment["source"]["static_keys"]) == ("static_kernels", ["[3]"])
    script = tmp_path / "example.py"
    script.write_text(
        "import torch\n"
        "from tests.kernels.models import Step, inputs\n"
        "def airgraph_example():\n"
        "    tokens, pos = inputs(2)\n"
        "    torch._dynamo.mark_dynamic(tokens, 0)\n"
        "    return Step(), (tokens, pos)\n"
    )
    assert main(["inspect", str(script)]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.count("static_kernels") == 2]  # its backend and chosen_by
    assert row and "[2]" in out
