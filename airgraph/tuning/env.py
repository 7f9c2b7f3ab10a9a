"""What a measurement is only valid for: the device it ran on and the software that ran it.

A tuning choice measured on one machine says nothing about another (TVM MetaSchedule's database forgets this;
PyTorch TunableOp's validator header does not). The bank keeps one file per environment (tuning/bank.py), named by
the digest of :func:`environment`, and never uses records of another:

- CPU: the model name, the ISA PyTorch's kernels use (``torch.backends.cpu.get_cpu_capability()``: AVX2,
  AVX512, ...), and the intra-op thread count (which GEMM implementation wins at batch 8 depends on it);
- CUDA: the GPU name, its compute capability and the CUDA version;
- the torch and airgraph versions.

The candidate sets (tuning/candidates.py) carry their own version, inside each entry's key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from typing import Any

import torch

import airgraph

__all__ = ["cpu_model", "env_digest", "environment"]


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict[str, Any]:
    """The fingerprint of ``device`` and of the software measuring on it (see the module docstring)."""
    env: dict[str, Any] = {"device_type": device.type}
    if device.type == "cuda" and not torch.cuda.is_available():  # planning on fake CUDA tensors: no bank matches
        env.update(device="unavailable")
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        env.update(device=torch.cuda.get_device_name(index), capability=f"{major}.{minor}", cuda=torch.version.cuda)
    else:
        env.update(device=cpu_model(), isa=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads())
    env.update(torch=torch.__version__, airgraph=airgraph.__version__)
    return env


def env_digest(env: dict[str, Any]) -> str:
    """A short stable digest of an environment (the name of its bank file)."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:12]
