"""Inductor's CPU instruction-set checks, made once per environment instead of once per process.

Before Inductor compiles or loads a C++ kernel (a hit of its FX graph cache included) it makes its list of the
vector instruction sets (AVX2, AVX512, VNNI, AMX, ...) that work here (``cpu_vec_isa.valid_vec_isa_list``, cached
for the process): for each one the CPU's flags name, ``VecISA.check_build(code)`` compiles a tiny program and
loads it in a child Python, ten of them on the development CPU: 1.5 to 2.3 s of every warm process there
(docs/design/warm-start.md).

The answers depend on the environment only: torch's build, Python, the CPU (model, flags) and the C++ compiler
(the command, the file it resolves to, its size and time). So while airgraph compiles a graph, ``check_build``
answers from a record of the environment (``inductor-isa.json`` in the compile cache, ``write_json_atomic`` under
its lock) and runs for real only where the record lacks the check, whose answer is then recorded: the first
process of an environment records, a later one gets the same list and the same side effects (bf16 and AMX-fp16
support) without a child process. ``check_build`` is torch's again after the compile, and Inductor's configuration
is untouched (its FX graph cache keys digest it). A user's own ``cpp.vec_isa_ok`` (``TORCHINDUCTOR_VEC_ISA_OK``)
is left alone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from airgraph import machine
from airgraph.cache.folder import ISA_FILE
from airgraph.store import StoreError, locked, read_json, write_json_atomic

__all__ = ["FILE", "known_isa"]

FILE = ISA_FILE
FORMAT = "airgraph-inductor-isa"
VERSION = 1


@functools.cache
def _environment() -> tuple[str, dict[str, Any]]:
    from torch._inductor import config as inductor_config

    facts = machine.fingerprint(torch.device("cpu"))
    cxx = inductor_config.cpp.cxx
    compilers = []
    for command in [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]:
        found = shutil.which(command)
        if found:
            stat = os.stat(found)
            compilers.append([command, os.path.realpath(found), stat.st_size, int(stat.st_mtime)])
    env = {
        "torch": facts.torch,
        "git": facts.git,
        "python": facts.python,
        "cpu": {k: facts.cpu[k] for k in ("machine", "model", "isa", "flags")},
        "compilers": compilers,
    }
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16], env


def _isa_module() -> Any | None:
    """torch's ``cpu_vec_isa``, where it has what this module relies on (None: nothing is done)."""
    try:
        from torch._inductor import cpu_vec_isa
    except ImportError:  # pragma: no cover - a torch without it
        return None
    listing = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    vec = getattr(cpu_vec_isa, "VecISA", None)
    if listing is None or not hasattr(listing, "cache_info") or not callable(getattr(vec, "check_build", None)):
        return None
    return cpu_vec_isa


def _check_key(isa: Any, code: str) -> str:
    flags = getattr(isa, "_arch_flags", "")  # with a sub-check's own flags added (avx512bf16, amx-fp16)
    return f"{type(isa).__name__}|{flags}|{hashlib.sha256(code.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def _checks(module: Any, answers: dict[str, bool], record: bool) -> Iterator[None]:
    """``VecISA.check_build`` answering from ``answers`` (the rest for real; ``record``: put each real answer in
    them) for the duration."""
    vec = module.VecISA
    real: Callable[[Any, str], bool] = vec.check_build

    def check_build(self: Any, code: str) -> bool:
        key = _check_key(self, code)
        if key in answers:
            return answers[key]
        result = real(self, code)
        if record:
            answers[key] = bool(result)
        return result

    vec.check_build = check_build
    try:
        yield
    finally:
        vec.check_build = real


@contextlib.contextmanager
def known_isa(root: str | os.PathLike[str] | None) -> Iterator[None]:
    """For the duration, Inductor's instruction-set checks answer from the record in ``root`` (None: nothing is
    done); the answers of checks that ran for real are recorded there afterwards. Nothing runs unless Inductor
    makes its list meanwhile (a graph served by static kernels alone never does)."""
    module = _isa_module()
    if root is None or module is None or module.valid_vec_isa_list.cache_info().currsize:
        yield  # no cache, an unknown torch, or a list this process already has
        return
    from torch._inductor import config as inductor_config

    if inductor_config.cpp.vec_isa_ok is not None:
        yield
        return
    path = Path(root) / FILE
    try:
        digest, env = _environment()
        recorded = _read(path, digest) or {}
    except OSError:
        yield
        return
    answers = dict(recorded)
    try:
        with _checks(module, answers, record=True):
            yield
    finally:
        if answers != recorded and module.valid_vec_isa_list.cache_info().currsize:
            _write(path, digest, env, answers, [str(isa) for isa in module.valid_vec_isa_list()])


def _read(path: Path, digest: str) -> dict[str, bool] | None:
    try:
        record = read_json(path, format=FORMAT, version=VERSION).get("environments", {}).get(digest)
    except (StoreError, AttributeError):
        return None
    except FileNotFoundError:
        return None
    checks = record.get("checks") if isinstance(record, dict) else None
    if not isinstance(checks, dict) or not all(isinstance(v, bool) for v in checks.values()):
        return None
    return checks


def _write(path: Path, digest: str, env: dict[str, Any], answers: dict[str, bool], valid: list[str]) -> None:
    # A cache this process cannot write: the checks run again in the next process too.
    with contextlib.suppress(OSError, StoreError), locked(path):
        try:
            environments = read_json(path, format=FORMAT, version=VERSION).get("environments", {})
        except (OSError, StoreError):
            environments = {}
        if not isinstance(environments, dict):
            environments = {}
        shown = {k: v for k, v in env.items() if k != "cpu"} | {"cpu": env["cpu"]["model"]}
        environments[digest] = {"checks": answers, "valid": valid, "environment": shown}
        write_json_atomic(path, {"environments": environments}, format=FORMAT, version=VERSION)
