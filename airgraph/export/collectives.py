"""Collectives in an exported graph: ``_c10d_functional`` ops -> ``com.microsoft`` AllReduce / AllGather nodes.

:func:`translation_table` gives torch.onnx's exporter onnxscript functions for what Dynamo makes of
``torch.distributed`` collectives:

- ``all_reduce(x, op, group)`` -> ``com.microsoft::AllReduce(x)`` (a sum); ``avg`` adds a ``Div`` by the group
  size; ``product``, ``min``, ``max`` keep one AllReduce whose ``airgraph.reduce_op`` metadata says so;
- ``all_gather_into_tensor(x, group_size, group)`` -> ``com.microsoft::AllGather(x)`` (``axis=0``, ``group_size``);
- ``wait_tensor(x)`` -> ``Identity(x)`` (the optimizer removes it).

Each collective node records its group in ``metadata_props``: ``airgraph.collective``, ``airgraph.group_name``,
``airgraph.group_ranks`` (JSON), ``airgraph.group_size`` and, for AllReduce, ``airgraph.reduce_op``
(docs/export.md). :func:`register_schemas` registers onnxruntime's signatures of these contrib ops with
``onnx.defs`` once per process, since onnxscript needs a schema to build a node.
"""

from __future__ import annotations

import json
from typing import Any

import onnx
import torch
from onnx.defs import OpSchema
from onnxscript import ir, values
from onnxscript import opset18 as op

__all__ = [
    "COLLECTIVE_OPS",
    "MS_DOMAIN",
    "collective_nodes",
    "group_ranks",
    "register_schemas",
    "translation_table",
]

MS_DOMAIN = "com.microsoft"
COLLECTIVE_OPS = ("AllReduce", "AllGather")
_REDUCE_OPS = ("sum", "avg", "product", "min", "max")
_TYPES = [f"tensor({t})" for t in ("float16", "float", "double", "bfloat16", "int8", "int32", "int64", "uint8", "bool")]
_MS = values.Opset(MS_DOMAIN, 1)


def register_schemas() -> None:
    """Register onnxruntime's ``com.microsoft`` AllReduce and AllGather (version 1) with onnx.defs, once."""
    param = OpSchema.FormalParameter
    schemas = {
        "AllReduce": OpSchema(
            "AllReduce",
            MS_DOMAIN,
            1,
            "Reduces the input across the ranks of a group (onnxruntime contrib op; sums).",
            inputs=[param("input", "T")],
            outputs=[param("output", "T")],
            type_constraints=[("T", _TYPES, "tensors MPI can reduce")],
        ),
        "AllGather": OpSchema(
            "AllGather",
            MS_DOMAIN,
            1,
            "Concatenates the inputs of a group's ranks along axis, in rank order (onnxruntime contrib op).",
            inputs=[param("input", "T")],
            outputs=[param("output", "T")],
            type_constraints=[("T", _TYPES, "any tensor")],
            attributes=[
                OpSchema.Attribute("axis", OpSchema.AttrType.INT, "the axis to gather on"),
                OpSchema.Attribute("group_size", OpSchema.AttrType.INT, "ranks in the group"),
            ],
        ),
    }
    for name, schema in schemas.items():
        if not onnx.defs.has(name, 1, MS_DOMAIN):
            onnx.defs.register_schema(schema)


def group_ranks(group_name: str) -> list[int]:
    """Global ranks of the process group torch names ``group_name`` (collectives' third argument)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    return [int(r) for r in dist.get_process_group_ranks(_resolve_process_group(group_name))]


def _tag(value: Any, collective: str, group_name: str, ranks: list[int], reduce_op: str | None = None) -> None:
    node = value.producer()
    props = node.metadata_props
    props["airgraph.collective"] = collective
    props["airgraph.group_name"] = str(group_name)
    props["airgraph.group_ranks"] = json.dumps(ranks)
    props["airgraph.group_size"] = str(len(ranks))
    if reduce_op is not None:
        props["airgraph.reduce_op"] = reduce_op


def _all_reduce(x: Any, reduce_op: str, group_name: str) -> Any:
    reduce_op = str(reduce_op).lower()
    if reduce_op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce with reduce op {reduce_op!r}: airgraph exports {', '.join(_REDUCE_OPS)}")
    ranks = group_ranks(group_name)
    reduced = _MS.AllReduce(x)
    _tag(reduced, "all_reduce", group_name, ranks, reduce_op)
    if reduce_op != "avg":
        return reduced
    size = op.CastLike(op.Constant(value_int=len(ranks)), reduced)
    return op.Div(reduced, size)


def _all_gather(x: Any, group_size: int, group_name: str) -> Any:
    ranks = group_ranks(group_name)
    if int(group_size) != len(ranks):
        raise ValueError(f"all_gather_into_tensor: group_size {group_size} but group {group_name!r} has {ranks}")
    gathered = _MS.AllGather(x, axis=0, group_size=int(group_size))
    _tag(gathered, "all_gather_into_tensor", group_name, ranks)
    return gathered


def _wait_tensor(x: Any) -> Any:
    return op.Identity(x)


def translation_table() -> dict[Any, Any]:
    """``custom_translation_table`` for ``torch.onnx.export``: the collectives above (registers the schemas)."""
    register_schemas()
    c10d = torch.ops._c10d_functional
    return {
        c10d.all_reduce.default: _all_reduce,
        c10d.all_gather_into_tensor.default: _all_gather,
        c10d.wait_tensor.default: _wait_tensor,
    }


def collective_nodes(model: ir.Model) -> list[dict[str, Any]]:
    """``[{"node", "op", "collective", "group_name", "group_ranks", "reduce_op", "axis", "input", "output"}]``
    of the model's com.microsoft collective nodes, in graph order (export.json's ``distributed.collectives``)."""
    out = []
    for node in model.graph:
        if node.domain != MS_DOMAIN or node.op_type not in COLLECTIVE_OPS:
            continue
        props = node.metadata_props
        axis = node.attributes.get("axis")
        out.append(
            {
                "node": node.name,
                "op": f"{MS_DOMAIN}::{node.op_type}",
                "collective": props.get("airgraph.collective"),
                "group_name": props.get("airgraph.group_name"),
                "group_ranks": json.loads(props.get("airgraph.group_ranks", "null")),
                "reduce_op": props.get("airgraph.reduce_op"),
                "axis": None if axis is None else axis.as_int(),
                "input": node.inputs[0].name if node.inputs and node.inputs[0] is not None else None,
                "output": node.outputs[0].name,
            }
        )
    return out
