"""TorchAir's names for airgraph's features, so a TorchAir script runs after changing imports and device.

# import torchair as tng                        ->  from airgraph.compat import torchair as tng
from airgraph.compat.torchair import CompilerConfig, get_npu_backend  # was torchair.configs.compiler_config

config = CompilerConfig()
config.mode = "reduce-overhead"
backend = get_npu_backend(compiler_config=config)
model = torch.compile(model, backend=backend, fullgraph=True)   # .npu() -> .cuda()

tng.dynamo_export(x, y, model=model, dynamic=False)  # export_file/export.onnx (ONNX, not AIR)
with tng.scope.npu_stream_switch("1"):                # in-graph multi-stream
    tng.ops.npu_tagged_event_wait(event)

config.experimental_config.frozen_parameter = True   # weights as constants: config.frozen_parameters
config.experimental_config.aclgraph._aclnn_static_shape_kernel = True             # static kernels (airgraph/kernels):
config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = "/path"  # config.static_kernels.*
config.aoe_config.aoe_mode = "2"                      # tuning (AOE): "2" operators, "1" subgraphs
config.aoe_config.work_path = "./aoe_results"         # where aoe_result_*.json go
config.aoe_config.aoe_config_file = "ops.json"        # only these ops: {"tune_ops_type": [...], "tune_ops_name": [...]}
tng.inference.set_dim_gears(x, dim_gears={0: [2, 4, 8]})  # config.reduce_overhead.capture_sizes and capture_dim
config.debug.aclgraph.static_capture_size_limit = 64       # config.reduce_overhead.capture_limit

AOE's environment variables ``AOE_MODE``, ``TUNE_BANK_PATH``, ``REPEAT_TUNE`` and ``ASCEND_WORK_PATH`` set
the tuning options ``get_npu_backend`` leaves at their defaults (read in airgraph/config.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from airgraph import dynamo_export
from airgraph import ops as _ops
from airgraph import scope as _scope
from airgraph.backend import AirgraphBackend, get_backend
from airgraph.config import _AOE_MODES as _CONFIG_AOE_MODES
from airgraph.config import CompilerConfig as _CompilerConfig
from airgraph.config import DebugConfig as _DebugConfig
from airgraph.config import ExperimentalConfig as _ExperimentalConfig
from airgraph.config import TuningConfig, torchair_tuning_environment

__all__ = [
    "CompilerConfig",
    "TorchAirBackend",
    "cache_compile",
    "dynamo_export",
    "get_compiler",
    "get_npu_backend",
    "inference",
    "ops",
    "scope",
    "set_dim_gears",
]

# tng.scope.npu_stream_switch(tag, priority) and the tagged-event ops, under TorchAir's names.
scope = SimpleNamespace(npu_stream_switch=_scope.stream_switch)
ops = SimpleNamespace(
    npu_create_tagged_event=_ops.create_tagged_event,
    npu_tagged_event_record=_ops.tagged_event_record,
    npu_tagged_event_wait=_ops.tagged_event_wait,
    npu_record_tagged_stream=_ops.record_tagged_stream,
)


class _AclGraph:
    """A TorchAir ``aclgraph`` namespace: its names read and written through to airgraph's options (validated
    there), so the configuration has one value for each. ``names``: TorchAir's name -> (group, option)."""

    def __init__(self, root: _CompilerConfig, path: str, names: dict[str, tuple[str, str]]) -> None:
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_names", names)

    def __getattr__(self, name: str) -> object:
        if name in self._names:
            group, option = self._names[name]
            return getattr(getattr(self._root, group), option)
        raise AttributeError(self._unknown(name))

    def __setattr__(self, name: str, value: object) -> None:
        if name not in self._names:
            raise AttributeError(self._unknown(name))
        group, option = self._names[name]
        setattr(getattr(self._root, group), option, value)

    def _unknown(self, name: str) -> str:
        targets = ", ".join(f"config.{group}.{option}" for group, option in self._names.values())
        return f"{self._path} has no option {name!r} in airgraph; known: {', '.join(self._names)} (they set {targets})"


class _TorchAirExperimentalConfig(_ExperimentalConfig):
    NAMES: ClassVar[dict[str, tuple[str, str]]] = {
        "_aclnn_static_shape_kernel": ("static_kernels", "enabled"),
        "_aclnn_static_shape_kernel_build_dir": ("static_kernels", "build_dir"),
    }

    @property
    def aclgraph(self) -> _AclGraph:
        root = object.__getattribute__(self, "_root")
        return _AclGraph(root, "experimental_config.aclgraph", _TorchAirExperimentalConfig.NAMES)

    @property
    def frozen_parameter(self) -> bool:
        """TorchAir's ``experimental_config.frozen_parameter``: ``config.frozen_parameters`` (one value)."""
        return object.__getattribute__(self, "_root").frozen_parameters

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "frozen_parameter":
            object.__getattribute__(self, "_root").frozen_parameters = value
            return
        super().__setattr__(name, value)


