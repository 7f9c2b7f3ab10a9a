"""An ATen graph as bytes and back: what a compile-cache entry keeps of AOTAutograd's work.

torch's ``GraphPickler`` (``torch.fx._graph_pickler``, torch 2.11 to 2.15) writes a graph module with its nodes'
metadata; traced values (fake tensors) come back as fake tensors of the fake mode given to :func:`load_graph`.
It keeps tensors' metadata only, so the real tensors a graph holds as constants (``get_attr``: a lifted
``torch.tensor([])``, a folded constant) are written apart, with their bytes (``torch.save``), and put back.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

__all__ = ["dump_graph", "load_graph"]


def _constants(gm: torch.fx.GraphModule) -> dict[tuple[str, str], torch.Tensor]:
    """(module path, attribute) -> real tensor, for every constant a ``get_attr`` node of ``gm`` or of one of its
    submodules reads."""
    found = {}
    for path, module in gm.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.find_nodes(op="get_attr"):
            owner, _, name = str(node.target).rpartition(".")
            holder = module.get_submodule(owner) if owner else module
            value = getattr(holder, name, None)
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                found[(f"{path}.{owner}".strip("."), name)] = value
    return found


def dump_graph(gm: torch.fx.GraphModule) -> bytes:
    """``gm`` (an ATen graph module, its nodes' metadata included) as bytes for :func:`load_graph`."""
    from torch.fx._graph_pickler import GraphPickler, Options

    constants = _constants(gm)
    kinds = {}
    for path, name in constants:  # written apart, with their bytes (module docstring)
        holder = gm.get_submodule(path) if path else gm
        kinds[(path, name)] = "buffer" if name in holder._buffers else "attribute"
        persistent = name not in holder._non_persistent_buffers_set
        kinds[(path, name)] += "" if persistent else " (not persistent)"
        delattr(holder, name)
    try:
        graph = GraphPickler.dumps(gm, Options(ops_filter=None))
    finally:  # put back as they were: the graph compiles on in this process
        for (path, name), value in constants.items():
            holder = gm.get_submodule(path) if path else gm
            if kinds[(path, name)].startswith("buffer"):
                holder.register_buffer(name, value, persistent="not persistent" not in kinds[(path, name)])
            else:
                setattr(holder, name, value)
    buffer = io.BytesIO()
    with unset_fake_temporarily():  # real constants, read while a compile's fake mode is active
        torch.save({f"{path}\0{name}": value.detach().cpu() for (path, name), value in constants.items()}, buffer)
    devices = {f"{path}\0{name}": str(value.device) for (path, name), value in constants.items()}
    return pickle.dumps({"graph": graph, "constants": buffer.getvalue(), "devices": devices}, protocol=5)


def load_graph(data: bytes, fake_mode: Any) -> torch.fx.GraphModule:
    """The graph module :func:`dump_graph` wrote, its traced values fake tensors of ``fake_mode``."""
    from torch.fx._graph_pickler import GraphPickler

    import airgraph.ops  # noqa: F401  (airgraph's own ops must be registered before a graph naming them loads)

    document = pickle.loads(data)
    gm = GraphPickler.loads(document["graph"], fake_mode)
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"expected a graph module, found {type(gm).__name__}")
    with unset_fake_temporarily():
        constants = torch.load(io.BytesIO(document["constants"]), weights_only=True)
        for key, value in constants.items():
            path, name = key.split("\0")
            setattr(gm.get_submodule(path) if path else gm, name, value.to(document["devices"][key]))
    return gm
