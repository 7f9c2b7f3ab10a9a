"""What a static kernel was built for, and whether this machine can run it.

A static kernel is machine code: Inductor compiles C++ with ``-march=native`` (the build machine's instruction
set) and Triton kernels for one GPU architecture, against one torch's ABI. Every package and library entry
therefore carries :func:`describe` of its build, and a kernel is loaded only where :func:`mismatch` finds
nothing:

- torch and airgraph versions: equal (the kernels call into torch's C++ ABI; airgraph's graph keys may change);
- CPU: the same architecture and vector ISA, and every instruction-set flag the build machine had (a model name
  is recorded too, but two models with the same flags run the same code);
- CUDA: the same compute capability (the cubins' architecture); the device name is recorded, and the CUDA
  version comes with the torch version (``2.11.0+cu128``).

The C++ compiler Inductor built with (:func:`compiler`) is recorded beside them but not compared: a package it
compiles may still crash the loader (seen on an H200 machine whose ``CXX`` was a wrapper script around g++ 13.3
with its own ``-B`` and ``-isystem`` folders: packages it linked killed ``AOTIModelPackageLoader``; the same
packages built with the system g++ 13.3 loaded and ran), which only loading it tells: kernels/probe.py keys its
verdict by it.

:func:`cpu` and :func:`gpu` are airgraph's one reader of the machine's facts: the tuning bank's environment
(tuning/env.py) and the load probe's (kernels/probe.py) take theirs from here.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

import airgraph

__all__ = ["CPUINFO", "build_record", "compiler", "cpu", "describe", "gpu", "mismatch"]

CPUINFO = Path("/proc/cpuinfo")  # Linux: the model name and the instruction-set flags of each core
VERSION_TIMEOUT = 10.0  # seconds ``<compiler> --version`` may take


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
    the file it resolves to and its ``--version`` line; None where none is found. Read once per process and only
    where a package is written (:func:`build_record`), with a time limit of its own: torch's own compiler search
    runs ``--version`` without one (a hung compiler wrapper would hang the caller) and may try to install one."""
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


def describe(device: torch.device) -> dict[str, Any]:
    """What kernels compiled here for ``device`` need of a machine: versions and the device's description."""
    target = gpu(device) if device.type == "cuda" else cpu()
    return {"torch": torch.__version__, "airgraph": airgraph.__version__, "device": target}


def build_record(device: torch.device) -> dict[str, Any]:
    """The build record a package carries: :func:`describe`, and the C++ compiler that built it (recorded, not
    compared: kernels/probe.py keys its verdict by it)."""
    return {**describe(device), "compiler": compiler()}


def mismatch(built: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why kernels built as ``built`` (a :func:`describe` record) cannot run ``here``; None when they can."""
    for field in ("torch", "airgraph"):
        if built.get(field) != here.get(field):
            return f"built for {field} {built.get(field)}, this is {field} {here.get(field)}"
    b, h = built.get("device") or {}, here.get("device") or {}
    if b.get("type") != h.get("type"):
        return f"built for a {b.get('type')} device, this segment runs on {h.get('type')}"
    if h.get("type") == "cuda":
        if b.get("capability") != h.get("capability"):
            return (
                f"built for CUDA compute capability {b.get('capability')} ({b.get('name')}), this GPU is "
                f"{h.get('capability')} ({h.get('name')})"
            )
        return None
    for field in ("machine", "isa"):
        if b.get(field) != h.get(field):
            return f"built for CPU {field} {b.get(field)}, this CPU has {h.get(field)}"
    missing = sorted(set(b.get("flags") or ()) - set(h.get("flags") or ()))
    if missing:
        shown = ", ".join(missing[:6]) + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        return f"built on a CPU with instruction-set flags this CPU lacks: {shown}"
    return None
