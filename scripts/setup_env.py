"""Set up the project's virtual environment (what `make setup` runs): ``python scripts/setup_env.py VENV``.

The environment sees the packages of the Python that made it, so an installed torch (the GPU machine's, with its
CUDA build) is used as it is:

- the venv is made with ``--system-site-packages``; when that Python is itself a virtual environment (the GPU
  machine's torch lives in one), whose packages a nested venv would not see, a ``.pth`` file adds its
  site-packages too;
- when every requirement of airgraph and its test extras is already installed (pyproject.toml says which),
  nothing is downloaded: airgraph is linked into the venv as pip's editable install would link it (a ``.pth``
  pointing at the checkout, a ``dist-info`` with its entry points, so ``torch.compile(backend="airgraph")`` and
  the ``airgraph`` command work). A machine without a package registry (the GPU machine) needs nothing else;
- otherwise pip installs what is missing: ``torch==2.13.0`` (the CPU build, from the wheel the development
  machines keep) only when no torch >= 2.11 is importable, then airgraph with its test extras, editable.

``--torch VERSION`` makes an environment for one supported torch (CI tests the oldest and the newest, each in its
own; ``make test-fast TORCH=2.15.0``): run by the project venv's Python, the new venv sees every package of that
venv and gets that torch of its own from the package index (PyPI's build, with the CUDA libraries it loads at
import even on a CPU), plus whichever of torch's requirements the project venv does not satisfy.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_TORCH = (2, 11)


def _project() -> dict:
    import tomllib  # Python 3.11+; on 3.10 the caller falls back to pip

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


NAME_END = r"[<>=!~ \[]"  # what ends a distribution's name in a requirement ("torch>=2.11", "onnx[reference]")


def _distribution(spec: str) -> str:
    """The distribution a requirement (or a "missing" line of :func:`missing_requirements`) names."""
    return re.split(NAME_END, spec, maxsplit=1)[0]


def _run(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True)


def _site_packages(python: Path) -> Path:
    out = _run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    return Path(out.stdout.strip())


def make_venv(path: Path) -> Path:
    """The venv at ``path`` (made if missing) that sees this Python's packages; its python."""
    python = path / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=True, symlinks=os.name != "nt").create(path)
    if sys.prefix != sys.base_prefix:  # a venv's own packages are not "system" packages to a nested venv
        parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
        (_site_packages(python) / "_airgraph_parent_env.pth").write_text("".join(f"{p}\n" for p in parents))
    return python


def missing_requirements(python: Path) -> list[str]:
    """The requirements of airgraph and its test extras that ``python`` lacks (by distribution, with versions)."""
    project = _project()
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    check = textwrap.dedent(
        f"""
        import importlib.metadata as md, re
        try:
            from packaging.requirements import Requirement
        except ImportError:
            Requirement = None
        missing = []
        for spec in {wanted!r}:
            name = re.split({NAME_END!r}, spec, maxsplit=1)[0]
            try:
                version = md.version(name)
            except md.PackageNotFoundError:
                missing.append(spec)
                continue
            if Requirement is not None and not Requirement(spec).specifier.contains(version, prereleases=True):
                missing.append(f"{{spec}} (found {{version}})")
        print("\\n".join(missing))
        """
    )
    out = _run(python, check)
    if out.returncode != 0:
        raise SystemExit(f"setup: could not check the installed packages:\n{out.stderr}")
    return [line for line in out.stdout.splitlines() if line]


def link_airgraph(python: Path) -> None:
    """airgraph from this checkout, as an editable install links it, without pip or a package index."""
    project = _project()
    purelib = _site_packages(python)
    (purelib / "_airgraph_checkout.pth").write_text(f"{ROOT}\n")
    info = purelib / f"airgraph-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: airgraph\nVersion: {project['version']}\n")
    (info / "INSTALLER").write_text("airgraph scripts/setup_env.py\n")
    entry_points = ["[console_scripts]", *(f"{k} = {v}" for k, v in project["scripts"].items()), ""]
    for group, points in project["entry-points"].items():
        entry_points += [f"[{group}]", *(f"{k} = {v}" for k, v in points.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(entry_points))
    (info / "RECORD").write_text("")
    for name, target in project["scripts"].items():
        module, _, func = target.partition(":")
        script = python.parent / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
        script.chmod(0o755)


def pip_install(python: Path) -> None:
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    probe = (
        "import sys\ntry:\n    import torch\nexcept ImportError:\n    sys.exit(2)\n"
        "sys.exit(3 if tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) < {} else 0)"
    )
    found = _run(python, probe.format(MIN_TORCH))
    if found.returncode == 3:
        version = _run(python, "import torch; print(torch.__version__)").stdout.strip()
        raise SystemExit(f"airgraph needs torch >= {'.'.join(map(str, MIN_TORCH))}; found {version}")
    if found.returncode != 0:  # no torch: the CPU build, from the wheel the development machines keep
        subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[test]"], check=True)


def install_torch(python: Path, version: str) -> None:
    """``torch==version`` into the venv of ``python`` (with what it requires that the venv lacks)."""
    have = _run(python, "import importlib.metadata as md; print(md.version('torch'))").stdout.strip()
    if have.split("+")[0] != version:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={version}"], check=True)


def main(argv: list[str]) -> int:
    args = list(argv[1:])
    torch_version = None
    if args[:1] == ["--torch"]:
        torch_version, args = args[1], args[2:]
    path = Path(args[0] if args else ROOT / ".venv")
    python = make_venv(path)
    if torch_version is not None:
        install_torch(python, torch_version)
    try:
        missing = missing_requirements(python)
    except ImportError:  # no tomllib (Python 3.10): pip decides
        missing = ["(not checked)"]
    if missing:
        print(f"setup: installing with pip (missing: {', '.join(missing)})", flush=True)
        try:
            pip_install(python)
        except subprocess.CalledProcessError:
            # A machine without a package index (the GPU machine lacks ruff and mpich, extras only): airgraph runs
            # without its extras, so it is linked all the same; what the extras serve (lint, MPI ranks) is skipped.
            core = {_distribution(spec) for spec in _project()["dependencies"]}
            if missing == ["(not checked)"] or any(_distribution(m) in core for m in missing):
                raise
            print(
                f"setup: pip could not install the extras {', '.join(missing)} (no package index?); airgraph "
                "linked from the checkout without them",
                flush=True,
            )
            link_airgraph(python)
    else:
        print("setup: every requirement is installed already; airgraph linked from the checkout (no pip)", flush=True)
        link_airgraph(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
