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

The C++ compiler Inductor built with (airgraph/machine.py ``compiler``) is recorded beside them but not compared:
a package it compiles may still crash the loader (seen on an H200 machine whose ``CXX`` was a wrapper script around
g++ 13.3 with its own ``-B`` and ``-isystem`` folders: packages it linked killed ``AOTIModelPackageLoader``; the
same packages built with the system g++ 13.3 loaded and ran), which only loading it tells: kernels/probe.py keys its
verdict by it.

The facts come from airgraph/machine.py, airgraph's one fingerprint; this module keeps the kernels' view of them.
"""

from __future__ import annotations

from typing import Any

import torch

from airgraph import machine

__all__ = ["build_record", "describe", "mismatch"]


def describe(device: torch.device) -> dict[str, Any]:
    """What kernels compiled here for ``device`` need of a machine: versions and the device's description."""
    facts = machine.fingerprint(device)
    target = facts.gpu if device.type == "cuda" else facts.cpu
    return {"torch": facts.torch, "airgraph": facts.airgraph, "device": target}


def build_record(device: torch.device) -> dict[str, Any]:
    """The build record a package carries: :func:`describe`, and the C++ compiler that built it (recorded, not
    compared: kernels/probe.py keys its verdict by it)."""
    return {**describe(device), "compiler": machine.compiler()}


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
