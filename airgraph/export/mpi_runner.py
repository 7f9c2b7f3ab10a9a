"""Run one rank of a multi-rank export: onnxruntime between the collectives, MPI (mpi4py) for them. No torch.

``airgraph run EXPORT_DIR`` on a multi-rank export starts ``mpiexec -n WORLD python -m
airgraph.export.runner EXPORT_DIR ... --mpi-worker`` (runner.py); each process is rank
``MPI.COMM_WORLD.rank`` and runs ``<export_name><rank>.onnx`` like this:

1. Staging: the graph is cut at its ``com.microsoft`` AllReduce / AllGather nodes. A stage is every node whose
   inputs are known (graph inputs, initializers, values computed so far) without passing through a collective
   not yet run; it becomes a sub-model (``onnx.helper``: those nodes, the initializers they use, inputs typed from
   the arrays fed to it, outputs the values later stages, the collectives or the graph outputs need), serialized
   by onnx and run by an onnxruntime session. Then the collectives whose input is now known run, in graph
   order, and the loop goes on until every graph output is known. Weights in external files stay there
   (onnxruntime reads them relative to the export folder).
2. Collectives on numpy arrays: AllReduce is ``Allreduce`` with ``airgraph.reduce_op`` (``sum`` and ``avg``:
   ``MPI.SUM``, the Div after an ``avg`` is a graph node; ``product``/``min``/``max``: ``PROD``/``MIN``/``MAX``;
   float16, which MPI lacks, is reduced in float32; bools as bytes with ``BOR``/``BAND``); AllGather is
   ``Allgather`` of the bytes, concatenated along ``axis`` in group-rank order. The communicator of a group is
   ``COMM_WORLD`` for all ranks, else ``Create_group`` of its ranks (``airgraph.group_ranks``), made once.
3. Before running, the ranks exchange the sequence of collectives each one's graph holds; each group's members
   must list the same collectives in the same order (as the eager run did), else every rank stops with exit
   code 2 rather than wait forever. A failure after that aborts the MPI job (``COMM_WORLD.Abort(2)``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from airgraph.export.check import RunError, check_inputs, check_outputs, load_export, read_npz, reference

__all__ = ["MS_DOMAIN", "CollectiveRunner", "StagedModel", "collective_signature", "worker_main"]

MS_DOMAIN = "com.microsoft"
_COLLECTIVES = ("AllReduce", "AllGather")


def _is_collective(node: onnx.NodeProto) -> bool:
    return node.domain == MS_DOMAIN and node.op_type in _COLLECTIVES


def _props(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(helper.get_attribute_value(attr))
    return default


def collective_signature(model: onnx.ModelProto) -> list[tuple[str, tuple[int, ...], str]]:
    """``[(op_type, group ranks, reduce op or axis)]`` of the model's collectives, in graph order."""
    out = []
    for node in model.graph.node:
        if _is_collective(node):
            props = _props(node)
            ranks = tuple(json.loads(props.get("airgraph.group_ranks", "[]")))
            detail = (
                props.get("airgraph.reduce_op", "sum") if node.op_type == "AllReduce" else str(_attr(node, "axis", 0))
            )
            out.append((node.op_type, ranks, detail))
    return out


def _subgraph_refs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If, Loop, Scan bodies) read, including names they define themselves."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(i for i in inner.input if i)
                names.update(_subgraph_refs(inner))
    return names


