"""The first process's half of ``airgraph.cache_compile`` (aot_package.py): export the model with its weights as
inputs and compile it ahead of time into an AOTInductor package. Imports ``torch.export`` and Inductor, which the
loading half never does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["ExportRefused", "build_package"]


class ExportRefused(Exception):
    """``torch.export`` or AOTInductor cannot compile the model as it is called (the message says which, and why)."""


class _Method(nn.Module):
    """``inner.<method>`` as a forward, so that ``functional_call`` can swap the weights of any method."""

    def __init__(self, inner: nn.Module, method: str) -> None:
        super().__init__()
        self.inner, self.method = inner, method

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, self.method)(*args, **kwargs)


class _Program(nn.Module):
    """``forward(state, *args, **kwargs)``: the method with the module's parameters and buffers replaced by
    ``state``, so the exported program takes the weights as inputs and holds none of them."""

    def __init__(self, module: nn.Module, method: str, names: list[str]) -> None:
        super().__init__()
        object.__setattr__(self, "_target", _Method(module, method))  # not a submodule: no weights to lift
        self._names = [f"inner.{name}" for name in names]

    def forward(self, state: tuple[torch.Tensor, ...], *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(self._target, dict(zip(self._names, state, strict=True)), args, kwargs)


def build_package(
    module: nn.Module, method: str, names: list[str], state: list[torch.Tensor], args: tuple, kwargs: dict[str, Any]
) -> bytes:
    """The AOTInductor package (bytes of a ``.pt2``) of ``module.<method>`` called with ``args`` and ``kwargs``,
    its inputs in the order ``aot_package`` flattens a call: ``((state, *args), kwargs)``, keyword arguments
    sorted by name."""
    from torch._inductor import config as inductor_config

    program = _Program(module, method, names)
    kwargs = dict(sorted(kwargs.items()))
    before = inductor_config.get_config_copy()  # AOTInductor leaves options of its own set: put them back
    try:
        return _build(program, state, args, kwargs)
    finally:
        for name, value in inductor_config.get_config_copy().items():
            if name in before and before[name] != value:
                setattr(inductor_config, name, before[name])


def _build(program: _Program, state: list[torch.Tensor], args: tuple, kwargs: dict[str, Any]) -> bytes:
    import torch._inductor

    with torch.no_grad():
        try:
            exported = torch.export.export(program, (tuple(state), *args), kwargs, strict=False)
        except Exception as exc:  # export raises many types; each is a refusal of this model's code
            raise ExportRefused(f"torch.export: {type(exc).__name__}: {_first_line(exc)}") from exc
        with tempfile.TemporaryDirectory(prefix="airgraph-aot-") as folder:
            path = Path(folder) / "model.pt2"
            try:
                torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
            except Exception as exc:  # Inductor's lowering or the C++ compile
                raise ExportRefused(f"AOTInductor: {type(exc).__name__}: {_first_line(exc)}") from exc
            return path.read_bytes()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"