class _TorchAirDebugConfig(_DebugConfig):
    # TorchAir's re-capture limit of reduce-overhead (aclgraph), default 64 as airgraph's capture_limit: its guide,
    # "重捕获次数限制功能(aclgraph)", hiascend.com/document/detail/zh/Pytorch/730/modthirdparty/torchairuseguide/
    # torchair_00028.html
    NAMES: ClassVar[dict[str, tuple[str, str]]] = {"static_capture_size_limit": ("reduce_overhead", "capture_limit")}

    @property
    def aclgraph(self) -> _AclGraph:
        return _AclGraph(object.__getattribute__(self, "_root"), "debug.aclgraph", _TorchAirDebugConfig.NAMES)


_AOE_MODES = {mode: aoe for aoe, mode in _CONFIG_AOE_MODES.items()}  # config.tuning.mode -> AOE_MODE


class AoeConfig:
    """TorchAir's ``config.aoe_config``, a view of ``config.tuning``: ``aoe_mode`` ("2" operator tuning, "1"
    subgraph tuning, None off), ``work_path`` (where the result files go) and ``aoe_config_file`` (a JSON file
    naming the ops to tune: ``{"tune_ops_type": [...], "tune_ops_name": [...]}``, or a JSON list of either)."""

    def __init__(self, tuning: TuningConfig, config: CompilerConfig) -> None:
        object.__setattr__(self, "_tuning", tuning)
        object.__setattr__(self, "_config", config)

    @property
    def aoe_mode(self) -> str | None:
        return _AOE_MODES.get(self._tuning.mode)

    @aoe_mode.setter
    def aoe_mode(self, value: str | None) -> None:
        self._tuning.mode = value

    @property
    def work_path(self) -> str | None:
        return self._tuning.work_path

    @work_path.setter
    def work_path(self, value: str | None) -> None:
        self._tuning.work_path = value

    @property
    def aoe_config_file(self) -> str | None:
        return self._config.__dict__.get("_aoe_config_file")

    @aoe_config_file.setter
    def aoe_config_file(self, path: str | None) -> None:
        self._tuning.ops = None if path is None else _tuned_ops(path)
        self._config.__dict__["_aoe_config_file"] = path

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ("aoe_mode", "work_path", "aoe_config_file"):
            raise AttributeError(f"aoe_config has no option {name!r}; known: aoe_mode, work_path, aoe_config_file")
        object.__setattr__(self, name, value)


def _tuned_ops(path: str) -> list[str]:
    """The op types and names an AOE op config file lists."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"aoe_config.aoe_config_file: {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"aoe_config.aoe_config_file: {path}: not a JSON file ({exc})") from None
    if isinstance(data, dict):
        names = [*data.get("tune_ops_type", []), *data.get("tune_ops_name", [])]
    else:
        names = data
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(
            f'aoe_config.aoe_config_file: {path}: expected {{"tune_ops_type": [...], "tune_ops_name": [...]}} '
            "with op types or node names (str), or a JSON list of them"
        )
    return names


class CompilerConfig(_CompilerConfig):
    """airgraph's CompilerConfig, also answering to TorchAir's names: ``experimental_config.aclgraph...`` (static
    kernels) and ``aoe_config`` (a view of ``config.tuning``)."""

    experimental_config = _TorchAirExperimentalConfig
    debug = _TorchAirDebugConfig

    def __init__(self, path: str | None = None) -> None:
        super().__init__(path)
        object.__setattr__(self.experimental_config, "_root", self)
        object.__setattr__(self.debug, "_root", self)

    def __deepcopy__(self, memo: dict) -> CompilerConfig:
        new = super().__deepcopy__(memo)
        object.__setattr__(new.experimental_config, "_root", new)
        object.__setattr__(new.debug, "_root", new)
        return new  # type: ignore[return-value]

    @property
    def aoe_config(self) -> AoeConfig:
        return AoeConfig(self.tuning, self)


# TorchAir's dynamic gears, ``torchair.inference.set_dim_gears(t, dim_gears={0: [2, 4, 8]})``: the dimension made
# dynamic, with the sizes it takes (GE builds a static graph per gear and refuses other sizes). Its guide:
# "set_dim_gears", hiascend.com/document/detail/zh/Pytorch/720/modthirdparty/torchairuseguide/torchair_00092.html;
# the tensor attribute ``dim_gears`` as torchair/inference/_gear_utils.py sets it. In airgraph the gears are
# config.reduce_overhead.capture_sizes of that dimension (capture_dim): in reduce-overhead a batch up to the largest
# gear replays the graph of the next gear up; in max-autotune one graph, the dimension dynamic, runs every size.
def set_dim_gears(t: torch.Tensor, dim_gears: dict[int, list[int] | tuple[int, ...]]) -> None:
    """TorchAir's ``set_dim_gears``: mark ``t``'s dimension dynamic and give its sizes (the capture sizes of the
    backend that compiles it). airgraph pads one dimension: one dim per call."""
    if not isinstance(dim_gears, dict) or len(dim_gears) != 1:
        raise ValueError(
            f"set_dim_gears: dim_gears={dim_gears!r}: airgraph pads one dimension (the batch): give one "
            "{dim: [sizes]}; make other dimensions dynamic with torch._dynamo.mark_dynamic"
        )
    ((dim, gears),) = dim_gears.items()
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < t.dim():
        raise ValueError(f"set_dim_gears: dim {dim!r}: must be an int in [0, {t.dim() - 1}] for a {t.dim()}-d tensor")
    if (
        not isinstance(gears, list | tuple)
        or not gears
        or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in gears)
    ):
        raise ValueError(f"set_dim_gears: gears {gears!r} of dim {dim}: must be a non-empty list of ints >= 1")
    given = {dim: sorted(set(gears))}
    if getattr(t, "dim_gears", None) not in (None, given):
        raise ValueError(f"set_dim_gears: the tensor already has the gears {t.dim_gears}, not {given}")
    torch._dynamo.mark_dynamic(t, dim)
    t.dim_gears = given  # type: ignore[attr-defined]


def cache_compile(
    func: Any,
    *,
    config: _CompilerConfig | None = None,
    backend: Any = None,
    dynamic: bool = True,
    cache_dir: str | None = None,
    global_rank: int | None = None,
    tp_rank: int | None = None,
    pp_rank: int | None = None,
    ge_cache: bool = False,
) -> Any:
    """TorchAir's ``torchair.inference.cache_compile(func, config=..., cache_dir=...)``: airgraph.cache_compile
    (airgraph/cache/aot_package.py), which loads a later process's program without Dynamo as TorchAir's does.
    ``cache_dir`` becomes ``config.compile_cache``. ``dynamic``: every input signature has an entry of its own
    here. The ranks and ``ge_cache`` change nothing: weights are inputs, so one entry serves every rank with the
    same shapes, and there is no GE graph to cache apart. ``backend``: only airgraph's."""
    from airgraph.cache.aot_package import cache_compile as _cache_compile

    if backend is not None and not isinstance(backend, AirgraphBackend):
        raise TypeError(
            f"cache_compile: backend {type(backend).__name__} is not airgraph's; leave it out or pass "
            "get_npu_backend(compiler_config=config)"
        )
    config = copy.deepcopy(config if config is not None else (backend.config if backend is not None else None))
    if config is None:
        config = CompilerConfig()
    if cache_dir is not None:
        config.compile_cache = cache_dir
    return _cache_compile(func, config=config)


