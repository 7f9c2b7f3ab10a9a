"""``airgraph.cache_compile``: a model whose compiled form a later process loads without Dynamo (TorchAir's
``torchair.inference.cache_compile``).

The compile cache behind ``torch.compile`` (compile_cache.py) cannot skip Dynamo: torch traces every frame before
it asks a backend, and importing Dynamo and Inductor alone costs a small model's whole eager start. This is the
other way, for inference: the first process exports the model (``torch.export``, weights as inputs), compiles it
ahead of time with AOTInductor and stores the package in the compile cache's folder; a later process with the same
model code, weights' shapes, inputs' shapes, torch, airgraph and machine loads that package through torch's C++
loader and runs it. Neither Dynamo, AOTAutograd nor Inductor is imported on that path.

What the key digests (computed once per wrapper, plus each call's inputs):
- the model: the classes of its modules and the bytes of the files that define them; their packages' versions
  when installed in site-packages, else the size and modification time of every Python file of those packages
  (a helper edited in another file of the model's package misses);
  every parameter's and buffer's name, shape, dtype and device (not their values: weights are inputs of the
  compiled program, so changed weights give the new model's outputs); which method is compiled; ``training``;
- each call's inputs: their pytree structure, each tensor's shape, strides, dtype and device, every other leaf's
  value (the guards: other shapes or dtypes are another key, compiled then loaded like the first);
- the configuration (every option but ``compile_cache``), Inductor's environment variables and the Inductor
  options this process changed; torch (version and commit), Python, airgraph; the machine
  (airgraph/machine.py).

Inference only (autograd off, or nothing that requires grad), like TorchAir's. What ``torch.export`` refuses
(data-dependent control flow, say) runs through ``torch.compile`` with the airgraph backend instead, with one
warning naming why; so does a call when the compile cache is off. On CUDA the package's kernels run as they are
(no CUDA graph is captured). Entries are files of cache/folder.py: written whole under a lock, a damaged one
refused with one warning and rebuilt. User's view: docs/compile-cache.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

import airgraph
from airgraph import machine
from airgraph.cache.folder import CacheFolder
from airgraph.config import CompilerConfig
from airgraph.log import warn_once

__all__ = ["CacheCompiled", "cache_compile"]

KIND = "aot-package"  # the entry header's ``kind``
PACKAGE_MODEL = "model"  # the model's name inside an AOTInductor package


def cache_compile(model: nn.Module | Callable[..., Any], *, config: CompilerConfig | None = None) -> CacheCompiled:
    """``model`` (a module, or a bound method of one, such as ``self.forward_decode``) compiled once for every
    process: the first call with a given input signature exports and compiles it and stores the package, later
    calls and later processes load it (module docstring).

    >>> fast = airgraph.cache_compile(model)
    >>> with torch.no_grad():
    ...     out = fast(x)
    """
    if isinstance(model, nn.Module):
        module, method = model, "forward"
    elif isinstance(getattr(model, "__self__", None), nn.Module) and hasattr(model, "__func__"):
        module, method = model.__self__, model.__func__.__name__
    else:
        raise TypeError(
            f"airgraph.cache_compile: {type(model).__name__} is neither an nn.Module nor a bound method of one; "
            "give the module (its forward is compiled) or a method of it such as model.decode_step"
        )
    config = config if config is not None else CompilerConfig()
    if config.frozen_parameters:
        raise ValueError(
            "airgraph.cache_compile keeps weights as inputs of the compiled program (a model with other weights "
            "loads the same entry); turn config.frozen_parameters off for it, or use torch.compile with the "
            "airgraph backend, whose compile cache handles frozen parameters"
        )
    return CacheCompiled(module, method, config)


@dataclasses.dataclass
class _Loaded:
    """One input signature's compiled program in this process."""

    run: Callable[[list[Any]], Any] | None  # the call's pytree leaves -> its output; None: through torch.compile
    source: str  # "loaded", "compiled" or "torch.compile"


