"""Several processes on one node sharing a build folder (TorchAir's multi-card case).

TorchAir requires ``LOCAL_WORLD_SIZE`` whenever several processes (cards) of a node use static kernels, and the
same value in each: installing packages updates files they all read. airgraph's library is safe to share without
it (locks, atomic renames), but the rule stays: a process that ``LOCAL_RANK`` or ``WORLD_SIZE`` (or
``LOCAL_WORLD_SIZE`` itself) says is one of several must have ``LOCAL_WORLD_SIZE``, and every live process
registered in the same build folder must have the same value. The registry is
``<build_dir>/static_kernel_outputs/node.json`` (pid, host, LOCAL_WORLD_SIZE per process; dead processes are
dropped when the next one registers).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from airgraph.store import locked, process_alive, read_json, write_json_atomic

__all__ = ["StaticKernelsError", "register_process"]

FORMAT = "airgraph-static-kernel-node"
VERSION = 1


class StaticKernelsError(RuntimeError):
    """Static kernels cannot be used as configured (e.g. several processes on a node without LOCAL_WORLD_SIZE)."""


def register_process(
    outputs: Path, *, local_world_size: int | None, local_rank: int | None, world_size: int | None
) -> None:
    """Check the node's rule (module docstring) and register this process in ``outputs``/node.json; raises
    :class:`StaticKernelsError` naming ``LOCAL_WORLD_SIZE`` when it is broken."""
    said = {"LOCAL_RANK": local_rank, "WORLD_SIZE": world_size}
    several = local_rank is not None or (world_size or 1) > 1 or (local_world_size or 1) > 1
    if several and local_world_size is None:
        given = ", ".join(f"{k}={v}" for k, v in said.items() if v is not None)
        raise StaticKernelsError(
            f"airgraph static kernels: LOCAL_WORLD_SIZE is not set, but {given} say several processes run on this "
            f"node sharing {outputs.parent}; set LOCAL_WORLD_SIZE to the number of processes on this node (torchrun "
            "sets it), the same in each of them"
        )
    path = outputs / "node.json"
    with locked(path):
        try:
            processes: dict[str, Any] = read_json(path, format=FORMAT, version=VERSION)["processes"]
        except FileNotFoundError:
            processes = {}
        live = {k: p for k, p in processes.items() if process_alive(int(p["pid"]), p["host"])}
        for p in live.values():
            if p["pid"] != os.getpid() and p["local_world_size"] != local_world_size:
                raise StaticKernelsError(
                    f"airgraph static kernels: LOCAL_WORLD_SIZE differs between processes sharing {outputs.parent}: "
                    f"process {p['pid']} has {_show(p['local_world_size'])}, this one {_show(local_world_size)}; "
                    "give every process on the node the same LOCAL_WORLD_SIZE"
                )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "local_world_size": local_world_size}
        live[f"{me['host']}:{me['pid']}"] = {**me, "time": time.time()}
        write_json_atomic(path, {"processes": live}, format=FORMAT, version=VERSION)


def _show(value: int | None) -> str:
    return "it unset" if value is None else f"LOCAL_WORLD_SIZE={value}"
