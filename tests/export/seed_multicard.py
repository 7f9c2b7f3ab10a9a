"""The seed's multi-card dynamo_export example (seed 004), as issue #14 ran it: ``torch.multiprocessing.spawn``
of two ranks, gloo, ``dynamo_export`` of a model with an ``all_reduce``, then ``destroy_process_group``.

``example`` is the seed's code with TorchAir's imports replaced by airgraph's (and the missing comma after
``export_name`` restored). ``run_rank`` is what ``test_export_exit.py`` spawns: the seed's ``example`` plus a
report written after it, ``report_rank<r>.json``: how many collectives the process group ran during
``dynamo_export`` and which threads are left once the process group is destroyed.
"""

from __future__ import annotations

import json
import os
import threading

import torch
import torch.distributed as dist

from airgraph.compat import torchair
from airgraph.compat.torchair import CompilerConfig

GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop", "pt_tcpstore_uv")  # torch's names for them


class AllReduceSingeGroup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p1 = torch.nn.Parameter(torch.tensor([[1.1, 1.1], [1.1, 1.1]]))
        self.p2 = torch.nn.Parameter(torch.tensor([[2.2, 2.2], [3.3, 3.3]]))

    def forward(self, x, y):
        x = x + y + self.p1 + self.p2
        torch.distributed.all_reduce(x)
        return x


def example(rank, world_size):
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    x = torch.ones([2, 2], dtype=torch.int32)
    y = torch.ones([2, 2], dtype=torch.int32)
    mod = AllReduceSingeGroup()
    config = CompilerConfig()
    config.export.experimental.auto_atc_config_generated = True
    config.export.experimental.enable_record_nn_module_stack = True
    torchair.dynamo_export(x, y, model=mod, dynamic=True, export_path="./mp", export_name="mp_rank", config=config)
    torch.distributed.destroy_process_group()


def _os_threads() -> list[str] | None:
    """Names of the process's threads (Linux), None where /proc does not list them."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(names)


def run_rank(rank: int, world_size: int) -> None:
    """The seed's ``example``, then ``report_rank<rank>.json`` in the working directory."""
    report: dict = {"rank": rank}
    export = torchair.dynamo_export

    def counting_export(*args, **kwargs):  # the collectives the process group runs during dynamo_export
        group = dist.group.WORLD
        before = group._get_sequence_number_for_group()
        try:
            return export(*args, **kwargs)
        finally:
            report["collectives_in_export"] = group._get_sequence_number_for_group() - before

    torchair.dynamo_export = counting_export
    try:
        example(rank, world_size)
    finally:
        torchair.dynamo_export = export
    report["os_threads"] = _os_threads()
    report["python_threads"] = sorted(t.name for t in threading.enumerate())
    with open(f"report_rank{rank}.json", "w") as f:
        json.dump(report, f)
