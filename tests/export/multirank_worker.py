"""One rank of a multi-rank export test.

    python -m tests.export.multirank_worker MODEL RANK WORLD PORT OUT [--atc] [--external]


Initializes gloo at 127.0.0.1:PORT, builds MODEL (``seed``: the seed's multi-card example; ``gather``: all_gather
and an averaging all_reduce), exports it with ``airgraph.compat.torchair.dynamo_export`` into OUT/mp (export_name
``mp_rank``), and saves the eager outputs of a second call on fresh inputs, with those inputs, into
OUT/eager_rank<r>.npz (for ``airgraph run --inputs``).
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch import nn

from airgraph.compat import torchair as tng


class AllReduceSingleGroup(nn.Module):
    """The seed's multi-card example (p1, p2, an in-place all_reduce)."""

    def __init__(self) -> None:
        super().__init__()
        self.p1 = nn.Parameter(torch.tensor([[1.1, 1.1], [1.1, 1.1]]))
        self.p2 = nn.Parameter(torch.tensor([[2.2, 2.2], [3.3, 3.3]]))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + y + self.p1 + self.p2
        torch.distributed.all_reduce(x)
        return x


class GatherModel(nn.Module):
    """all_gather three ways, an averaging all_reduce, and work after the collectives."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ self.w  # [2, 4]
        world = dist.get_world_size()
        gathered = fc.all_gather_tensor(h, 0, dist.group.WORLD)  # [2 * world, 4]
        out = torch.empty(2 * world, 3, dtype=x.dtype)
        dist.all_gather_into_tensor(out, torch.tanh(x))
        mean = fc.all_reduce(h * 2, "avg", dist.group.WORLD)
        return gathered.sum(0) + mean.sum(0), torch.cat([out, gathered[:, :3]], 1)


def main(argv: list[str]) -> None:
    kind, rank, world, port, out = argv[0], int(argv[1]), int(argv[2]), argv[3], Path(argv[4])
    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    config = tng.CompilerConfig()
    config.export.experimental.auto_atc_config_generated = "--atc" in argv
    if "--external" in argv:  # every weight in its own file under rank_<r>/
        config.export.external_weights_threshold = 0
    torch.manual_seed(rank)
    if kind == "seed":
        model: nn.Module = AllReduceSingleGroup()
        args = (torch.ones([2, 2], dtype=torch.int32) * (rank + 1), torch.ones([2, 2], dtype=torch.int32))
        fresh = (torch.randint(0, 5, (2, 2), dtype=torch.int32), torch.randint(0, 5, (2, 2), dtype=torch.int32))
        names = ("x", "y")
    else:
        model, args, fresh, names = GatherModel(), (torch.randn(2, 3),), (torch.randn(2, 3),), ("x",)
    tng.dynamo_export(*args, model=model, export_path=str(out / "mp"), export_name="mp_rank", config=config)
    with torch.no_grad():
        result = model(*fresh)
    results = result if isinstance(result, tuple) else (result,)
    arrays = {f"in_{n}": t.numpy() for n, t in zip(names, fresh, strict=True)}
    keys = ["output"] if len(results) == 1 else [f"output_{i}" for i in range(len(results))]
    arrays.update({f"out_{k}": t.numpy() for k, t in zip(keys, results, strict=True)})
    np.savez(out / f"eager_rank{rank}.npz", **arrays)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
