"""TorchAir's names for airgraph's features, so a TorchAir script runs after changing imports and device.

# import torchair as tng                        ->  from airgraph.compat import torchair as tng
# from torchair.configs.compiler_config import CompilerConfig
from airgraph.compat.torchair import CompilerConfig, get_npu_backend

config = CompilerConfig()
config.mode = "reduce-overhead"
backend = get_npu_backend(compiler_config=config)
model = torch.compile(model, backend=backend, fullgraph=True)   # .npu() -> .cuda()

tng.dynamo_export(x, y, model=model, dynamic=False)  # export_file/export.onnx (ONNX, not AIR)

with tng.scope.npu_stream_switch("1"):                # in-graph multi-stream
    tng.ops.npu_tagged_event_wait(event)

config.experimental_config.aclgraph._aclnn_static_shape_kernel = True             # static kernels (airgraph/kernels):
config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = "/path"  # config.static_kernels.*
config.aoe_config.aoe_mode = "2"                      # tuning (AOE): "2" operators, "1" subgraphs
config.aoe_config.work_path = "./aoe_results"         # where aoe_result_*.json go
config.aoe_config.aoe_config_file = "ops.json"        # only these ops: {"tune_ops_type": [...], "tune_ops_name": [...]}

The seed's environment variables ``AOE_MODE``, ``TUNE_BANK_PATH``, ``REPEAT_TUNE`` and ``ASCEND_WORK_PATH`` set
the tuning options ``get_npu_backend`` leaves at their defaults (read in airgraph/config.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from airgraph import dynamo_export
from airgraph import ops as _ops
from airgraph import scope as _scope
from airgraph.backend import AirgraphBackend, get_backend
from airgraph.config import _AOE_MODES as _CONFIG_AOE_MODES
from airgraph.config import CompilerConfig as _CompilerConfig
from airgraph.config import ExperimentalConfig as _ExperimentalConfig
from airgraph.config import TuningConfig, torchair_tuning_environment

__all__ = ["CompilerConfig", "dynamo_export", "get_compiler", "get_npu_backend", "ops", "scope"]

# tng.scope.npu_stream_switch(tag, priority) and the tagged-event ops, under TorchAir's names.
scope = SimpleNamespace(npu_stream_switch=_scope.stream_switch)
ops = SimpleNamespace(
    npu_create_tagged_event=_ops.create_tagged_event,
    npu_tagged_event_record=_ops.tagged_event_record,
    npu_tagged_event_wait=_ops.tagged_event_wait,
    npu_record_tagged_stream=_ops.record_tagged_stream,
)


class _AclGraph:
    """TorchAir's ``experimental_config.aclgraph``: its static-kernel names, read and written through to
    ``config.static_kernels`` (validated there), so the configuration has one value for each."""

    NAMES: ClassVar[dict[str, str]] = {
        "_aclnn_static_shape_kernel": "enabled",
        "_aclnn_static_shape_kernel_build_dir": "build_dir",
    }

    def __init__(self, root: _CompilerConfig) -> None:
        object.__setattr__(self, "_root", root)

    def __getattr__(self, name: str) -> object:
        if name in _AclGraph.NAMES:
            return getattr(self._root.static_kernels, _AclGraph.NAMES[name])
        raise AttributeError(self._unknown(name))

    def __setattr__(self, name: str, value: object) -> None:
        if name not in _AclGraph.NAMES:
            raise AttributeError(self._unknown(name))
        setattr(self._root.static_kernels, _AclGraph.NAMES[name], value)

    @staticmethod
    def _unknown(name: str) -> str:
        return (
            f"experimental_config.aclgraph has no option {name!r} in airgraph; known: {', '.join(_AclGraph.NAMES)} "
            "(they set config.static_kernels.enabled and .build_dir)"
        )


class _TorchAirExperimentalConfig(_ExperimentalConfig):
    @property
    def aclgraph(self) -> _AclGraph:
        return _AclGraph(object.__getattribute__(self, "_root"))


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

    def __init__(self, path: str | None = None) -> None:
        super().__init__(path)
        object.__setattr__(self.experimental_config, "_root", self)

    def __deepcopy__(self, memo: dict) -> CompilerConfig:
        new = super().__deepcopy__(memo)
        object.__setattr__(new.experimental_config, "_root", new)
        return new  # type: ignore[return-value]

    @property
    def aoe_config(self) -> AoeConfig:
        return AoeConfig(self.tuning, self)


def get_npu_backend(*, compiler_config: _CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_npu_backend``: the airgraph backend for CUDA (or the CPU). The seed's environment variables
    (``AOE_MODE``, ``TUNE_BANK_PATH``, ``REPEAT_TUNE``, ``ASCEND_WORK_PATH``) fill the tuning options the config
    leaves at their defaults."""
    config = copy.deepcopy(compiler_config) if compiler_config is not None else CompilerConfig()
    if not isinstance(config, _CompilerConfig):
        return get_backend(config)  # the backend's own error names the type
    declared = TuningConfig._options()
    for name, value in torchair_tuning_environment().items():
        if getattr(config.tuning, name) == declared[name].default:
            setattr(config.tuning, name, value)
    return get_backend(config)


def get_compiler(compiler_config: _CompilerConfig | None = None) -> AirgraphBackend:
    """TorchAir's ``get_compiler``; airgraph has one object for both roles."""
    return get_npu_backend(compiler_config=compiler_config)
