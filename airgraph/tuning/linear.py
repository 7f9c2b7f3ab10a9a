"""``airgraph::tuned_linear``: a GEMM with a weight (``x @ weight.T + bias``) through a chosen implementation.

Operator tuning (tuning/candidates.py) replaces a weight GEMM of a segment (``addmm(bias, x, t(weight))``,
``mm(x, t(weight))``) by this op when another implementation measured faster; it is a torch.library custom op, so
both kernel backends lower it (Inductor calls it as an extern kernel). The implementations:

- ``onednn-packed``: oneDNN's linear on a weight reordered once into its blocked layout
  (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``, what Inductor's freezing uses for bf16);
- ``mkl-packed``: MKL's packed sgemm (``mkl._mkl_reorder_linear_weight`` + ``mkl._mkl_linear``, Inductor's fp32
  freezing path);
- ``pretransposed``: ATen's addmm on a contiguous copy of ``weight.T`` (the Format choice);
- ``template``: Inductor's GEMM template (C++ on the CPU, Triton on CUDA) compiled for this weight as a constant,
  with the Schedule's Inductor options (``schedule``: JSON, e.g. ``{"cpp.gemm_max_k_slices": 0}``);
- CUDA: ``cublas``: cuBLAS's GEMM, the bias added by a kernel of its own (ATen sends ``addmm`` with a 1-D bias to
  cuBLASLt's bias epilogue); ``cublaslt``: cuBLASLt for a GEMM without a bias (``addmm`` with a zero 1-D bias;
  ATen sends ``mm`` to cuBLAS), both of ATen's routing rules (``aten/src/ATen/native/cuda/Blas.cpp``: 2+ rows);
  ``split-k``: the reduction dimension cut into ``{"splits": S}`` slices multiplied as one batched GEMM, then
  summed: more blocks for the skinny GEMMs of decode (a row or a few, a long K).

Prepared weights are cached per weight tensor and checked on every call against the weight's storage and version
counter: an in-place update (``copy_``, an optimizer step) or a new tensor prepares it again, so a cached form never
goes stale. (Inside a replayed CUDA graph no Python runs: reduce-overhead re-captures when a weight moves, but an
in-place update of a weight under a template choice is not seen; tuning offers weight choices for inference only.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from airgraph.lowering import aot

__all__ = ["IMPLS", "TUNED_LINEAR", "available", "split_k_shape", "tuned_linear"]


@torch.library.custom_op("airgraph::tuned_linear", mutates_args=())
def tuned_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, impl: str, schedule: str
) -> torch.Tensor:
    """``x @ weight.T + bias`` (x 2-D, weight (N, K), bias (N,) or None) computed by ``impl``."""
    if impl not in IMPLS:
        raise ValueError(f"airgraph::tuned_linear: unknown implementation {impl!r}; known: {', '.join(IMPLS)}")
    return IMPLS[impl](x, weight, bias, schedule)


@tuned_linear.register_fake
def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, impl: str, schedule: str) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


TUNED_LINEAR = torch.ops.airgraph.tuned_linear.default

# weight -> {(impl, extra): (data_ptr, version, prepared)}
_prepared: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cached(weight: torch.Tensor, what: tuple, prepare: Callable[[], Any], also: torch.Tensor | None = None) -> Any:
    """``prepare()`` for this weight, redone when the storage or version counter of the weight (or of ``also``, a
    bias baked in with it) changed."""
    per_weight = _prepared.setdefault(weight, {})
    stamp = (weight.data_ptr(), weight._version, *((also.data_ptr(), also._version) if also is not None else ()))
    hit = per_weight.get(what)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    value = prepare()
    per_weight[what] = (stamp, value)
    return value


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    batch = x.shape[0]
    packed = _cached(weight, ("onednn", batch), lambda: torch.ops.mkldnn._reorder_linear_weight(weight, batch))
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _mkl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    batch = x.shape[0]
    packed = _cached(weight, ("mkl", batch), lambda: torch.ops.mkl._mkl_reorder_linear_weight(weight, batch))
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, batch)


def _pretransposed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    weight_t = _cached(weight, ("pretransposed",), lambda: weight.t().contiguous())
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _template(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    key = ("template", schedule, tuple(x.shape), tuple(x.stride()), x.dtype, bias is not None)
    compiled = _cached(weight, key, lambda: _compile_template(x, weight, bias, json.loads(schedule or "{}")), bias)
    return compiled([x])[0]


def _compile_template(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: dict[str, Any]
) -> Callable[[list], Any]:
    """Inductor's GEMM template for ``x @ weight.T + bias`` with the weight (and bias) as constants of the graph,
    the only choice Inductor is given (no autotuning at compile time: the tuner measured it)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    owner = torch.nn.Module()
    owner.register_buffer("weight", weight.detach())
    graph = torch.fx.Graph()
    x_node = graph.placeholder("x")
    weight_t = graph.call_function(torch.ops.aten.permute.default, (graph.get_attr("weight"), [1, 0]))
    if bias is None:
        out = graph.call_function(torch.ops.aten.mm.default, (x_node, weight_t))
    else:
        owner.register_buffer("bias", bias.detach())
        out = graph.call_function(torch.ops.aten.addmm.default, (graph.get_attr("bias"), x_node, weight_t))
    graph.output((out,))
    gm = torch.fx.GraphModule(owner, graph)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_x = mode.from_tensor(x)
    FakeTensorProp(gm, mode).propagate(fake_x)
    backend = "TRITON" if x.is_cuda else "CPP"
    patches = {"max_autotune_gemm": True, "max_autotune_gemm_backends": backend, "freezing": True, **schedule}
    with inductor_config.patch(patches), aot.tracing(mode):
        compiled = compile_fx_inner(gm, [fake_x], is_inference=True)
    return compiled