class CacheCompiled:
    """The callable ``cache_compile`` returns: ``module``'s ``method`` run from cached AOTInductor packages.

    ``stats``: how each signature was served this process (``loaded``: from an entry another call or process
    wrote, ``compiled``: exported and compiled here, ``torch.compile``: the fallback), for tests and benchmarks.
    """

    def __init__(self, module: nn.Module, method: str, config: CompilerConfig) -> None:
        self.module, self.method, self.config = module, method, config
        root = config.resolved_cache_dir()
        self.folder = CacheFolder(root, config.trusted_folders) if root is not None else None
        self._model_key: str | None = None
        self._loaded: dict[Any, _Loaded] = {}
        self._fallback: Callable[..., Any] | None = None
        self.stats = {"loaded": 0, "compiled": 0, "torch.compile": 0}

    def __repr__(self) -> str:
        return f"CacheCompiled({type(self.module).__name__}.{self.method}, cache={self.folder})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        names, state = _state(self.module)
        leaves, spec = pytree.tree_flatten(((tuple(state), *args), dict(sorted(kwargs.items()))))
        if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves):
            raise RuntimeError(
                "airgraph.cache_compile runs inference only, and this call needs autograd (grad mode is on and a "
                "weight or an input requires grad): call it under torch.no_grad() or torch.inference_mode(), or "
                "compile training with torch.compile(model, backend=airgraph.get_backend())"
            )
        signature = (spec, self.module.training, tuple(_leaf_key(v) for v in leaves))
        loaded = self._loaded.get(signature)
        if loaded is None:
            loaded = self._loaded[signature] = self._prepare(names, state, args, kwargs, spec, signature)
            self.stats[loaded.source] += 1
        if loaded.run is None:
            return self._compiled_fallback()(*args, **kwargs)
        return loaded.run(leaves)

    # -- one signature's program ----------------------------------------------------------------------------------

    def _prepare(self, names, state, args, kwargs, spec, signature) -> _Loaded:
        if self.folder is None:
            return _Loaded(None, "torch.compile")
        _register_output_types(self.module)
        key = self._key(signature)
        entry = self.folder.read(key)
        if entry is not None:
            try:
                return _Loaded(_load(entry[1], _device_index(state, args, kwargs)), "loaded")
            except (RuntimeError, TypeError, ValueError) as exc:
                self.folder.refuse(key, f"its package does not load ({type(exc).__name__}: {exc})")
        return self._compile(key, names, state, args, kwargs)

    def _compile(self, key, names, state, args, kwargs) -> _Loaded:
        from airgraph.cache.aot_build import ExportRefused, build_package

        try:
            payload = build_package(self.module, self.method, names, state, args, kwargs)
        except ExportRefused as exc:
            warn_once(
                ("cache_compile export", type(self.module).__qualname__, self.method),
                f"airgraph.cache_compile: {type(self.module).__name__}.{self.method} cannot be exported ({exc}); it "
                "runs through torch.compile with the airgraph backend instead (its compile cache still applies)",
            )
            return _Loaded(None, "torch.compile")
        info = {
            "kind": KIND,
            "model": f"{type(self.module).__qualname__}.{self.method}",
            "mode": "cache_compile",
            "device": str(_device_of(state, args, kwargs)),
            "nodes": None,
            "torch": torch.__version__,
            "airgraph": airgraph.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        self.folder.store(key, payload, info)
        return _Loaded(_load(payload, _device_index(state, args, kwargs)), "compiled")

    def _compiled_fallback(self) -> Callable[..., Any]:
        if self._fallback is None:
            backend = airgraph.get_backend(self.config)
            self._fallback = torch.compile(getattr(self.module, self.method), backend=backend)
        return self._fallback

    # -- keys -----------------------------------------------------------------------------------------------------

    def _key(self, signature: Any) -> str:
        if self._model_key is None:
            self._model_key = _model_key(self.module, self.method, self.config)
        spec, training, leaves = signature
        text = json.dumps([str(spec), training, [list(v) if isinstance(v, tuple) else v for v in leaves]], default=str)
        return "aot-" + hashlib.sha256(f"{self._model_key}\n{text}".encode()).hexdigest()[:36]


def _register_output_types(module: nn.Module) -> None:
    """Let pytree flatten the cache objects Hugging Face models return (``DynamicCache``), through transformers' own
    registration (``register_dynamic_cache_export_support``), before a model of theirs is exported or its
    package's output structure is read."""
    if not any(type(m).__module__.startswith("transformers.") for m in module.modules()):
        return
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:  # another transformers: its outputs may need no registration
        return
    register_dynamic_cache_export_support()


def _state(module: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """The module's parameters and buffers (each tensor once, tied ones under their first name)."""
    names, state = [], []
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        names.append(name)
        state.append(tensor)
    return names, state


def _leaf_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), str(value.dtype), str(value.device))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    raise TypeError(
        f"airgraph.cache_compile: an input of type {type(value).__name__} is neither a tensor nor a plain value "
        "(None, bool, int, float, str) inside lists, tuples and dicts; pass tensors and plain values"
    )


