"""Where a benchmark result was measured (device, versions, commit, time), what compiling cost (Dynamo's and
Inductor's counters), what failed, and writing it as JSON.

The device and the versions are a view of airgraph/machine.py's fingerprint, in the fields results have always had.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any

import torch

import airgraph
from airgraph.machine import fingerprint
from airgraph.store import write_text_atomic

__all__ = ["counter_delta", "counters", "environment", "failure", "write_json"]


def environment(device: torch.device) -> dict[str, Any]:
    """Where a result was measured: device name, versions, commit, time."""
    facts = fingerprint(device)
    if facts.gpu is not None:
        name = facts.gpu["name"]
    else:
        name = f"{facts.processor or facts.cpu['machine'] or 'cpu'} ({facts.cores} cores)"
    return {
        "device": name,
        "torch": facts.torch,
        "airgraph": facts.airgraph,
        "commit": _git_commit(),
        "python": facts.python_version,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _git_commit() -> str | None:
    root = Path(airgraph.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def write_json(data: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``data`` as indented JSON, atomically (airgraph/store.py)."""
    target = Path(path)
    write_text_atomic(target, json.dumps(data, indent=2) + "\n")
    return target


def counters() -> dict[str, int]:
    """Dynamo's and Inductor's counters, flattened (group.name -> count)."""
    from torch._dynamo.utils import counters as dynamo_counters

    return {
        f"{group}.{name}": int(value)
        for group, values in dynamo_counters.items()
        for name, value in values.items()
        if isinstance(value, int)
    }


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that changed from ``before`` to ``after``, by how much."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def failure(exc: BaseException, phase: str) -> dict[str, str]:
    """What failed, for the JSON: phase, exception type and message, the traceback's last frames."""
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:])
    return {
        "phase": phase,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:2000],
        "traceback": tail,
    }
