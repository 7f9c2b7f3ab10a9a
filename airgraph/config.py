"""CompilerConfig: every airgraph option, declared, documented and validated in one place.

Options live in nested groups, in the spirit of TorchAir's ``CompilerConfig``::

    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump = "/tmp/graphs"
    config.passes.remove_noops = False

Every assignment is validated: a bad value raises ``ValueError`` naming the option, the value and what is
allowed; an unknown option raises ``AttributeError`` suggesting the nearest name. This module is also the
only place that reads environment variables.

(Over 400 lines because every option of every feature is declared here, in one place, by design: one file to
read for what can be set, one reader of the environment.)
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CompilerConfig", "Option", "OptionGroup", "torch_cuda_caching_disabled", "torchair_tuning_environment"]


class Option:
    """One declared option: a default, a one-line doc, and what values it accepts."""

    def __init__(
        self,
        default: Any,
        doc: str,
        *,
        choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None,
        types: type | tuple[type, ...] | None = None,
        check: Callable[[Any], str | None] | None = None,
        allowed: str | None = None,
        env: str | None = None,
        normalize: Callable[[Any], Any] | None = None,
        minimum: int | None = None,
    ) -> None:
        """``normalize`` maps an accepted spelling to the stored value before validation (an environment string,
        a seed's alias such as AOE's "2" for "op"). ``minimum``: an int option's least value (None passes where
        the types allow it), its ``check`` and ``allowed`` text both."""
        self.doc = doc
        self.normalize = normalize
        self._choices = choices
        kinds = types if types is not None or choices is not None else type(default)
        self.types: tuple[Any, ...] = kinds if isinstance(kinds, tuple) else (kinds,)
        if minimum is not None:

            def check(value: int | None) -> str | None:
                return None if value is None or value >= minimum else f"must be >= {minimum}"

            allowed = f"an int >= {minimum}" + (" or None" if type(None) in self.types else "")
        self.check = check
        self.allowed = allowed
        self.env = env
        self.name = "?"
        self.default = default

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The allowed values, or None; a callable is asked each time (a registry that lists them)."""
        return self._choices() if callable(self._choices) else self._choices

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def describe_allowed(self) -> str:
        if self.choices is not None:
            return ", ".join(repr(c) for c in self.choices)
        if self.allowed is not None:
            return self.allowed
        return " or ".join("None" if k is type(None) else k.__name__ for k in self.types)

    def validate(self, path: str, value: Any) -> Any:
        def bad(reason: str = "") -> ValueError:
            extra = f" ({reason})" if reason else ""
            return ValueError(
                f"{path}: invalid value {value!r}{extra}; allowed values: {self.describe_allowed()}. {self.doc}"
            )

        if self.normalize is not None:
            try:
                value = self.normalize(value)
            except (TypeError, ValueError) as exc:
                raise bad(str(exc)) from None

        if self.choices is not None:
            if value not in self.choices:
                raise bad()
            return value
        # bool is an int subclass: an int option must not take True, a bool option must not take 1.
        if isinstance(value, bool) and bool not in self.types:
            raise bad("a bool is not accepted here")
        if not isinstance(value, self.types):
            raise bad(f"got {type(value).__name__}")
        if self.check is not None:
            reason = self.check(value)
            if reason:
                raise bad(reason)
        return value

    def initial(self) -> Any:
        if self.env is not None and self.env in os.environ:
            raw = os.environ[self.env]
            value: Any = raw
            if bool in self.types:
                value = _truthy(raw)
            elif int in self.types:
                try:
                    value = int(raw)
                except ValueError:
                    raise ValueError(
                        f"environment variable {self.env}={raw!r} is not an integer; unset it or give an integer. "
                        f"{self.doc}"
                    ) from None
            return value
        return copy.deepcopy(self.default)


def _truthy(raw: str) -> bool:
    """An environment variable's boolean: 1, true, yes or on (any case)."""
    return raw.strip().lower() in ("1", "true", "yes", "on")


def torch_cuda_caching_disabled() -> bool:
    """Whether ``PYTORCH_NO_CUDA_MEMORY_CACHING`` (PyTorch's own variable, read here as every variable is) bypasses
    PyTorch's CUDA caching allocator, which CUDA graph capture needs: set to anything but 0/false/no/off."""
    value = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _kernel_backends() -> tuple[str, ...]:
    """The registry's selectable kernel backends (airgraph/lowering/backends.py: no torch import)."""
    from airgraph.lowering.backends import selectable

    return selectable()