def _model_key(module: nn.Module, method: str, config: CompilerConfig) -> str:
    """The per-wrapper half of the key (module docstring)."""
    classes = sorted({f"{c.__module__}.{c.__qualname__}" for m in module.modules() for c in type(m).__mro__})
    files, packages = {}, set()
    for m in module.modules():
        for cls in type(m).__mro__:
            top = cls.__module__.split(".")[0]
            if top not in ("torch", "builtins"):
                packages.add(top)
                path = getattr(sys.modules.get(cls.__module__), "__file__", None)
                if path and path not in files:
                    files[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    packages_facts = {top: _package_facts(top) for top in sorted(packages)}
    options = config.as_dict()
    options.pop("compile_cache", None)
    options.pop("trusted_folders", None)
    facts = machine.fingerprint(torch.device("cpu"))
    document = {
        "classes": classes,
        "files": files,
        "packages": packages_facts,
        "method": method,
        "config": options,
        "inductor_env": {k: v for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR_") and "CACHE" not in k},
        "inductor_config": _inductor_changes(),
        "torch": facts.torch,
        "torch_git": facts.git,
        "python": facts.python_version,
        "airgraph": airgraph.__version__,
        "cpu": {k: facts.cpu[k] for k in ("machine", "model", "isa", "flags")},
        "gpus": _gpus(),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def _inductor_changes() -> dict[str, str]:
    """The Inductor options whose values differ from their defaults in this process (none when it never imported
    Inductor's configuration, which the loading path does not: importing it imports Dynamo)."""
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is None:
        return {}
    defaults = inductor._config
    config = inductor.get_config_copy()
    return {k: repr(v) for k, v in sorted(config.items()) if k in defaults and v != defaults[k].default}


def _package_facts(top: str) -> Any:
    """What stands for the code of package ``top``: its version when it is installed in site-packages, else the
    size and modification time of each of its Python files (a package being edited: any change misses)."""
    path = getattr(sys.modules.get(top), "__file__", None)
    if path is None:
        return None
    root = Path(path).parent if Path(path).name == "__init__.py" else Path(path)
    version = getattr(sys.modules[top], "__version__", None)
    if version is not None and {"site-packages", "dist-packages"} & set(root.parts):
        return {"version": str(version), "root": str(root)}
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    facts = []
    for file in files:
        try:
            info = file.stat()
        except OSError:
            continue
        facts.append([str(file.relative_to(root.parent)), info.st_size, info.st_mtime_ns])
    return facts


def _gpus() -> list[Any]:
    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    return [[torch.cuda.get_device_name(i), list(torch.cuda.get_device_capability(i))] for i in range(count)]


def _tensors(state: list[torch.Tensor], args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [v for v in (*state, *pytree.tree_leaves((args, kwargs))) if isinstance(v, torch.Tensor)]


def _device_of(state: list[torch.Tensor], args: tuple, kwargs: dict) -> torch.device:
    devices = {v.device for v in _tensors(state, args, kwargs)}
    cuda = [d for d in devices if d.type == "cuda"]
    return cuda[0] if cuda else torch.device("cpu")


def _device_index(state: list[torch.Tensor], args: tuple, kwargs: dict) -> int:
    device = _device_of(state, args, kwargs)
    return -1 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())


def _load(payload: bytes, device_index: int) -> Callable[[list[Any]], Any]:
    """An AOTInductor package's runner, through torch's C++ loader (it unpacks the package into a folder of its
    own, so the file it reads is removed at once): the call's pytree leaves in, its output out (the package's
    output structure)."""
    with tempfile.NamedTemporaryFile(suffix=".pt2", delete=False) as f:
        f.write(payload)
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(f.name, PACKAGE_MODEL, False, 1, device_index)
    finally:
        os.unlink(f.name)
    out_spec = pytree.treespec_loads(loader.get_call_spec()[1])

    def run(leaves: list[Any]) -> Any:
        return pytree.tree_unflatten(loader.boxed_run([v for v in leaves if isinstance(v, torch.Tensor)]), out_spec)

    return run
