"""TorchAir's deployment config files of a multi-rank export (``auto_atc_config_generated``). No torch here.

With ``config.export.experimental.auto_atc_config_generated`` set, rank 0 of a multi-rank export writes
``model_relation_config.json`` and ``numa_config.json`` into export_path after every rank has committed its
files. They keep the keys and value formats TorchAir's ``dynamo_export`` writes for CANN's ATC
(``--model_relation_config`` / ``--cluster_config``), TorchAir's spellings included, filled with this export's
ranks, groups and models; fields a PyTorch process cannot know hold TorchAir's placeholders (the port).
Every field: docs/export.md and docs/design/export-internals.md.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airgraph.store import write_text_atomic

__all__ = [
    "MODEL_RELATION_CONFIG_FILE",
    "NUMA_CONFIG_FILE",
    "model_relation_config",
    "numa_config",
    "write_atc_configs",
]

MODEL_RELATION_CONFIG_FILE = "model_relation_config.json"
NUMA_CONFIG_FILE = "numa_config.json"
NODE_TYPE = "airgraph-host"
PLACEHOLDER_PORT = 29500


def _hosts(ranks: Sequence[dict[str, Any]]) -> list[str]:
    hosts: list[str] = []
    for info in sorted(ranks, key=lambda r: r["rank"]):
        if info["host"] not in hosts:
            hosts.append(info["host"])
    return hosts


def model_relation_config(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The model_relation_config.json dict; ``ranks``: one ``{"rank", "model_file", "host", "groups"}`` each."""
    hosts = _hosts(ranks)
    config: dict[str, Any] = {"deploy_config": [], "model_name_to_instance_id": [], "comm_group": [], "rank_table": []}
    groups: dict[str, list[int]] = {}
    for info in sorted(ranks, key=lambda r: r["rank"]):
        rank, model = info["rank"], info["model_file"]
        node_id = hosts.index(info["host"])
        config["deploy_config"].append({"submodel_name": model, "deploy_device_id_list": f"{node_id}:0:{rank}"})
        config["model_name_to_instance_id"].append({"submodel_name": model, "model_instance_id": rank})
        config["rank_table"].append({"rank_id": rank, "model_instance_id": rank})
        for name, members in info["groups"].items():
            groups.setdefault(name, list(members))
    for name in sorted(groups, key=lambda n: (len(n), n)):
        config["comm_group"].append({"group_name": name, "group_rank_list": str(groups[name])})
    return config


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def numa_config(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The numa_config.json dict; ``ranks`` as for :func:`model_relation_config`, plus ``"device"`` each."""
    nodes = []
    for node_id, host in enumerate(_hosts(ranks)):
        items = [{"item_id": r["rank"]} for r in sorted(ranks, key=lambda r: r["rank"]) if r["host"] == host]
        nodes.append(
            {
                "node_id": node_id,
                "node_type": NODE_TYPE,
                "hostname": host,
                "ipaddr": _address(host),
                "port": PLACEHOLDER_PORT,
                "item_list": items,
            }
        )
    devices = sorted({r["device"] for r in ranks})
    return {
        "cluster": [{"cluster_nodes": nodes, "nodes_toplogy": {}}],
        "item_def": [{"item_type": d} for d in devices],
        "node_def": [{"node_type": NODE_TYPE, "item": [{"item_type": d} for d in devices]}],
    }


def write_atc_configs(root: Path, ranks: Sequence[dict[str, Any]]) -> list[str]:
    """Write both files into ``root`` atomically (temporary file, then rename); returns their names."""
    for name, data in (
        (MODEL_RELATION_CONFIG_FILE, model_relation_config(ranks)),
        (NUMA_CONFIG_FILE, numa_config(ranks)),
    ):
        write_text_atomic(root / name, json.dumps(data, indent=4) + "\n")
    return [MODEL_RELATION_CONFIG_FILE, NUMA_CONFIG_FILE]
