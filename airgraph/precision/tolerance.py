"""Tolerances and the difference between an eager and a compiled tensor.

By default a tolerance follows the dtype as ``torch.testing.assert_close`` chooses it (its documented table,
kept here rather than read from torch's private module); a value is within it when, elementwise,
``|compiled - eager| <= atol + rtol * |eager|``, NaNs matching NaNs. Integer and bool tensors must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DEFAULT_TOLERANCES", "TensorDiff", "Tolerance", "diff", "tolerance_for"]

# torch.testing.assert_close's defaults: dtype -> (rtol, atol); other dtypes compare exactly.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    by: str  # "torch.testing (float32)" or "given"

    def __str__(self) -> str:
        return f"rtol={self.rtol:g} atol={self.atol:g} ({self.by})"


def tolerance_for(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The tolerance for ``dtype``: the given one, else torch.testing's default (both or neither must be given)."""
    if (rtol is None) != (atol is None):
        raise ValueError("give both rtol and atol, or neither (then they follow the dtype, as torch.testing does)")
    if rtol is not None and atol is not None:
        return Tolerance(float(rtol), float(atol), "given")
    default_rtol, default_atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    return Tolerance(default_rtol, default_atol, f"torch.testing ({str(dtype).removeprefix('torch.')})")


@dataclass(frozen=True)
class TensorDiff:
    """One compared value: what it is, its largest differences and whether they are within the tolerance."""

    name: str
    kind: str  # "output", "grad" or "node"
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    tolerance: Tolerance
    ok: bool
    note: str = ""  # why it is not comparable (shape, dtype, device), when it is not


def diff(name: str, kind: str, eager: torch.Tensor, compiled: torch.Tensor, tolerance: Tolerance) -> TensorDiff:
    """Compare ``compiled`` with ``eager`` (the reference) under ``tolerance``."""
    dtype = str(eager.dtype).removeprefix("torch.")
    shape = tuple(eager.shape)
    for what, a, b in (("shape", shape, tuple(compiled.shape)), ("dtype", eager.dtype, compiled.dtype)):
        if a != b:
            note = f"{what} {b} where eager has {a}"
            return TensorDiff(name, kind, shape, dtype, float("inf"), float("inf"), tolerance, False, note)
    expected = eager.detach().to("cpu")
    actual = compiled.detach().to("cpu")
    if not expected.is_complex() and expected.dtype != torch.float64:  # integers, bools, narrower floats
        expected, actual = expected.to(torch.float64), actual.to(torch.float64)
    if expected.numel() == 0:
        return TensorDiff(name, kind, shape, dtype, 0.0, 0.0, tolerance, True)
    both_nan = torch.isnan(expected) & torch.isnan(actual)
    abs_diff = torch.where(expected == actual, 0.0, (actual - expected).abs())  # equal infinities differ by 0
    abs_diff = torch.where(both_nan, 0.0, abs_diff).nan_to_num(nan=float("inf"))
    allowed = tolerance.atol + tolerance.rtol * expected.abs()
    ok = bool((abs_diff <= allowed).all())
    rel = abs_diff / expected.abs()
    rel = torch.where(abs_diff == 0, 0.0, rel)
    return TensorDiff(name, kind, shape, dtype, float(abs_diff.max()), float(rel.max()), tolerance, ok)
