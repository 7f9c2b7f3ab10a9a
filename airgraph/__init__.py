"""airgraph: a graph-mode torch.compile backend for CUDA GPUs and CPUs.

import torch, airgraph
config = airgraph.CompilerConfig()
config.mode = "reduce-overhead"
model = torch.compile(model, backend=airgraph.get_backend(compiler_config=config))

The public names load lazily (module ``__getattr__``): ``import airgraph`` imports neither torch nor onnx,
so ``airgraph.export.runner`` runs an export in a process without PyTorch. ``get_backend``, ``explain``,
``scope`` and ``ops`` import torch on first use, ``tune`` and ``compare`` on their first call; ``dynamo_export``
imports torch, onnx and onnxscript on its first call.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from airgraph.config import CompilerConfig

if TYPE_CHECKING:
    import torch

    from airgraph.export.exporter import ExportResult

__all__ = [
    "CompilerConfig",
    "cache_compile",
    "compare",
    "compile",
    "dynamo_export",
    "explain",
    "get_backend",
    "ops",
    "plan",
    "scope",
    "tune",
]
__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "get_backend": ("airgraph.backend", "get_backend"),
    "compile": ("airgraph.backend", "compile_model"),
    "cache_compile": ("airgraph.cache.aot_package", "cache_compile"),
    "compare": ("airgraph.precision.api", "compare"),
    "explain": ("airgraph.report.explain", "explain"),
    "plan": ("airgraph.report.explain", "plan"),
    "scope": ("airgraph.scope", None),
    "ops": ("airgraph.ops", None),
    "tune": ("airgraph.tuning.api", "tune"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'airgraph' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def dynamo_export(
    *args: Any,
    model: torch.nn.Module,
    export_path: str | os.PathLike[str] = "export_file",
    export_name: str = "export",
    dynamic: bool = False,
    config: CompilerConfig | None = None,
    **kwargs: Any,
) -> ExportResult:
    """Export ``model(*args, **kwargs)`` as an ONNX model that runs without PyTorch (TorchAir's dynamo_export).

    See :func:`airgraph.export.exporter.dynamo_export` for the layout written into ``export_path`` and
    ``airgraph run EXPORT_DIR --check`` to run it with onnxruntime.

    A wrapper rather than a lazy name: importing the exporter imports onnx and onnxscript (the optional
    ``export`` extra), so ``from airgraph import dynamo_export`` (TorchAir's compat module does it) must not.
    """
    try:
        from airgraph.export.exporter import dynamo_export as _dynamo_export
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("onnx", "onnxscript", "onnx_ir", "onnxruntime"):
            raise ModuleNotFoundError(
                f"airgraph.dynamo_export needs the {exc.name!r} package: pip install 'airgraph[export]'", name=exc.name
            ) from exc
        raise

    return _dynamo_export(
        *args, model=model, export_path=export_path, export_name=export_name, dynamic=dynamic, config=config, **kwargs
    )