def _folder_or_none(value: str | None) -> str | None:
    if value is None:
        return None
    return "an empty path" if not value.strip() else ("contains a NUL byte" if "\0" in value else None)


class OptionGroup:
    """A group of options and nested groups; subclasses declare them as class attributes."""

    _path = "CompilerConfig"

    def __init__(self, path: str | None = None) -> None:
        object.__setattr__(self, "_path", path or type(self)._path)
        object.__setattr__(self, "_values", {})
        for name, opt in self._options().items():
            value = opt.initial()
            self._values[name] = opt.validate(f"{self._path}.{name}", value)
        for name, group_cls in self._groups().items():
            object.__setattr__(self, name, group_cls(f"{self._path}.{name}"))

    @classmethod
    def _options(cls) -> dict[str, Option]:
        return {n: v for k in reversed(cls.__mro__) for n, v in vars(k).items() if isinstance(v, Option)}

    @classmethod
    def _groups(cls) -> dict[str, type[OptionGroup]]:
        return {
            n: v
            for k in reversed(cls.__mro__)
            for n, v in vars(k).items()
            if isinstance(v, type) and issubclass(v, OptionGroup) and not n.startswith("_")
        }

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            values = object.__getattribute__(self, "_values")
            if name in values:
                return values[name]
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(self._unknown(name))

    def __setattr__(self, name: str, value: Any) -> None:
        options = self._options()
        if name in options:
            self._values[name] = options[name].validate(f"{self._path}.{name}", value)
            return
        if name in self._groups():
            raise AttributeError(f"{self._path}.{name} is an option group; set its options instead")
        raise AttributeError(self._unknown(name))

    def _unknown(self, name: str) -> str:
        known = sorted([*self._options(), *self._groups()])
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{self._path} has no option {name!r}{hint} Known: {', '.join(known)}"

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name in self._options():
            yield name, self._values[name]
        for name in self._groups():
            yield name, getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        """All options as a nested plain dict (groups become dicts)."""
        return {name: value.as_dict() if isinstance(value, OptionGroup) else value for name, value in self}

    def update(self, values: dict[str, Any]) -> None:
        """Set options from a nested dict, validating each one (the inverse of ``as_dict``)."""
        for name, value in values.items():
            if name in self._groups():
                if not isinstance(value, dict):
                    raise ValueError(f"{self._path}.{name} is an option group; give it a dict, not {value!r}")
                getattr(self, name).update(value)
            else:
                setattr(self, name, value)

    def describe(self) -> dict[str, str]:
        """Flat ``{"group.option": doc}`` of every option, for help texts and docs."""
        out: dict[str, str] = {}
        for name, opt in self._options().items():
            out[name] = f"{opt.doc} Allowed: {opt.describe_allowed()}. Default: {opt.default!r}."
        for name in self._groups():
            for sub, doc in getattr(self, name).describe().items():
                out[f"{name}.{sub}"] = doc
        return out

    def __deepcopy__(self, memo: dict) -> OptionGroup:
        new = object.__new__(type(self))
        object.__setattr__(new, "_path", self._path)
        object.__setattr__(new, "_values", copy.deepcopy(self._values, memo))
        for name in self._groups():
            object.__setattr__(new, name, copy.deepcopy(getattr(self, name), memo))
        return new

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        def fmt(group: OptionGroup, indent: int) -> Iterator[str]:
            for name, value in group:
                if isinstance(value, OptionGroup):
                    yield " " * indent + f"{name}:"
                    yield from fmt(value, indent + 2)
                else:
                    yield " " * indent + f"{name} = {value!r}"

        return "\n".join([f"{type(self).__name__}(", *fmt(self, 2), ")"])


class DebugConfig(OptionGroup):
    run_eagerly = Option(
        False,
        "Run every segment through torch.fx.Interpreter instead of compiled kernels (for bisecting a bug).",
        env="AIRGRAPH_RUN_EAGERLY",
    )
    graph_dump = Option(
        None,
        "Folder to write the FX graph after each pass into (one subfolder per graph); None disables.",
        types=(str, type(None)),
        allowed="a folder path (str) or None",
        env="AIRGRAPH_GRAPH_DUMP",
    )
    trace_path = Option(
        None,
        "airgraph.explain also profiles one more run (torch.profiler) and writes a Chrome/Perfetto trace here.",
        types=(str, type(None)),
        allowed="a .json file path (str) or None",
    )


