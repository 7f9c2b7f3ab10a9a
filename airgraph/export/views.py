"""contiguous_view_inputs: give every layout-dependent reshape of the captured program a contiguous input.

torch.onnx traces the program three times with fake tensors whose strides need not agree, so a ``reshape`` that
became a ``view`` in one trace can be refused in the next ("Cannot view a tensor ..."; T5 stops there: the case in
docs/design/export-internals.md). ONNX has no strides: ``view`` and ``reshape`` both lower to ``Reshape``. So
before conversion this pass puts ``aten.clone(x, memory_format=torch.contiguous_format)`` in front of each op whose
result depends on its input's layout (:data:`LAYOUT_DEPENDENT`). A clone is never dropped by a decomposition and
is contiguous in every trace; it lowers to ONNX ``Identity``, which onnxscript's optimizer removes, so the ONNX
model is the same.

Left alone: an input that is a graph input, a parameter, a buffer or a view of one (its layout is the example
tensor's in every trace), and any input whose memory some op writes in place (a reshape of a KV cache that is
then updated must stay a view of it).
"""

from __future__ import annotations

import torch

from airgraph.graph.analysis import aliased_base, mutated_nodes, node_label
from airgraph.passes.base import PassResult

__all__ = ["LAYOUT_DEPENDENT", "contiguous_view_inputs"]

aten = torch.ops.aten

# Ops of the captured (training IR) program that become a view or a copy depending on the input's strides,
# or that need a viewable input: their first argument is the tensor reshaped.
LAYOUT_DEPENDENT = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.reshape_as.default,
        aten.view_as.default,
        aten.flatten.using_ints,
        aten.unflatten.int,
    }
)
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node")


def contiguous_view_inputs(gm: torch.fx.GraphModule) -> PassResult:
    """Insert a contiguous clone before the input of each :data:`LAYOUT_DEPENDENT` op (this graph and its
    subgraphs); returns one line per op changed. Edits ``gm`` in place and recompiles it."""
    result = PassResult()
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule) and _rewrite(module.graph, result):
            module.recompile()
    return result


def _rewrite(graph: torch.fx.Graph, result: PassResult) -> bool:
    written = {aliased_base(node) for node in mutated_nodes(graph)}
    before = result.changed
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in LAYOUT_DEPENDENT or not node.args:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or _is_clone_contiguous(source):
            continue
        base = aliased_base(source)
        if base is None or base.op in ("placeholder", "get_attr") or base in written:
            continue
        with graph.inserting_before(node):
            clone = graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
        clone.meta.update({key: node.meta[key] for key in _KEPT_META if key in node.meta})
        value = source.meta.get("val")
        fake_mode = getattr(value, "fake_mode", None)
        if fake_mode is not None:
            with fake_mode:
                clone.meta["val"] = aten.clone.default(value, memory_format=torch.contiguous_format)
        node.replace_input_with(source, clone)
        result.note(f"{node_label(node)}: input {source.name} made contiguous")
    return result.changed > before


def _is_clone_contiguous(node: torch.fx.Node) -> bool:
    return node.target is aten.clone.default and node.kwargs.get("memory_format") is torch.contiguous_format
