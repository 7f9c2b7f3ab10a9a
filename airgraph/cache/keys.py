"""The key of a compile-cache entry: everything that decides what compiling one Dynamo graph gives.

- the graph: its canonical text (lowering/keys.py: ops, arguments, constants by their bytes, inputs' dtypes and
  ranks) and every input's dtype, sizes and strides (only graphs with static shapes have entries);
- which inputs Dynamo marks static, which share memory, their storage offsets;
- the global state Dynamo guards (its ``GlobalStateGuard``: grad mode, the default dtype, autocast, deterministic
  algorithms, TF32, the thread count, ...) and the float32 matmul precision: the traced graph bakes them in;
- the configuration: every option but ``compile_cache`` and ``trusted_folders``; Inductor's and AOTAutograd's own
  configurations (their hashes: a user's ``torch._inductor.config`` patch changes the graphs); the decomposition
  tables AOTAutograd and Inductor apply, each entry by its op and its function's code (a decomposition replaced at
  runtime, as ``airgraph.compare``'s tests plant one, changes the graphs too);
- the software: torch (version and commit), Python, airgraph;
- the machine (airgraph/machine.py): the CPU's model, vector ISA and flags; a GPU's name and compute capability.

Parameters and buffers are graph inputs (Dynamo lifts them), so their values are not in the key: a model with other
weights hits the same entry and computes with its own. A tensor the graph holds as a constant is in the key by
its bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

import airgraph
from airgraph import machine
from airgraph.config import CompilerConfig
from airgraph.lowering.keys import canonical_text, shape_key

__all__ = ["entry_key", "key_facts"]


def key_facts(
    gm: torch.fx.GraphModule, example_inputs: list[Any], config: CompilerConfig, device: torch.device
) -> dict[str, Any] | None:
    """What the key of this Dynamo graph digests (module docstring); None when it has no entry: a symbolic size
    or a symbolic input (dynamic shapes)."""
    traced = [p.meta.get("example_value") for p in gm.graph.find_nodes(op="placeholder")]
    if len(traced) != len(example_inputs) or shape_key(traced) is None:  # Dynamo traced symbolic sizes
        return None
    shapes = shape_key(list(example_inputs))
    if shapes is None or any(isinstance(v, torch.Tensor) and v.is_nested for v in example_inputs):
        return None
    facts = machine.fingerprint(device)
    options = config.as_dict()
    options.pop("compile_cache", None)
    options.pop("trusted_folders", None)  # where code may load from, not what it compiles
    return {
        "graph": hashlib.sha256(canonical_text(gm).encode()).hexdigest(),
        "inputs": [list(s) if isinstance(s, tuple) else s for s in shapes],
        "static_inputs": [_static(p) for p in gm.graph.find_nodes(op="placeholder")],
        "memory": _memory(example_inputs),
        "global_state": _global_state(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "config": options,
        "torch_configs": _torch_config_hashes(),
        "decompositions": decomposition_digest(),
        "torch": facts.torch,
        "torch_git": facts.git,
        "python": facts.python_version,
        "airgraph": facts.airgraph,
        "device": str(device),
        "cpu": {k: facts.cpu[k] for k in ("machine", "model", "isa", "flags")},
        "gpu": facts.gpu,
    }


def entry_key(facts: dict[str, Any]) -> str:
    """The entry's key: a digest of :func:`key_facts`."""
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(f"{airgraph.__version__}\n{text}".encode()).hexdigest()[:40]


def _static(placeholder: torch.fx.Node) -> bool:
    """Whether Dynamo marked this input static (``mark_static_address``; AOTAutograd reads the same mark)."""
    return bool((placeholder.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type"))


def _memory(example_inputs: list[Any]) -> list[Any]:
    """Per input: its storage offset and the first input sharing its memory (aliasing changes what AOTAutograd
    makes of the graph)."""
    first: dict[int, int] = {}
    found: list[Any] = []
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            try:
                storage = value.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):  # no data (a meta or fake tensor): its own
                storage = id(value)
            found.append([value.storage_offset(), first.setdefault(storage, i)])
        else:
            found.append(None)
    return found


def _global_state() -> Any:
    """Dynamo's global-state guard's view of this process (torch 2.11 to 2.15 serialize it as JSON)."""
    try:
        from torch._C._dynamo.guards import GlobalStateGuard

        return json.loads(GlobalStateGuard().__getstate__())
    except Exception:  # another torch: the states this module knows to matter
        return {
            "grad": torch.is_grad_enabled(),
            "dtype": str(torch.get_default_dtype()),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "threads": torch.get_num_threads(),
        }


def decomposition_digest() -> str:
    """A digest of torch's and Inductor's decomposition tables: each op with its function's module, name and code
    (bytecode, constants, and those of the functions it nests), so replacing or adding an entry changes it."""
    from torch._decomp import decomposition_table
    from torch._inductor.decomposition import decompositions

    digest = hashlib.sha256()
    for name, table in (("torch", decomposition_table), ("inductor", decompositions)):
        digest.update(name.encode())
        for op, fn in sorted(table.items(), key=lambda item: str(item[0])):
            inner = getattr(fn, "func", fn)  # a functools.partial: its function (its repr holds an address)
            name = getattr(inner, "__qualname__", type(inner).__qualname__)
            digest.update(f"{op}={getattr(inner, '__module__', '')}.{name}".encode())
            _code_bytes(digest, getattr(getattr(inner, "__wrapped__", inner), "__code__", None))
    return digest.hexdigest()


def _code_bytes(digest: Any, code: Any) -> None:
    if code is None:
        return
    digest.update(code.co_code)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _code_bytes(digest, const)
        else:
            digest.update(_const_text(const).encode())


def _const_text(const: Any) -> str:
    """A code constant as text that is the same in every process: no addresses, no hash-seeded set order."""
    if isinstance(const, tuple):
        return "(" + ",".join(_const_text(c) for c in const) + ")"
    if isinstance(const, frozenset):
        return "frozenset(" + ",".join(sorted(_const_text(c) for c in const)) + ")"
    if const is None or isinstance(const, str | bytes | int | float | complex | bool):
        return repr(const)
    return type(const).__qualname__


def _torch_config_hashes() -> dict[str, str]:
    """Digests of Inductor's and AOTAutograd's configurations (torch's own ``get_hash``, which leaves out the
    entries that name cache folders)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    modules = (("inductor", inductor_config), ("functorch", functorch_config))
    return {name: module.get_hash().hex() for name, module in modules}