class PassesConfig(OptionGroup):
    """One switch per pass of the pipeline (airgraph/passes/pipeline.py), named after the pass."""

    streams = Option(
        True,
        "Turn stream scopes and tagged events into per-node streams and event edges (off: all on one stream).",
    )
    dead_code_elimination = Option(True, "Remove nodes whose results are never used and have no side effects.")
    remove_noops = Option(True, "Remove ops that return their input unchanged (same-shape views, x + 0, x * 1, ...).")
    host_placement = Option(
        True,
        "Run tiny ops on host data (shape arithmetic, position ids, ...) on the CPU instead of the GPU; see "
        "host_placement.max_elements.",
    )


class HostPlacementConfig(OptionGroup):
    max_elements = Option(
        8,
        "Largest output (in elements) of an op that host placement moves to the CPU (GE uses 8).",
        minimum=0,
    )


class ReduceOverheadConfig(OptionGroup):
    capture_limit = Option(
        64,
        "Most input-shape keys captured per compiled graph; later keys run uncaptured (warned once).",
        minimum=1,
    )
    warmup_iters = Option(1, "Uncaptured runs of a new shape key before it is captured.", minimum=1)


class ExperimentalConfig(OptionGroup):
    keep_inference_input_mutations = Option(
        True,
        "Keep in-place updates of inputs (KV caches, buffers) inside the compiled graph, so capture covers them.",
    )


class ExportExperimentalConfig(OptionGroup):
    enable_record_nn_module_stack = Option(False, "Record each exported node's module path in its metadata.")
    auto_atc_config_generated = Option(False, "In a multi-rank export, rank 0 also writes the deployment config files.")


class ExportConfig(OptionGroup):
    external_weights_threshold = Option(
        2 * 1024**3 - 200 * 1024**2,
        "Serialized model size in bytes above which weights are written as external files.",
        minimum=0,
    )
    experimental = ExportExperimentalConfig


class StaticKernelsConfig(OptionGroup):
    """Static kernels (seed 000, airgraph/kernels): record the input shapes each compute segment runs with, build a
    shape-specialized kernel per shape, ship them as packages installed into a kernel library, and run them."""

    enabled = Option(
        False,
        "Record each compute segment's shapes, build a static-shape kernel per shape, and run installed ones.",
        env="AIRGRAPH_STATIC_KERNELS",
    )
    build_dir = Option(
        None,
        "Folder of the records and packages (static_kernel_outputs/ in it); None: the working directory.",
        types=(str, type(None)),
        check=_folder_or_none,
        allowed="a folder path (str) or None",
        env="AIRGRAPH_STATIC_KERNELS_BUILD_DIR",
    )
    library_dir = Option(
        None,
        "The kernel library: packages are installed into it, static kernels loaded from it; None: "
        "<build_dir>/static_kernel_library.",
        types=(str, type(None)),
        check=_folder_or_none,
        allowed="a folder path (str) or None",
        env="AIRGRAPH_KERNEL_LIBRARY",
    )
    build = Option(
        True,
        "Build the static kernels of shapes the library lacks (off: record shapes, run installed kernels only).",
        env="AIRGRAPH_STATIC_KERNELS_BUILD",
    )
    local_world_size = Option(
        None,
        "Processes on this node sharing build_dir (torchrun sets LOCAL_WORLD_SIZE); required when LOCAL_RANK or "
        "WORLD_SIZE say there are several.",
        types=(int, type(None)),
        minimum=1,
        env="LOCAL_WORLD_SIZE",
    )
    local_rank = Option(
        None,
        "This process's rank on its node (torchrun's LOCAL_RANK).",
        types=(int, type(None)),
        minimum=0,
        env="LOCAL_RANK",
    )
    world_size = Option(
        None,
        "Processes in the whole job (torchrun's WORLD_SIZE).",
        types=(int, type(None)),
        minimum=1,
        env="WORLD_SIZE",
    )


# AOE's AOE_MODE values: "1" subgraph tuning (SGAT), "2" operator tuning (OPAT).
_AOE_MODES = {"1": "subgraph", "2": "op"}


