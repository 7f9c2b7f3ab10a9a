"""Multi-rank export: the seed's multi-card example (p1, p2, all_reduce) and an all_gather model, exported by two
gloo processes, then run by ``airgraph run`` over MPI (mpiexec from the mpich wheel) in processes without torch."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from airgraph.export.atc_config import model_relation_config, numa_config
from airgraph.export.runner import RunError, find_mpiexec
from tests.export.export_models import run_without_torch
from tests.helpers import free_ports

pytestmark = pytest.mark.slow  # multi-process exports / Inductor compiles of the tiny LLaMA

WORLD = 2
SEED_FILES = {
    "mp_rank0.onnx",
    "mp_rank1.onnx",
    "model_relation_config.json",
    "numa_config.json",
    "rank_0",
    "rank_1",
}
RANK_FILES = {"dynamo.pbtxt", "export.json", "reference_inputs.npz", "reference_outputs.npz"}


def _export(kind: str, out: Path, port: int, *extra: str) -> list[subprocess.Popen]:
    cmd = [sys.executable, "-m", "tests.export.multirank_worker", kind]
    return [
        subprocess.Popen([*cmd, str(r), str(WORLD), str(port), str(out), *extra], stderr=subprocess.PIPE, text=True)
        for r in range(WORLD)
    ]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """Both exports at once (four processes): ``seed`` with auto_atc_config_generated, ``gather`` without and
    with external weights (threshold 0)."""
    try:
        find_mpiexec()
    except RunError as exc:
        pytest.skip(str(exc))
    dirs = {"seed": tmp_path_factory.mktemp("seed"), "gather": tmp_path_factory.mktemp("gather")}
    seed_port, gather_port = free_ports(2)  # both rendezvous run at once: distinct ports
    procs = _export("seed", dirs["seed"], seed_port, "--atc") + _export(
        "gather", dirs["gather"], gather_port, "--external"
    )
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    return dirs


def _run(*args: str) -> subprocess.CompletedProcess:
    done = run_without_torch("run", *args, module="airgraph")
    return done


def test_layout_as_torchair(exports):
    root = exports["seed"] / "mp"
    assert {p.name for p in root.iterdir()} == SEED_FILES
    for rank in range(WORLD):
        assert {p.name for p in (root / f"rank_{rank}").iterdir()} == RANK_FILES
        meta = json.loads((root / f"rank_{rank}" / "export.json").read_text())
        assert meta["rank"] == rank and meta["model_file"] == f"mp_rank{rank}.onnx"
        assert meta["distributed"]["world_size"] == WORLD and meta["distributed"]["groups"] == {"0": [0, 1]}
    assert not [p for p in exports["seed"].iterdir() if "staging" in p.name]
    gather = exports["gather"] / "mp"
    for rank in range(WORLD):  # external weights go to the rank's folder
        meta = json.loads((gather / f"rank_{rank}" / "export.json").read_text())
        assert meta["weights"]["external"] and meta["weights"]["files"] == {"w": f"rank_{rank}/w"}
        assert (gather / f"rank_{rank}" / "w").is_file()


def test_collectives_are_com_microsoft_nodes_with_their_group(exports):
    seed = onnx.load(str(exports["seed"] / "mp" / "mp_rank1.onnx"))
    (reduce,) = [n for n in seed.graph.node if n.domain == "com.microsoft"]
    props = {p.key: p.value for p in reduce.metadata_props}
    assert reduce.op_type == "AllReduce" and not reduce.attribute  # onnxruntime's AllReduce has no attributes
    assert json.loads(props["airgraph.group_ranks"]) == [0, 1] and props["airgraph.group_name"] == "0"
    assert props["airgraph.reduce_op"] == "sum"
    assert {o.domain: o.version for o in seed.opset_import}["com.microsoft"] == 1

    gather = onnx.load(str(exports["gather"] / "mp" / "mp_rank0.onnx"))
    ms = [n for n in gather.graph.node if n.domain == "com.microsoft"]
    assert [n.op_type for n in ms] == ["AllGather", "AllGather", "AllReduce"]
    for node in ms[:2]:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {"axis": 0, "group_size": 2}
    avg = ms[2]
    assert {p.key: p.value for p in avg.metadata_props}["airgraph.reduce_op"] == "avg"
    consumers = [n.op_type for n in gather.graph.node if avg.output[0] in n.input]
    assert consumers == ["Div"]  # avg = sum, then divide by the group size


def test_seed_runs_over_mpi_without_torch(exports):
    done = _run(str(exports["seed"] / "mp"), "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(WORLD):
        assert f"[rank {rank}] check: ok: 1 output(s)" in done.stdout
        assert f"[rank {rank}] model: " in done.stdout
    assert "1 collective(s) over MPI, world size 2" in done.stdout


def test_gather_matches_eager_on_fresh_inputs(exports, tmp_path):
    root = exports["gather"]
    for rank in range(WORLD):
        with np.load(root / f"eager_rank{rank}.npz") as eager:
            np.savez(tmp_path / f"in{rank}.npz", x=eager["in_x"])
            np.savez(tmp_path / f"exp{rank}.npz", output_0=eager["out_output_0"], output_1=eager["out_output_1"])
    args = ["--inputs", str(tmp_path / "in{rank}.npz"), "--expected", str(tmp_path / "exp{rank}.npz")]
    done = _run(str(root / "mp"), *args, "--check", "--output", str(tmp_path / "got.npz"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 collective(s) over MPI" in done.stdout and "2 onnxruntime stage(s)" in done.stdout
    for rank in range(WORLD):
        with np.load(tmp_path / f"got.rank{rank}.npz") as got, np.load(root / f"eager_rank{rank}.npz") as eager:
            for name in ("output_0", "output_1"):
                torch.testing.assert_close(torch.from_numpy(got[name]), torch.from_numpy(eager[f"out_{name}"]))


def test_check_fails_on_one_rank(exports, tmp_path):
    root = exports["seed"] / "mp"
    with np.load(root / "rank_1" / "reference_outputs.npz") as ref:
        np.savez(tmp_path / "exp1.npz", output=ref["output"] + 1)
    with np.load(root / "rank_0" / "reference_outputs.npz") as ref:
        np.savez(tmp_path / "exp0.npz", output=ref["output"])
    done = _run(str(root), "--check", "--expected", str(tmp_path / "exp{rank}.npz"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[rank 0] check: ok" in done.stdout and "[rank 1] check: FAILED" in done.stdout


def test_incomplete_export_refused(exports, tmp_path):
    copy = tmp_path / "mp"
    shutil.copytree(exports["seed"] / "mp", copy)
    (copy / "rank_1" / "export.json").unlink()
    done = _run(str(copy), "--check")
    assert done.returncode == 2 and "incomplete multi-rank export" in done.stderr


def test_atc_configs_name_every_rank(exports):
    root = exports["seed"] / "mp"
    relation = json.loads((root / "model_relation_config.json").read_text())
    assert set(relation) == {"deploy_config", "model_name_to_instance_id", "comm_group", "rank_table"}
    models = [f"mp_rank{r}.onnx" for r in range(WORLD)]
    assert [d["submodel_name"] for d in relation["deploy_config"]] == models
    assert [d["deploy_device_id_list"] for d in relation["deploy_config"]] == ["0:0:0", "0:0:1"]
    assert relation["model_name_to_instance_id"] == [
        {"submodel_name": m, "model_instance_id": r} for r, m in enumerate(models)
    ]
    assert relation["rank_table"] == [{"rank_id": r, "model_instance_id": r} for r in range(WORLD)]
    assert relation["comm_group"] == [{"group_name": "0", "group_rank_list": "[0, 1]"}]
    numa = json.loads((root / "numa_config.json").read_text())
    assert set(numa) == {"cluster", "item_def", "node_def"}
    (node,) = numa["cluster"][0]["cluster_nodes"]
    assert node["item_list"] == [{"item_id": 0}, {"item_id": 1}] and node["hostname"] == socket.gethostname()
    assert numa["item_def"] == [{"item_type": "cpu"}]
    assert not list((exports["gather"] / "mp").glob("*config.json"))  # the option is off for this export


def test_atc_config_two_hosts():
    ranks = [
        {"rank": r, "model_file": f"m{r}.onnx", "host": "a" if r < 2 else "b", "device": "cpu", "groups": g}
        for r, g in enumerate([{"0": [0, 1, 2, 3], "1": [0, 2]}, {"0": [0, 1, 2, 3]}, {"1": [0, 2]}, {}])
    ]
    relation = model_relation_config(ranks)
    assert [d["deploy_device_id_list"] for d in relation["deploy_config"]] == ["0:0:0", "0:0:1", "1:0:2", "1:0:3"]
    assert [g["group_name"] for g in relation["comm_group"]] == ["0", "1"]
    nodes = numa_config(ranks)["cluster"][0]["cluster_nodes"]
    assert [[i["item_id"] for i in n["item_list"]] for n in nodes] == [[0, 1], [2, 3]]