def _cublas(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    out = torch.mm(x, weight.t())
    return out if bias is None else out.add_(bias)


def _cublaslt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    if bias is None:
        bias = _cached(weight, ("zero bias",), lambda: weight.new_zeros(weight.shape[0]))
    return torch.addmm(bias, x, weight.t())


def split_k_shape(m: int, k: int, splits: int) -> bool:
    """Whether a GEMM of ``m`` rows and reduction ``k`` takes ``splits`` slices of K: a skinny GEMM (16 rows at
    most) whose K divides into slices of 256 or more, a multiple of 16 (aligned tensor-core tiles)."""
    return m <= 16 and k % splits == 0 and k // splits >= 256 and (k // splits) % 16 == 0


def _split_k(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, schedule: str) -> torch.Tensor:
    splits = int(json.loads(schedule)["splits"])
    (m, k), n = x.shape, weight.shape[0]
    if k % splits or not x.is_contiguous() or not weight.is_contiguous():
        raise ValueError(f"split-k: {splits} slices of a ({m}, {k}) x ({k}, {n}) GEMM need K divisible, contiguous")
    # (S, M, K/S) @ (S, K/S, N): views of x and of the weight as it is (one batched GEMM, no copy), then the sum.
    parts = torch.bmm(
        x.view(m, splits, k // splits).transpose(0, 1), weight.view(n, splits, k // splits).permute(1, 2, 0)
    )
    out = parts.sum(0)
    return out if bias is None else out.add_(bias)


IMPLS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, str], torch.Tensor]] = {
    "onednn-packed": _onednn,
    "mkl-packed": _mkl,
    "pretransposed": _pretransposed,
    "template": _template,
    "cublas": _cublas,
    "cublaslt": _cublaslt,
    "split-k": _split_k,
}
CUDA_ONLY = ("cublas", "cublaslt", "split-k")  # computed on any device, offered on CUDA (candidates.py)


def available(impl: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``impl`` can run a GEMM of ``dtype`` on ``device`` in this build of PyTorch."""
    if impl == "onednn-packed":
        return (
            device.type == "cpu" and torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16)
        )
    if impl == "mkl-packed":
        return device.type == "cpu" and torch.backends.mkl.is_available() and dtype == torch.float32
    if impl == "template":
        return device.type == "cpu" or (device.type == "cuda" and _has_triton())
    if impl in CUDA_ONLY:
        return device.type == "cuda" and dtype in (torch.float32, torch.float16, torch.bfloat16)
    return impl in IMPLS


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:  # pragma: no cover - every supported torch has it
        return False
    return has_triton()