def _tune_mode(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip().lower()
        if value in ("", "none", "off"):
            return None
        return _AOE_MODES.get(value, value)
    return value


def _op_list(value: Any) -> Any:
    """``"addmm, mm"`` (an environment string) or a list/tuple of str -> a tuple of names; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in (p.strip() for p in value.split(",")) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise TypeError("expected op types or node names: a list of non-empty str, or one comma-separated str")
    return tuple(value)


def _seconds(value: Any) -> Any:
    return float(value) if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)) else value


def _positive_float(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


class TuningConfig(OptionGroup):
    """Operator (OPAT) and subgraph (SGAT) tuning with a persistent bank (airgraph/tuning, seed 002: AOE)."""

    mode = Option(
        None,
        "Tune each graph on its first run, then run it tuned: 'op' (per operator: implementation, layout, kernel "
        "configuration) or 'subgraph' (per segment: kernel backend and Inductor options); AOE's '2' and '1' too.",
        choices=(None, "op", "subgraph"),
        normalize=_tune_mode,
        env="AIRGRAPH_TUNE_MODE",
    )
    bank_dir = Option(
        None,
        "Folder of the tuning bank that tuning writes and every compile consults (None: a folder in the user cache, "
        "see TuningConfig.resolved_bank_dir).",
        types=(str, type(None)),
        allowed="a folder path (str) or None",
        env="AIRGRAPH_TUNE_BANK",
    )
    work_path = Option(
        None,
        "Folder the tuning reports (aoe_result_opat_*.json, aoe_result_sgat_*.json) are written to (None: the "
        "working directory).",
        types=(str, type(None)),
        allowed="a folder path (str) or None",
        env="AIRGRAPH_WORK_PATH",
    )
    ops = Option(
        None,
        "Tune only these operator types (addmm, mm, bmm, convolution, sdpa, or a group: gemm, attention, conv) or "
        "node names (module path/node, or the node name alone); None: all.",
        types=(tuple, type(None)),
        normalize=_op_list,
        allowed="a list of str, a comma-separated str, or None",
        env="AIRGRAPH_TUNE_OPS",
    )
    repeat = Option(
        False, "Re-tune entries already in the bank (AOE's REPEAT_TUNE); False: use them.", env="AIRGRAPH_TUNE_REPEAT"
    )
    use_bank = Option(
        True,
        "Compiles consult the bank (chosen_by 'tuning'); False ignores it (an untuned baseline).",
        env="AIRGRAPH_TUNE_USE_BANK",
    )
    budget_s = Option(
        6.0,
        "Most seconds spent compiling and measuring the candidates of one operator; the rest are skipped (an "
        "Inductor compile starts only while half of it is left).",
        types=float,
        normalize=_seconds,
        check=_positive_float,
        allowed="a number of seconds > 0",
    )
    subgraph_budget_s = Option(
        30.0,
        "Most seconds spent compiling and measuring the candidates of one segment (each is a compile of it).",
        types=float,
        normalize=_seconds,
        check=_positive_float,
        allowed="a number of seconds > 0",
    )

    def resolved_bank_dir(self) -> str:
        """``bank_dir``, or the user cache's ``airgraph/tuning-bank`` ($XDG_CACHE_HOME or ~/.cache)."""
        if self.bank_dir is not None:
            return self.bank_dir
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(cache, "airgraph", "tuning-bank")


def torchair_tuning_environment() -> dict[str, Any]:
    """The seed's (AOE's) environment variables, for ``airgraph.compat.torchair``'s backend: ``AOE_MODE`` ("1"
    subgraph, "2" op), ``TUNE_BANK_PATH``, ``REPEAT_TUNE`` and ``ASCEND_WORK_PATH`` (where reports go), as
    ``config.tuning`` option names -> values, for the ones that are set."""
    found: dict[str, Any] = {}
    for env, name in (("AOE_MODE", "mode"), ("TUNE_BANK_PATH", "bank_dir"), ("ASCEND_WORK_PATH", "work_path")):
        if os.environ.get(env):
            found[name] = os.environ[env]
    if os.environ.get("REPEAT_TUNE"):
        found["repeat"] = _truthy(os.environ["REPEAT_TUNE"])
    return found


class CompilerConfig(OptionGroup):
    """All options of one airgraph compilation. Copy it freely: the backend keeps its own deep copy."""

    mode = Option(
        "max-autotune",
        "Execution mode: compiled segments run in order, or captured and replayed as CUDA graphs.",
        choices=("max-autotune", "reduce-overhead"),
        env="AIRGRAPH_MODE",
    )
    kernel_backend = Option(
        "inductor",
        "Lowers each segment unless the seam chooses otherwise: Inductor (fused Triton/C++ kernels) or direct "
        "ATen calls (fast to compile).",
        choices=_kernel_backends,
        env="AIRGRAPH_KERNEL_BACKEND",
    )
    debug = DebugConfig
    passes = PassesConfig
    reduce_overhead = ReduceOverheadConfig
    host_placement = HostPlacementConfig
    experimental_config = ExperimentalConfig
    export = ExportConfig
    static_kernels = StaticKernelsConfig
    tuning = TuningConfig