class CollectiveRunner:
    """The MPI side: runs a collective node on a numpy array, with one communicator per group."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._comms: dict[tuple[int, ...], Any] = {}

    def communicator(self, ranks: Sequence[int]) -> Any:
        key = tuple(ranks)
        if key not in self._comms:
            if not key or list(key) == list(range(self.comm.Get_size())):
                self._comms[key] = self.comm
            else:
                self._comms[key] = self.comm.Create_group(self.comm.Get_group().Incl(list(key)))
        return self._comms[key]

    def run(self, node: onnx.NodeProto, array: np.ndarray) -> np.ndarray:
        from mpi4py import MPI

        props = _props(node)
        comm = self.communicator(json.loads(props.get("airgraph.group_ranks", "[]")))
        array = np.ascontiguousarray(array)
        if node.op_type == "AllGather":
            size = comm.Get_size()
            send = array.reshape(-1).view(np.uint8)
            recv = np.empty(size * send.size, dtype=np.uint8)
            comm.Allgather([send, MPI.BYTE], [recv, MPI.BYTE])
            parts = recv.view(array.dtype).reshape((size, *array.shape))
            return np.concatenate(list(parts), axis=_attr(node, "axis", 0))
        reduce_op = props.get("airgraph.reduce_op", "sum")
        if array.dtype == np.bool_:  # as bytes: any for sum/max, all for product/min
            op = MPI.BOR if reduce_op in ("sum", "avg", "max") else MPI.BAND
            work = array.astype(np.uint8)
        else:
            op = {"sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[reduce_op]
            work = array.astype(np.float32) if array.dtype == np.float16 else array
        out = np.empty_like(work)
        comm.Allreduce(work, out, op=op)
        return out.astype(array.dtype, copy=False)


class StagedModel:
    """A model cut at its collectives into onnxruntime stages (see the module docstring)."""

    def __init__(self, model_path: Path, base_dir: Path, providers: Sequence[str] | None = None) -> None:
        self.model = onnx.load(str(model_path), load_external_data=False)
        self.base_dir = base_dir
        self.providers = list(providers or ["CPUExecutionProvider"])
        graph = self.model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.types = {v.name: v for v in [*graph.value_info, *graph.output]}
        self.stages_run = 0
        self.collectives_run = 0

    def run(self, feeds: dict[str, np.ndarray], output_names: Sequence[str], collectives: CollectiveRunner) -> dict:
        """Run the graph on ``feeds``; returns ``{name: array}`` for ``output_names``."""
        values = dict(feeds)
        pending = list(self.model.graph.node)
        while any(name not in values for name in output_names):
            stage, ready, remaining = self._next_stage(pending, set(values))
            if not stage and not ready:
                missing = [n for n in output_names if n not in values]
                raise RuntimeError(f"outputs {missing} cannot be computed from the inputs")
            if stage:
                wanted = self._stage_outputs(stage, remaining, output_names, values)
                values.update(self._run_stage(stage, wanted, values))
            for node in ready:
                values[node.output[0]] = collectives.run(node, values[node.input[0]])
                self.collectives_run += 1
            pending = [n for n in remaining if not any(n is r for r in ready)]
        return {name: values[name] for name in output_names}

    def _next_stage(
        self, pending: list[onnx.NodeProto], known: set[str]
    ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto], list[onnx.NodeProto]]:
        avail = known | set(self.initializers) | {""}
        stage, ready, remaining = [], [], []
        for node in pending:
            inputs = [*node.input, *(_subgraph_refs(node) & self._outer_names())]
            if _is_collective(node):
                if node.input[0] in avail:
                    ready.append(node)
                remaining.append(node)
            elif all(name in avail for name in inputs):
                stage.append(node)
                avail.update(node.output)
            else:
                remaining.append(node)
        return stage, ready, remaining

    def _outer_names(self) -> set[str]:
        if not hasattr(self, "_outer"):
            graph = self.model.graph
            names = {i.name for i in graph.input} | set(self.initializers)
            self._outer = names | {o for n in graph.node for o in n.output}
        return self._outer

    def _stage_outputs(
        self,
        stage: list[onnx.NodeProto],
        remaining: list[onnx.NodeProto],
        output_names: Sequence[str],
        values: dict[str, np.ndarray],
    ) -> list[str]:
        produced = {o for node in stage for o in node.output if o}
        needed = {i for node in remaining for i in [*node.input, *_subgraph_refs(node)]} | set(output_names)
        return [o for node in stage for o in node.output if o in produced and o in needed and o not in values]

    def _run_stage(
        self, stage: list[onnx.NodeProto], wanted: list[str], values: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        if not wanted:
            return {}
        used = {i for node in stage for i in [*node.input, *_subgraph_refs(node)]}
        produced = {o for node in stage for o in node.output}
        feed_names = [n for n in values if n in used and n not in produced]
        inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
            for n in feed_names
        ]
        outputs = [self.types[n] if n in self.types else helper.make_empty_tensor_value_info(n) for n in wanted]
        graph = helper.make_graph(
            stage,
            f"{self.model.graph.name}_stage{self.stages_run}",
            inputs,
            outputs,
            initializer=[self.initializers[n] for n in sorted(used & set(self.initializers))],
        )
        sub = helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        sub.functions.extend(self.model.functions)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.base_dir))
        session = ort.InferenceSession(sub.SerializeToString(), sess_options=options, providers=self.providers)
        self.stages_run += 1
        results = session.run(wanted, {n: values[n] for n in feed_names})
        return dict(zip(wanted, results, strict=True))


def _rank_path(template: str | None, rank: int) -> str | None:
    """``--inputs``/``--expected`` per rank: ``{rank}`` in the path is replaced; else one file for all ranks."""
    return None if template is None else template.replace("{rank}", str(rank))


def _output_path(path: str, rank: int) -> str:
    """``out.npz`` -> ``out.rank<r>.npz`` (or ``{rank}`` replaced when the path holds it)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    target = Path(path)
    return str(target.with_name(f"{target.stem}.rank{rank}{target.suffix or '.npz'}"))


