"""Frozen parameters (``config.frozen_parameters``, TorchAir's ``experimental_config.frozen_parameter``).

Dynamo hands a module's parameters to the backend as graph inputs (real tensors, each with the source it was
read from); AOTAutograd keeps them as inputs of the ATen graph, in the same positions. With the option on, an
inference graph's parameters that it neither updates nor returns a view of (``aot.unchanged_weights``) become
constants of the graph (``get_attr`` nodes holding the parameter itself, no copy), so the passes may lay them out
anew (passes/concat_linear.py) whatever kernel backend then lowers the graph. Their placeholders stay, unused:
graph inputs never change (passes/base.py), and reduce-overhead neither copies nor checks them (``unread``).

Which values a compiled graph reads (docs/modes.md, "Frozen parameters"):

- a parameter replaced by another tensor (``module.w = nn.Parameter(...)``, ``load_state_dict(assign=True)``,
  another instance of the module's class) recompiles: each frozen parameter's source gets an identity guard
  (Dynamo's ``ID_MATCH``, as torch's own freezing installs), checked by Dynamo's guards at no extra cost;
- a parameter changed in place after compiling (``copy_``, ``load_state_dict``) is not seen by the weights laid
  out anew (they are copies made at compile time), as TorchAir's frozen inputs: change weights before compiling,
  or call ``torch.compiler.reset()`` after.

Only inference graphs (no gradient wanted) freeze: a training graph keeps its parameters as inputs, with one
warning. Buffers and other static-address inputs (a KV cache) stay inputs: code outside the graph may write them.
With static kernels on, nothing is frozen (one warning): their packages are built per graph and shape, not per
weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from airgraph.graph.meta import mark_frozen
from airgraph.log import log, warn_once
from airgraph.lowering import aot

__all__ = ["FROZEN_ATTR", "Parameter", "freeze_parameters", "parameter_inputs"]

FROZEN_ATTR = "_frozen_param"  # attribute name prefix of a frozen parameter on the graph module

TRAINING = (
    "airgraph: config.frozen_parameters applies to inference graphs only (torch.no_grad() or "
    "torch.inference_mode(), or no parameter requiring grad); this graph is compiled for training, so its "
    "parameters stay graph inputs"
)
STATIC_KERNELS = (
    "airgraph: config.frozen_parameters is ignored while config.static_kernels.enabled is on (a static kernel "
    "package is built per graph and shape and holds no weights); the parameters stay graph inputs"
)
NOT_MAPPED = (
    "airgraph: config.frozen_parameters: this graph's inputs are not the Dynamo graph's one for one "
    "(AOTAutograd added or removed some: effect tokens, tensor subclasses, a duplicated input), so its "
    "parameters stay graph inputs"
)


@dataclass(frozen=True)
class Parameter:
    """A Dynamo graph input that is a module's ``nn.Parameter``: its value and the source Dynamo read it from."""

    name: str
    value: torch.Tensor
    source: Any


def parameter_inputs(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[Parameter | None, ...]:
    """Per input of a Dynamo graph, the module parameter it is, or None (call with Dynamo's real inputs)."""
    found: list[Parameter | None] = []
    for placeholder, value in zip(gm.graph.find_nodes(op="placeholder"), example_inputs, strict=False):
        source = getattr(placeholder.meta.get("grapharg"), "source", None)
        if isinstance(value, torch.nn.Parameter) and source is not None:
            name = source.name() if callable(source.name) else source.name
            found.append(Parameter(str(name), value, source))
        else:
            found.append(None)
    return tuple(found)


def freeze_parameters(
    gm: torch.fx.GraphModule, params: tuple[Parameter | None, ...], *, kind: str, static_kernels: bool
) -> tuple[list[int], list[str], str | None]:
    """Turn the unchanged parameters among ``gm``'s inputs into constants, in place (call while the graph
    compiles: AOTAutograd's metadata says which are unchanged). ``params``: :func:`parameter_inputs` of the
    Dynamo graph. Returns the positions frozen, their names, and why none were frozen (None: not refused)."""
    if not any(params):
        return [], [], None
    if kind != "inference":
        warn_once(("frozen_parameters", "training"), TRAINING)
        return [], [], "training graph"
    if static_kernels:
        warn_once(("frozen_parameters", "static_kernels"), STATIC_KERNELS)
        return [], [], "static kernels"
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(params):
        warn_once(("frozen_parameters", "inputs"), NOT_MAPPED)
        return [], [], "inputs not mapped"
    unchanged = aot.unchanged_weights()
    positions = [i for i, p in enumerate(params) if p is not None and i in unchanged and _same(placeholders[i], p)]
    if not positions:
        return [], [], None
    if not _guard_identities([params[i] for i in positions]):
        return [], [], "no Dynamo guards"
    first = next((n for n in gm.graph.nodes if n.op != "placeholder"), None)
    for i in positions:
        placeholder, param = placeholders[i], params[i]
        name = f"{FROZEN_ATTR}{i}"
        with unset_fake_temporarily():  # a buffer: FX's get_attr warns of plain tensor attributes
            gm.register_buffer(name, mark_frozen(param.value.detach()), persistent=False)
        with gm.graph.inserting_before(first):
            constant = gm.graph.get_attr(name)
        constant.meta = dict(placeholder.meta)
        placeholder.replace_all_uses_with(constant)
    gm.graph.lint()
    gm.recompile()
    return positions, [params[i].name for i in positions], None


def _same(placeholder: torch.fx.Node, param: Parameter) -> bool:
    """The traced input is the parameter as Dynamo saw it: same dtype and sizes."""
    val = placeholder.meta.get("val")
    value = param.value
    return isinstance(val, torch.Tensor) and val.dtype == value.dtype and tuple(val.shape) == tuple(value.shape)


def _guard_identities(params: list[Parameter]) -> bool:
    """Dynamo guards on each parameter's identity, so another tensor at its source recompiles the graph (as torch
    installs for its own freezing). False, and nothing frozen, when there is no Dynamo compile to guard."""
    from torch._dynamo.guards import GuardBuilder, install_guard

    if not aot.tracing_active():
        log.info("airgraph: frozen_parameters: no Dynamo compile to guard the parameters; none frozen")
        return False
    install_guard(*(p.source.make_guard(GuardBuilder.ID_MATCH) for p in params))
    return True
