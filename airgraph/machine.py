"""The machine and the software airgraph runs on: its one fingerprint, read once per process.

Every record that says what it is valid for takes its facts from :func:`fingerprint` and keeps the few it needs, in
the fields and order it has always written (bank file names, probe verdict keys, package manifests and benchmark
JSON stay byte for byte what earlier versions wrote; tests pin them):

- kernels/machine.py: what a static kernel was built for (versions, the CPU or the GPU, the C++ compiler);
- kernels/probe.py: what decides whether loading a package can crash (also the Python and torch's commit);
- tuning/env.py: what a measurement is valid for (also the intra-op thread count);
- bench/results.py: where a benchmark ran.

What costs something to read is read once per process: /proc/cpuinfo, the CUDA device's name and capability, and
the C++ compiler's ``--version`` (:func:`compiler`, only where a package is written, with a time limit of its own).
Versions and the thread count are read on each call: a process may change its thread count.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import airgraph

__all__ = ["CPUINFO", "Fingerprint", "compiler", "cpu", "fingerprint", "gpu"]

CPUINFO = Path("/proc/cpuinfo")  # Linux: the model name and the instruction-set flags of each core
VERSION_TIMEOUT = 10.0  # seconds ``<compiler> --version`` may take


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The facts of one device and of the software on it; each record keeps a view of them."""

    device_type: str
    torch: str
    airgraph: str
    cuda: str | None  # the CUDA version torch was built with
    git: str | None  # torch's commit
    python: str  # ``sys.version``
    python_version: str  # ``platform.python_version()``
    cpu: dict[str, Any]  # :func:`cpu`
    processor: str  # ``platform.processor()`` (often empty on Linux)
    cores: int | None
    threads: int  # intra-op threads (``torch.get_num_threads()``)
    gpu: dict[str, Any] | None  # :func:`gpu` of a CUDA device; None on the CPU or where CUDA is unavailable


def fingerprint(device: torch.device) -> Fingerprint:
    """The fingerprint of ``device`` and of the software running on it (a CUDA one's GPU is read only where CUDA is
    available: planning on fake CUDA tensors has none)."""
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    return Fingerprint(
        device_type=device.type,
        torch=torch.__version__,
        airgraph=airgraph.__version__,
        cuda=torch.version.cuda,
        git=getattr(torch.version, "git_version", None),
        python=sys.version,
        python_version=platform.python_version(),
        cpu=cpu(),
        processor=platform.processor(),
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        gpu=gpu(device) if on_gpu else None,
    )


@functools.cache
def _cpu() -> dict[str, Any]:
    model, flags = "", []
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:  # not Linux: what ``platform`` says
        text = ""
    for line in text.splitlines():  # the model name and the instruction-set flags of the first core
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = sorted(value.split())
    return {
        "type": "cpu",
        "machine": platform.machine(),
        "model": model or platform.processor() or platform.machine(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "flags": flags,
    }


def cpu() -> dict[str, Any]:
    """This CPU: its architecture (``platform.machine()``), model name, the vector ISA PyTorch's kernels use
    (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...) and its instruction-set flags (sorted); read
    once per process (a copy each call)."""
    facts = _cpu()
    return {**facts, "flags": list(facts["flags"])}


@functools.cache
def _gpu(index: int) -> dict[str, Any]:
    major, minor = torch.cuda.get_device_capability(index)
    return {
        "type": "cuda",
        "name": torch.cuda.get_device_name(index),
        "capability": f"{major}.{minor}",
        "cuda": torch.version.cuda,
    }


def gpu(device: torch.device) -> dict[str, Any]:
    """The CUDA device ``device`` (its index, else the current one): its name, compute capability and the CUDA
    version torch was built with; read once per process and device (a copy each call)."""
    return dict(_gpu(device.index if device.index is not None else torch.cuda.current_device()))


@functools.cache
def compiler() -> dict[str, Any] | None:
    """The C++ compiler Inductor compiles packages with here (its ``cpp.cxx``: ``CXX``, else ``g++``): the command,
    the file it resolves to and its ``--version`` line; None where none is found. Read once per process, with a time
    limit of its own: torch's own compiler search runs ``--version`` without one (a hung compiler wrapper would hang
    the caller) and may try to install one."""
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx
    candidates = [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    found = next(((c, p) for c in candidates if (p := shutil.which(c))), None)
    if found is None:
        return None
    command, path = found
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT)
        version = (done.stdout.strip().splitlines() or [""])[0]
    except (OSError, subprocess.SubprocessError):
        version = ""
    return {"command": command, "path": os.path.realpath(path), "version": version}