def worker_main(args: Any, prog: str) -> int:
    """One rank under mpiexec (``--mpi-worker``): the runner's options, outputs and ``--check`` per rank.

    Exit code: the highest of all ranks' (0 ok, 1 a check failed, 2 an unusable export or inputs).
    """
    from mpi4py import MPI

    from airgraph.export.check import save_npz

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()

    def say(text: str) -> None:
        sys.stdout.write(f"[rank {rank}] {text}\n")
        sys.stdout.flush()

    prepared: tuple[Any, ...] | None = None
    error = None
    try:
        info = load_export(args.export_dir, rank=rank)
        expected_world = info.metadata["distributed"]["world_size"]
        if expected_world != world:
            raise RunError(f"the export has {expected_world} ranks, mpiexec started {world}")
        inputs = _rank_path(args.inputs, rank)
        feeds = read_npz(inputs) if inputs else reference(info, "inputs")
        for warning in check_inputs(info, feeds):
            say(f"warning: {warning}")
        staged = StagedModel(info.model_path, info.root, args.provider)
        prepared = (info, feeds, staged)
    except (RunError, OSError, ValueError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        error = str(exc)
    signature = collective_signature(prepared[2].model) if prepared else None
    everyone = comm.allgather((error, signature))
    errors = [(r, e) for r, (e, _) in enumerate(everyone) if e is not None]
    if errors:
        if rank == 0:
            for r, e in errors:
                print(f"{prog}: error: rank {r}: {e}", flush=True)
        return 2
    mismatch = _signature_mismatch([sig for _, sig in everyone])
    if mismatch:
        if rank == 0:
            print(f"{prog}: error: {mismatch}", flush=True)
        return 2
    assert prepared is not None
    info, feeds, staged = prepared
    names = [o["name"] for o in info.metadata["outputs"]]
    try:
        outputs = staged.run(feeds, names, CollectiveRunner(comm))
    except Exception as exc:  # onnxruntime or MPI failed on this rank: the others may wait in a collective
        print(f"{prog}: error: rank {rank}: running the model failed: {exc}", flush=True)
        comm.Abort(2)
        return 2
    say(
        f"model: {info.model_path} ({staged.stages_run} onnxruntime stage(s), {staged.collectives_run} "
        f"collective(s) over MPI, world size {world})"
    )
    for name, array in outputs.items():
        say(f"  {name}  {array.dtype.name}[{', '.join(str(d) for d in array.shape)}]")
    if args.output:
        path = _output_path(args.output, rank)
        save_npz(outputs, path)
        say(f"wrote {path}")
    code = 0
    if args.check:
        code = check_outputs(info, outputs, _rank_path(args.expected, rank), rtol=args.rtol, atol=args.atol, say=say)
    return max(comm.allgather(code))


def _signature_mismatch(signatures: list[Any]) -> str | None:
    """Why the ranks' collectives would not match up (each group's members must agree), or None."""
    per_group: dict[tuple[int, ...], dict[int, list]] = {}
    for rank, sig in enumerate(signatures):
        for op_type, ranks, detail in sig:
            per_group.setdefault(tuple(ranks), {}).setdefault(rank, []).append((op_type, detail))
    for ranks, seqs in per_group.items():
        members = {r: seqs.get(r, []) for r in ranks}
        if len({json.dumps(v) for v in members.values()}) > 1:
            return f"the ranks of group {list(ranks)} hold different collectives: {members}"
    return None
