"""What a measurement is only valid for: the device it ran on and the software that ran it.

A tuning choice measured on one machine says nothing about another (TVM MetaSchedule's database forgets this;
PyTorch TunableOp's validator header does not). The bank keeps one file per environment (tuning/bank.py), named by
the digest of :func:`environment`, and never uses records of another:

- CPU: the model name, the ISA PyTorch's kernels use (``torch.backends.cpu.get_cpu_capability()``: AVX2,
  AVX512, ...), and the intra-op thread count (which GEMM implementation wins at batch 8 depends on it);
- CUDA: the GPU name, its compute capability and the CUDA version;
- the torch and airgraph versions.

The facts are a view of airgraph/machine.py's fingerprint (the machine read once per process); :func:`current`
computes an environment and its digest once per device and thread count, not once per segment looked up.

The candidate sets (tuning/candidates.py) carry their own version, inside each entry's key.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import torch

from airgraph.machine import fingerprint

__all__ = ["current", "env_digest", "environment"]


def environment(device: torch.device) -> dict[str, Any]:
    """The fingerprint of ``device`` and of the software measuring on it (see the module docstring)."""
    facts = fingerprint(device)
    env: dict[str, Any] = {"device_type": device.type}
    if device.type == "cuda" and facts.gpu is None:  # planning on fake CUDA tensors: no bank matches
        env.update(device="unavailable")
    elif device.type == "cuda":
        env.update(device=facts.gpu["name"], capability=facts.gpu["capability"], cuda=facts.gpu["cuda"])
    else:
        env.update(device=facts.cpu["model"] or "cpu", isa=facts.cpu["isa"], threads=facts.threads)
    env.update(torch=facts.torch, airgraph=facts.airgraph)
    return env


def env_digest(env: dict[str, Any]) -> str:
    """A short stable digest of an environment (the name of its bank file)."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:12]


def current(device: torch.device) -> tuple[dict[str, Any], str]:
    """:func:`environment` of ``device`` and its digest, computed once per device (a CUDA one by its index) and
    intra-op thread count, the one fact a process may change as it runs (``torch.set_num_threads``)."""
    available = device.type == "cuda" and torch.cuda.is_available()
    if available and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    env, digest = _current(device, available, torch.get_num_threads())
    return dict(env), digest


@functools.cache
def _current(device: torch.device, available: bool, threads: int) -> tuple[dict[str, Any], str]:
    env = environment(device)  # (available, threads): what environment() reads that may differ between calls
    return env, env_digest(env)