inference = SimpleNamespace(set_dim_gears=set_dim_gears, cache_compile=cache_compile)


class TorchAirBackend(AirgraphBackend):
    """The airgraph backend ``get_npu_backend`` returns: a graph whose inputs carry ``set_dim_gears`` sets the
    capture sizes and dimension from them (unless the config gives the same ones; other ones are an error)."""

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        gears = _dim_gears(gm, example_inputs)
        if gears is not None:
            options, (dim, sizes) = self.config.reduce_overhead, gears
            if not options.capture_sizes:
                options.capture_dim, options.capture_sizes = dim, sizes
            elif (options.capture_dim, list(options.capture_sizes)) != (dim, sizes):
                raise ValueError(
                    f"set_dim_gears gives dimension {dim} the sizes {sizes}, but config.reduce_overhead has "
                    f"capture_sizes={list(options.capture_sizes)}, capture_dim={options.capture_dim}: give one"
                )
        return super().__call__(gm, example_inputs, **kwargs)


def _dim_gears(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[int, list[int]] | None:
    """The (dim, sizes) the graph's inputs were given by set_dim_gears, or None; several different ones refused."""
    found = set()
    for placeholder, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs, strict=False):
        arg = getattr(placeholder.meta.get("grapharg"), "example", None)
        for tensor in (example, arg):
            gears = getattr(tensor, "dim_gears", None) if isinstance(tensor, torch.Tensor) else None
            if gears:
                ((dim, sizes),) = gears.items()
                found.add((dim, tuple(sizes)))
    if len(found) > 1:
        raise ValueError(
            f"set_dim_gears: the inputs of one graph have different gears {sorted(found)}: airgraph pads one "
            "dimension to one list of sizes (give every batched input the same gears)"
        )
    if not found:
        return None
    ((dim, sizes),) = found
    return dim, list(sizes)


def get_npu_backend(*, compiler_config: _CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_npu_backend``: the airgraph backend for CUDA (or the CPU). AOE's environment variables
    (``AOE_MODE``, ``TUNE_BANK_PATH``, ``REPEAT_TUNE``, ``ASCEND_WORK_PATH``) fill the tuning options the config
    leaves at their defaults."""
    config = copy.deepcopy(compiler_config) if compiler_config is not None else CompilerConfig()
    if not isinstance(config, _CompilerConfig):
        return get_backend(config)  # the backend's own error names the type
    declared = TuningConfig._options()
    for name, value in torchair_tuning_environment().items():
        if getattr(config.tuning, name) == declared[name].default:
            setattr(config.tuning, name, value)
    return TorchAirBackend(config)


def get_compiler(compiler_config: _CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_compiler``; airgraph has one object for both roles."""
    return get_npu_backend(compiler_config=compiler_config)
