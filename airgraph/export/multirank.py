"""The multi-rank part of ``dynamo_export``: the rank it runs as, export.json's ``distributed`` field, and the
exchange after which rank 0 writes TorchAir's ATC config files (``atc_config.py``).

The exchange goes through the default process group's store (``set`` by every rank, ``get`` by rank 0), not
through a collective. A gloo collective hands its tensors to gloo's worker thread, which drops its
reference after waking the caller; when that drop is the last one it needs the GIL. The exchange is the
export's last step and the seed's script exits right after it, so on a busy machine the drop came after the
interpreter had begun to finalize, and the process aborted (``terminate called without an active
exception`` from ``~AsyncAllgatherWork`` in ``pt_gloo_runloop``; pytorch/pytorch#190489, see
``leftovers.py``). Store requests are answered on the calling thread: nothing of the export is left in a
gloo thread when ``dynamo_export`` returns.

Every rank calls ``dynamo_export`` the same number of times with the same config (it must, for the model's
collectives), so the n-th exchange of each process uses the keys ``airgraph/export/<n>/<rank>``; rank 0
deletes them once read. Every rank sends its entry also when its export failed, so rank 0 never waits for a rank that
will not come (a rank that dies waits out the store's timeout, as a collective would).
"""

from __future__ import annotations

import itertools
import json
import socket
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

from airgraph.export.layout import ExportLayout

__all__ = ["distributed_metadata", "exchange_at_rank0", "rank_and_world", "write_configs_from_all_ranks"]

_EXCHANGES = itertools.count()


def rank_and_world() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialized, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def distributed_metadata(onnx_model: Any) -> dict[str, Any]:
    """export.json's ``distributed``: world size, backend, the groups and the collectives of the graph."""
    import torch.distributed as dist

    from airgraph.export.collectives import collective_nodes

    collectives = collective_nodes(onnx_model)
    groups = {c["group_name"]: c["group_ranks"] for c in collectives}
    return {
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "groups": dict(sorted(groups.items())),
        "collectives": collectives,
    }


def exchange_at_rank0(entry: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's ``entry`` (JSON values), in rank order, on rank 0; None on the other ranks."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store  # same in torch 2.11 to 2.13

    store = _get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    prefix = f"airgraph/export/{next(_EXCHANGES)}"
    store.set(f"{prefix}/{rank}", json.dumps(entry))
    if rank != 0:
        return None
    entries = [json.loads(store.get(f"{prefix}/{r}")) for r in range(world)]
    for r in range(world):
        store.delete_key(f"{prefix}/{r}")
    return entries


def write_configs_from_all_ranks(
    layout: ExportLayout, written: dict[str, Any] | None, error: BaseException | None, args: tuple, kwargs: dict
) -> list[str]:
    """Every rank sends what it wrote (``written``: its export.json, None if it failed) to rank 0, which
    writes the ATC config files when all ranks succeeded. Returns the files written (rank 0)."""
    from airgraph.export.atc_config import write_atc_configs

    devices = {t.device.type for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    distributed = (written or {}).get("distributed") or {}
    mine = {
        "rank": layout.rank,
        "ok": error is None,
        "error": None if error is None else str(error),
        "model_file": layout.model,
        "host": socket.gethostname(),
        "device": sorted(devices)[0] if devices else "cpu",
        "groups": distributed.get("groups", {}),
    }
    everyone = exchange_at_rank0(mine)
    if everyone is None or error is not None:
        return []
    failed = [info["rank"] for info in everyone if not info["ok"]]
    if failed:
        warnings.warn(f"dynamo_export: ranks {failed} failed; no ATC config files written", stacklevel=4)
        return []
    return write_atc_configs(layout.root, everyone)
