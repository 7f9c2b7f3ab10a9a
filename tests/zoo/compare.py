"""Comparing a compiled run with eager PyTorch at float32 tolerances, and why these tolerances.

A compiled graph computes the same math in another order: Inductor fuses reductions and splits them into
vectorized partial sums, decomposes softmax, layer norm and GELU into other (equivalent) formulas, and the
aten backend runs the decomposed ATen ops instead of the fused eager kernels. Each reordering moves a result
by a few float32 ulps (2**-23 ~ 1.2e-7) of the magnitude of the terms it sums, and the errors add up through
the layers. For these tiny models (2 layers, hidden size 32, sums of at most a few hundred terms) that is
~1e-6 relative in the worst element, so:

- outputs and parameters: ``rtol=1e-4`` and ``atol=1e-5`` times the tensor's largest magnitude (at least 1),
  still 100x below any real bug (a wrong mask, a lost bias, a stale buffer or a wrong stride change values
  by 1e-2 or more of the scale). Measured over the whole zoo (torch 2.13, CPU): the worst element uses 5% of
  its tolerance (wav2vec2's gradients), the worst inference output 2% (T5's logits);
- gradients: ``rtol=1e-4`` and an absolute floor of ``1e-5`` times the largest gradient of the whole model.
  Some gradients are zero in exact arithmetic: softmax is invariant to adding the same value to every score
  of a row, so the attention key bias (BERT, GPT-2, Qwen2, Whisper, MultiheadAttention) gets d loss / d b_k =
  sum of terms that cancel. Their float32 value is the rounding left over from that cancellation, of the order
  of ulps of the terms, and the terms are bounded by the model's gradient scale, not by the (zero) result:
  a relative tolerance cannot compare noise, so the floor is relative to the largest gradient;
- integers and booleans (step counters, ``num_batches_tracked``) must be equal.

Parameters after an optimizer step are compared at the output tolerances: the step is SGD (``p -= lr * g``),
whose difference is ``lr`` times the gradient difference (an adaptive optimizer such as Adam would divide the
near-zero noisy gradients above by their own magnitude and turn the noise into steps of size ``lr``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["RTOL", "assert_grads_close", "assert_state_close", "assert_tensors_close", "clone_inputs", "tensors"]

RTOL, ATOL = 1e-4, 1e-5
GRAD_FLOOR = 1e-5  # times the largest gradient of the model


def tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a model output (a tensor, tuple, dict or transformers ModelOutput), in pytree order."""
    return [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)]


def clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Same values, own memory, layout kept (channels-last stays channels-last)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _scale(expected: torch.Tensor) -> float:
    if expected.numel() == 0 or not expected.is_floating_point():
        return 1.0
    return max(1.0, expected.detach().abs().max().item())


def assert_tensors_close(actual: Any, expected: Any, what: str, *, strides: bool = False) -> None:
    """Every tensor of ``actual`` equals ``expected``'s at the output tolerances (integers exactly)."""
    got, want = tensors(actual), tensors(expected)
    assert len(got) == len(want), f"{what}: {len(got)} tensors, eager gives {len(want)}"
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        label = f"{what}[{i}]"
        assert a.dtype == e.dtype and a.shape == e.shape, (
            f"{label}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        )
        if strides and e.dim() == 4:  # a 4-d output keeps eager's memory format (channels-last stays so)
            assert a.stride() == e.stride(), f"{label}: strides {a.stride()}, eager {e.stride()}"
        if e.is_floating_point():
            torch.testing.assert_close(
                a.detach(), e.detach(), rtol=RTOL, atol=ATOL * _scale(e), msg=lambda m, label=label: f"{label}: {m}"
            )
        else:
            torch.testing.assert_close(a, e, rtol=0, atol=0, msg=lambda m, label=label: f"{label}: {m}")


def assert_state_close(actual: torch.nn.Module, expected: torch.nn.Module, what: str) -> None:
    """Every parameter and buffer, by name, at the output tolerances (integer buffers exactly)."""
    got = dict(actual.named_parameters()) | dict(actual.named_buffers())
    want = dict(expected.named_parameters()) | dict(expected.named_buffers())
    assert got.keys() == want.keys()
    for name, e in want.items():
        assert_tensors_close(got[name], e, f"{what} {name}")


def assert_grads_close(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    """Every parameter's gradient, by name, with the absolute floor relative to the model's largest gradient."""
    want = {n: p.grad for n, p in expected.named_parameters()}
    got = {n: p.grad for n, p in actual.named_parameters()}
    missing = sorted(n for n, g in want.items() if g is not None and got[n] is None)
    assert not missing, f"no gradient for {missing}"
    largest = max(g.abs().max().item() for g in want.values() if g is not None)
    for name, e in want.items():
        if e is None:
            assert got[name] is None, f"{name}: a gradient where eager has none"
            continue
        torch.testing.assert_close(
            got[name], e, rtol=RTOL, atol=GRAD_FLOOR * largest, msg=lambda m, name=name: f"grad of {name}: {m}"
        )
