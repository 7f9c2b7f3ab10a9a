"""CompilerConfig: every airgraph option, declared, documented and validated in one place.

Options live in nested groups, in the spirit of TorchAir's ``CompilerConfig``::

    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump = "/tmp/graphs"
    config.passes.remove_noops = False

Every assignment is validated: a bad value raises ``ValueError`` naming the option, the value and what is
allowed; an unknown option raises ``AttributeError`` suggesting the nearest name. This module is also the
only place that reads environment variables. A config is also a JSON file (``to_file``/``from_file``, and
``AIRGRAPH_CONFIG=PATH``): JSON because the standard library both reads and writes it (``tomllib`` only reads)
and it holds None, which TOML cannot. How an option is declared, validated and grouped (``Option``,
``OptionGroup``) is airgraph/options.py's; this file is the one to read for what can be set.
"""

from __future__ import annotations

import os
from typing import Any

from airgraph.options import Option, OptionGroup, truthy

__all__ = [
    "CompilerConfig",
    "Option",
    "OptionGroup",
    "torch_cuda_caching_disabled",
    "torchair_tuning_environment",
    "user_cache_dir",
]


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


def _folder_list(value: Any) -> Any:
    """``"/a:/b"`` (an environment string, ``os.pathsep``-separated) or a list/tuple of str -> a tuple of absolute
    folders (``~`` expanded); "*" is refused: trusting means naming the folders."""
    if isinstance(value, str):
        value = [part for part in (p.strip() for p in value.split(os.pathsep)) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TypeError("expected folders: a list of non-empty str, or one os.pathsep-separated str")
    found = []
    for folder in value:
        if folder.strip() in ("*", "/") or "\0" in folder:
            raise ValueError(f"{folder!r} would trust everything; name each shared folder to trust")
        expanded = os.path.expanduser(folder)
        if not os.path.isabs(expanded):
            raise ValueError(f"{folder!r} is not an absolute path; give the full path of the folder")
        found.append(os.path.normpath(expanded))
    return tuple(found)


def _op_list(value: Any) -> Any:
    """``"addmm, mm"`` (an environment string) or a list/tuple of str -> a tuple of names; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in (p.strip() for p in value.split(",")) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise TypeError("expected op types or node names: a list of non-empty str, or one comma-separated str")
    return tuple(value)


def _name_tuple(value: Any) -> tuple[str, ...]:
    """:func:`_op_list` for an option that is never None: None (unset) is the empty tuple."""
    return _op_list(value) or ()


def user_cache_dir(name: str) -> str:
    """``<user cache>/airgraph/<name>``: the user cache is ``$XDG_CACHE_HOME``, else ``~/.cache`` (Inductor's and
    torch hub's caches follow the same convention)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "airgraph", name)


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
    concat_linear = Option(
        True,
        "Matmuls of one input by constant weights (q/k/v, gate/up projections; with frozen_parameters) become one "
        "matmul over the weights concatenated, then split.",
    )
    fallback = Option(
        True,
        "Mark the nodes config.fallback names (aten_nodes, keep_ops) so they run as eager would: their own "
        "segments, through the aten kernel backend (chosen_by 'compare').",
    )


class FallbackConfig(OptionGroup):
    """Nodes that run as eager would, as ``airgraph.compare``'s ``report.fallback()`` writes them (airgraph/precision
    /fallback.py); the passes.fallback pass marks them and the seam runs them (chosen_by "compare")."""

    aten_nodes = Option(
        (),
        "ATen nodes (their names in the graph after the passes, 'addmm_1', or an op's, 'aten.addmm.default', for "
        "all its nodes; 'forward:addmm_1' for one graph kind) that run through the aten kernel backend, not the "
        "configured one.",
        types=tuple,
        normalize=_name_tuple,
        allowed="a list of node names (str) or a comma-separated str",
        env="AIRGRAPH_FALLBACK_ATEN_NODES",
    )
    keep_ops = Option(
        (),
        "ATen ops ('aten.silu' or 'aten.silu.default') not decomposed before the kernels: each node of them keeps "
        "the op and runs it through the aten kernel backend, as eager does.",
        types=tuple,
        normalize=_name_tuple,
        check=lambda value: next((f"{v!r} is not an aten op name" for v in value if not v.startswith("aten.")), None),
        allowed="a list of 'aten.NAME' or 'aten.NAME.OVERLOAD' (str) or a comma-separated str",
        env="AIRGRAPH_FALLBACK_KEEP_OPS",
    )
    pass_nodes = Option(
        (),
        "'pass:node' pairs ('remove_noops:view_1'): the pass leaves that node as it is (passes that can: "
        "remove_noops; compare switches the others off whole).",
        types=tuple,
        normalize=_name_tuple,
        check=lambda value: next((f"{v!r} is not 'pass:node'" for v in value if v.count(":") != 1), None),
        allowed="a list of 'pass:node' (str) or a comma-separated str",
        env="AIRGRAPH_FALLBACK_PASS_NODES",
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
    input_copies = Option(
        "launch",
        "How a replay's inputs reach the graph's buffers: 'launch' (one copy launch per dtype before the replay) "
        "or 'in-graph' (memcpy nodes recorded in the graph, pointed at each call's tensors: no launch; CUDA needs "
        "cuda.bindings, which torch's Linux CUDA wheels bring).",
        choices=("launch", "in-graph"),
    )
    capture_sizes = Option(
        (),
        "Batch sizes to capture (vLLM-Ascend's graph_batch_sizes, TorchAir's set_dim_gears): a call's dynamic batch "
        "is padded up to the next size and its outputs sliced back, so these graphs serve every batch up to the "
        "largest; empty: one graph per batch size. Needs the batch dimension dynamic (torch.compile(dynamic=True) or "
        "torch._dynamo.mark_dynamic).",
        normalize=lambda value: _sizes(value),
        types=tuple,
        allowed="a list of ints >= 1",
    )
    capture_dim = Option(0, "The input dimension capture_sizes pads (the batch).", minimum=0)
    pad_values = Option(
        {},
        "Per forward argument name, the value its padded rows hold (default 0): e.g. {'attention_mask': 1} where "
        "zero rows would be wrong. Padded rows never reach a real row's values or the caller's tensors.",
        types=dict,
        check=lambda value: (
            None
            if all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in value.items()
            )
            else "expected {argument name: int or float}"
        ),
        allowed="a dict of str to int or float",
    )


def _sizes(value: Any) -> tuple[int, ...]:
    """A list of capture sizes, sorted, without repeats; anything else is refused (Option.validate names it)."""
    if not isinstance(value, list | tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError("expected a list of ints")
    if any(v < 1 for v in value):
        raise ValueError("every size must be >= 1")
    return tuple(sorted(set(value)))


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
    """Static kernels (TorchAir's _aclnn_static_shape_kernel, airgraph/kernels): record the input shapes each compute
    segment runs with, build a shape-specialized kernel per shape, ship them as packages installed into a kernel
    library, and run them."""

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


def _seconds(value: Any) -> Any:
    return float(value) if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)) else value


def _positive_float(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


class TuningConfig(OptionGroup):
    """Operator (OPAT) and subgraph (SGAT) tuning with a persistent bank (AOE's, airgraph/tuning)."""

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

    lock_dir = Option(
        None,
        "Folder of the device locks through which tuning processes take turns to measure, one measurement at a "
        "time per device (None: a folder in the user cache, see TuningConfig.resolved_lock_dir; give processes "
        "of several users one folder they can all write to share a device among them).",
        types=(str, type(None)),
        allowed="a folder path (str) or None",
        env="AIRGRAPH_TUNE_LOCK_DIR",
    )
    lock_timeout_s = Option(
        600.0,
        "Most seconds a measurement waits for its device's turn; past it, it measures beside the process holding "
        "it (with a warning: its timings may be spoiled, and the noise rule judges them).",
        types=float,
        normalize=_seconds,
        check=_positive_float,
        allowed="a number of seconds > 0",
    )

    def resolved_bank_dir(self) -> str:
        """``bank_dir``, or the user cache's ``airgraph/tuning-bank`` ($XDG_CACHE_HOME or ~/.cache)."""
        if self.bank_dir is not None:
            return self.bank_dir
        return user_cache_dir("tuning-bank")

    def resolved_lock_dir(self) -> str:
        """``lock_dir``, or the user cache's ``airgraph/device-locks`` ($XDG_CACHE_HOME or ~/.cache)."""
        if self.lock_dir is not None:
            return self.lock_dir
        return user_cache_dir("device-locks")


def torchair_tuning_environment() -> dict[str, Any]:
    """AOE's environment variables, for ``airgraph.compat.torchair``'s backend: ``AOE_MODE`` ("1"
    subgraph, "2" op), ``TUNE_BANK_PATH``, ``REPEAT_TUNE`` and ``ASCEND_WORK_PATH`` (where reports go), as
    ``config.tuning`` option names -> values, for the ones that are set."""
    found: dict[str, Any] = {}
    for env, name in (("AOE_MODE", "mode"), ("TUNE_BANK_PATH", "bank_dir"), ("ASCEND_WORK_PATH", "work_path")):
        if os.environ.get(env):
            found[name] = os.environ[env]
    if os.environ.get("REPEAT_TUNE"):
        found["repeat"] = truthy(os.environ["REPEAT_TUNE"])
    return found


class CompilerConfig(OptionGroup):
    """All options of one airgraph compilation. Copy it freely: the backend keeps its own deep copy. A new one
    starts from the environment variables its options name."""

    mode = Option(
        "max-autotune",
        "Execution mode, by TorchAir's names: max-autotune (graph mode) runs the compiled segments in order, "
        "reduce-overhead also captures the graph and replays it as CUDA graphs. max-autotune does no autotuning of "
        "its own, unlike torch.compile's mode of that name: tuning is airgraph.tune.",
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
    frozen_parameters = Option(
        False,
        "Inference graphs hold the model's parameters (nn.Parameter, not updated by the graph) as constants, so the "
        "compile may lay them out anew (concat_linear); the graph keeps the values it was compiled with: change "
        "weights in place before compiling, or call torch.compiler.reset() after (TorchAir's "
        "experimental_config.frozen_parameter).",
        env="AIRGRAPH_FROZEN_PARAMETERS",
    )
    debug = DebugConfig
    passes = PassesConfig
    reduce_overhead = ReduceOverheadConfig
    host_placement = HostPlacementConfig
    experimental_config = ExperimentalConfig
    export = ExportConfig
    compile_cache = Option(
        True,
        "The compile cache: a later process with the same model code, config, torch, airgraph and machine reuses "
        "what this one compiled (docs/compile-cache.md). True: on, in $AIRGRAPH_CACHE_DIR, else the user cache's "
        "airgraph/compile-cache; a folder path: on, in that folder; False: off.",
        types=(bool, str),
        check=lambda value: _folder_or_none(value) if isinstance(value, str) else None,
        allowed="True, False or a folder path (str)",
    )
    trusted_folders = Option(
        (),
        "Folders others can write that airgraph may still load compiled code from (the compile cache, "
        "cache_compile packages): a path inside one is not checked for its owner and mode (airgraph/trust.py, "
        "docs/trust.md). Trust only folders whose every writer you trust; an environment string separates them with "
        "os.pathsep.",
        types=(tuple,),
        normalize=_folder_list,
        allowed="a list of absolute folder paths, or one os.pathsep-separated str",
        env="AIRGRAPH_TRUSTED_FOLDERS",
    )
    static_kernels = StaticKernelsConfig
    tuning = TuningConfig
    fallback = FallbackConfig

    def __init__(self, path: str | None = None) -> None:
        """The defaults, then the options' environment variables, then the JSON file ``AIRGRAPH_CONFIG`` names
        (``to_file``'s form; its options win over the variables)."""
        super().__init__(path, os.environ)
        if path is None and os.environ.get("AIRGRAPH_CONFIG"):
            self.load_file(os.environ["AIRGRAPH_CONFIG"])

    def resolved_cache_dir(self) -> str | None:
        """The compile cache's folder: ``compile_cache`` when it is a path, ``$AIRGRAPH_CACHE_DIR`` or the user
        cache's ``airgraph/compile-cache`` when it is True; None when it is False (off)."""
        if self.compile_cache is False:
            return None
        if isinstance(self.compile_cache, str):
            return self.compile_cache
        return os.environ.get("AIRGRAPH_CACHE_DIR") or user_cache_dir("compile-cache")
