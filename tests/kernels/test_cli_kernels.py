"""``airgraph kernels install / list / remove``, as on a serving machine that never compiled."""

from __future__ import annotations

import json

import pytest
import torch

from airgraph.cli import main
from airgraph.kernels.library import KernelLibrary
from airgraph.kernels.machine import describe
from tests.kernels.conftest import run_python
from tests.kernels.test_library import make_package


def test_install_list_remove(tmp_path, capsys):
    library = tmp_path / "lib"
    package = make_package(tmp_path / "static_kernel_20260101.zip", {"g1/a": "2026-01-01", "g2/b": "2026-01-02"})
    assert main(["kernels", "install", str(package), "--library", str(library)]) == 0
    assert "2 kernel(s) added" in capsys.readouterr().out
    assert main(["kernels", "install", str(package), "--library", str(library)]) == 0
    assert "already installed" in capsys.readouterr().out

    assert main(["kernels", "list", str(library)]) == 0
    out = capsys.readouterr().out
    for text in ("graph", "shapes", "device", "size", "built", "g1", "g2", "[a]", "[b]", "4 KiB", "2 kernel(s) for 2"):
        assert text in out
    assert main(["kernels", "list", str(library), "--json"]) == 0
    index = json.loads(capsys.readouterr().out)
    assert sorted(index["kernels"]) == ["g1/a", "g2/b"]

    assert main(["kernels", "remove", "--graph", "g1", "--library", str(library)]) == 0
    assert "removed 1 kernel(s)" in capsys.readouterr().out
    assert sorted(KernelLibrary(library).read_index()["kernels"]) == ["g2/b"]
    assert main(["kernels", "remove", "--all", "--library", str(library)]) == 0
    assert main(["kernels", "list", str(library)]) == 0
    assert "no kernels installed" in capsys.readouterr().out


def test_errors_name_the_problem(tmp_path, capsys):
    library = str(tmp_path / "lib")
    assert main(["kernels", "install", str(tmp_path / "missing.zip"), "--library", library]) == 2
    assert "missing.zip: no such package file" in capsys.readouterr().err
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    assert main(["kernels", "install", str(bad), "--library", library]) == 1
    assert "package refused: " in capsys.readouterr().err
    assert main(["kernels", "remove", "nothing", "--library", library]) == 2
    assert "no installed package 'nothing'" in capsys.readouterr().err
    assert main(["kernels", "remove", "x", "--all"]) == 2  # one of them only
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_default_library_comes_from_the_configuration(tmp_path):
    package = make_package(tmp_path / "p.zip", {"g/a": "2026-01-01"})
    done = run_python(
        "import sys; from airgraph.cli import main; sys.exit(main(['kernels', 'install', sys.argv[1]]))",
        str(package),
        env={"AIRGRAPH_STATIC_KERNELS_BUILD_DIR": str(tmp_path / "build")},
    )
    assert done.returncode == 0, done.stderr
    assert "g/a" in KernelLibrary(tmp_path / "build" / "static_kernel_library").read_index()["kernels"]


@pytest.mark.slow
def test_list_check_says_whether_this_machine_runs_each_kernel(built, tmp_path, capsys):
    library = str(tmp_path / "lib")
    assert main(["kernels", "install", str(built.package), "--library", library]) == 0
    capsys.readouterr()
    assert main(["kernels", "list", library, "--check"]) == 0
    out = capsys.readouterr().out
    assert "runs here" in out and out.count("yes") == 2 and "[2]" in out and "[3]" in out
    here = describe(torch.device("cpu"))  # this torch and CPU, but a build that names no CPU architecture
    foreign_build = {**here, "device": {k: v for k, v in here["device"].items() if k != "machine"}}
    foreign = make_package(tmp_path / "foreign.zip", {"g9/a": "2026-01-01"}, build=foreign_build)
    assert main(["kernels", "install", str(foreign), "--library", library]) == 0
    capsys.readouterr()
    assert main(["kernels", "list", library, "--check"]) == 1
    out = capsys.readouterr().out
    assert out.count("yes") == 2 and "g9/a does not run here: built for CPU machine None" in out
    kid = f"{built.kernel('[3]')['graph_key']}/{built.kernel('[3]')['shape_id']}"
    kernels = KernelLibrary(library)
    path = kernels.folder(kernels.read_index()["kernels"][kid]) / "kernel.pt2"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # a byte of an installed kernel changes on disk
    path.write_bytes(bytes(data))
    assert main(["kernels", "list", library, "--check"]) == 1
    out = capsys.readouterr().out
    assert out.count("yes") == 1 and f"{kid} does not run here: its file kernel.pt2 does not match its sha256" in out
