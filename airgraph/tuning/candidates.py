"""What tuning tries: the candidate sets, versioned.

A candidate is a JSON-able choice ``{"tune_mode", "name", "options"}``, stored as is in the bank. ``tune_mode`` is
the seed's kind of operator tuning (``Impl``: which implementation; ``Format``: a layout; ``Schedule``: the
chosen kernel's configuration) or ``Subgraph`` for a segment. Changing what a set holds changes its version
(:data:`VERSIONS`, per device type), which is in every key: entries measured against another set are stale.

Operators (OPAT), per unit category (tuning/operators.py), cheapest first, so a unit whose time budget runs out
(``config.tuning.budget_s``) has measured the likeliest ones:

- ``linear``: CPU: Impl ``onednn-packed``, ``mkl-packed``, ``template`` (Inductor's C++ GEMM template), Format
  ``pretransposed``, Schedule ``template`` with the template's k-slicing and thread-blocking settings; CUDA:
  Format ``pretransposed``, Impl ``cublas`` (an ``addmm`` without cuBLASLt's bias epilogue) or ``cublaslt`` (an
  ``mm`` of 2+ rows through it), Schedule ``split-k 2/4/8`` (skinny GEMMs: linear.split_k_shape), Impl
  ``template`` (Inductor's Triton GEMM templates, autotuned among their configs when compiled; last: a compile);
- ``matmul``: Format ``contiguous`` (operands copied to contiguous memory first);
- ``attention``: Impl: the device's other SDPA kernels (CPU: flash, math; CUDA: flash, efficient, cudnn, math);
- ``conv``: Format ``channels_last``.

Segments (SGAT), end to end: kernel backend (aten, inductor) x Inductor options: freezing (inference graphs with
parameters), with it the GEMM template alone (C++ on the CPU, Triton on CUDA: one choice, so a later compile has
nothing to autotune) or max-autotune GEMMs (template and ATen: Inductor autotunes them when it compiles), a C++
wrapper (CPU). Per-segment CUDA graphs are not among them: reduce-overhead captures whole graphs.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from airgraph.tuning.linear import available, split_k_shape
from airgraph.tuning.operators import OpUnit

__all__ = ["VERSIONS", "default_choice", "op_candidates", "subgraph_candidates", "version"]

# kind -> device type -> version (op on CUDA 2: cuBLAS, cuBLASLt and split-K joined the Triton template).
VERSIONS = {"op": {"cpu": 1, "cuda": 2}, "subgraph": {"cpu": 1, "cuda": 1}}


def version(kind: str, device_type: str) -> int:
    """The version of ``kind``'s candidate set on ``device_type`` (another device type: the CPU's)."""
    return VERSIONS[kind].get(device_type, VERSIONS[kind]["cpu"])


def choice(tune_mode: str, name: str, **options: Any) -> dict[str, Any]:
    return {"tune_mode": tune_mode, "name": name, "options": options}


def default_choice(kind: str, backend: str) -> dict[str, Any]:
    """What runs without tuning: the node as the graph has it, or the configured kernel backend alone."""
    return choice("Impl", "default") if kind == "op" else choice("Subgraph", backend, backend=backend)


def op_candidates(unit: OpUnit, device: torch.device, inference: bool) -> list[dict[str, Any]]:
    """The candidates of one operator (besides the default: the node as it is)."""
    if unit.category == "linear":
        if not inference:  # prepared weights are cached per weight: a training step updates them every time
            return []
        if device.type == "cuda":
            return _cuda_linear(unit, device)
        found = [
            choice("Impl", impl, impl=impl)
            for impl in ("onednn-packed", "mkl-packed")
            if available(impl, device, unit.dtype)
        ]
        if available("template", device, unit.dtype):
            found.append(choice("Impl", "template", impl="template", schedule=""))
        found.append(choice("Format", "pretransposed", impl="pretransposed"))
        if device.type == "cpu" and available("template", device, unit.dtype):
            for name, schedule in _cpp_schedules():
                found.append(choice("Schedule", f"template {name}", impl="template", schedule=json.dumps(schedule)))
        return found
    if unit.category == "matmul":
        return [choice("Format", "contiguous")]
    if unit.category == "attention":
        kernels = ("flash", "math") if device.type == "cpu" else ("flash", "efficient", "cudnn", "math")
        return [choice("Impl", k, kernel=k) for k in kernels if k != unit.current]
    if unit.category == "conv":
        return [choice("Format", "channels_last")]
    return []


def _cuda_linear(unit: OpUnit, device: torch.device) -> list[dict[str, Any]]:
    """A weight GEMM's candidates on CUDA, cheapest first (module docstring)."""
    found = [choice("Format", "pretransposed", impl="pretransposed")]
    rows, depth = (unit.inputs[0].meta["val"].shape[i] for i in (0, 1))  # x: (M, K)
    static = isinstance(rows, int) and isinstance(depth, int)
    if unit.op_type == "addmm" and available("cublas", device, unit.dtype):
        found.append(choice("Impl", "cublas", impl="cublas"))
    elif unit.op_type == "mm" and static and rows > 1 and available("cublaslt", device, unit.dtype):
        found.append(choice("Impl", "cublaslt", impl="cublaslt"))
    if static and available("split-k", device, unit.dtype):
        for splits in (2, 4, 8):
            if split_k_shape(rows, depth, splits):
                schedule = json.dumps({"splits": splits})
                found.append(choice("Schedule", f"split-k {splits}", impl="split-k", schedule=schedule))
    if available("template", device, unit.dtype):
        found.append(choice("Impl", "template", impl="template", schedule=""))
    return found


def _cpp_schedules() -> list[tuple[str, dict[str, Any]]]:
    """Configurations of Inductor's C++ GEMM template worth trying beside its defaults: k-slicing chosen by the
    template, and each split of the threads between the M and N dimensions."""
    threads = torch.get_num_threads()
    found = [("k-slices auto", {"cpp.gemm_max_k_slices": 0})]
    for m in (1, threads):
        if threads > 1:
            found.append((f"threads {m}x{threads // m}", {"cpp.gemm_thread_factors": f"{m},{threads // m},1"}))
    return found


def subgraph_candidates(
    device: torch.device, backend: str, *, inference: bool, freezable: bool
) -> list[dict[str, Any]]:
    """The candidates of one segment (besides the default: ``backend``, the configured kernel backend).
    ``freezable``: the segment reads parameters it may freeze."""
    template = "TRITON" if device.type == "cuda" else "CPP"
    found = [choice("Subgraph", name, backend=name) for name in ("aten", "inductor") if name != backend]
    if inference and freezable:
        found.append(choice("Subgraph", "inductor+freezing", backend="inductor", freeze=True))
        found.append(
            choice(
                "Subgraph",
                "inductor+freezing+gemm-template",
                backend="inductor",
                freeze=True,
                inductor_config={"max_autotune_gemm": True, "max_autotune_gemm_backends": template},
            )
        )
    if device.type == "cpu":
        found.append(choice("Subgraph", "inductor+cpp-wrapper", backend="inductor", cpp_wrapper=True))
    if inference and freezable:  # last: Inductor benchmarks each GEMM's choices while compiling it
        found.append(
            choice(
                "Subgraph",
                "inductor+freezing+max-autotune-gemm",
                backend="inductor",
                freeze=True,
                inductor_config={"max_autotune_gemm": True, "max_autotune_gemm_backends": f"{template},ATEN"},
            )
        )
    return found
