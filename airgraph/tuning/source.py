"""The tuning step of the seam (lowering/select.py): the bank's answer for a segment, measuring nothing.

``BankSource.lookup(segment, request)`` computes the segment's keys and reads the bank file of this environment
(tuning/bank.py; re-read only when another process appended to it):

- a subgraph entry for the segment -> its kernel backend and options (``chosen_by "tuning"``);
- else operator entries for some of its nodes -> the configured kernel backend with those nodes' choices
  (``options["op_choices"]``, applied when the segment is lowered: tuning/lowering.py), each only where tuning would
  offer it (prepared weights: inference graphs only, a training step would prepare them again every step);
- else None: the next step (the config) decides.

``source`` names the bank entries used (``{"bank key": ...}``), for reports and ``airgraph inspect``. A choice
that freezes weights is taken only where the weights can be frozen (an inference graph, while it compiles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airgraph.lowering.select import Impl
from airgraph.tuning.bank import TUNED, Bank, BankFile
from airgraph.tuning.candidates import op_candidates, version
from airgraph.tuning.env import current
from airgraph.tuning.keys import unit_base, unit_key
from airgraph.tuning.operators import find_units, op_graph
from airgraph.tuning.params import freezable_positions, segment_frozen

if TYPE_CHECKING:
    import torch

    from airgraph.config import CompilerConfig
    from airgraph.graph.program import Segment
    from airgraph.lowering.select import GraphRequest

__all__ = ["BankSource", "impl_for", "op_key", "segment_key"]


def bank_file(bank: Bank, device: torch.device) -> tuple[BankFile, str]:
    """This environment's file of ``bank`` and the environment's digest (computed once: tuning/env.py)."""
    env, digest = current(device)
    return bank.file_for(env, digest), digest


def segment_key(segment: Segment, digest: str, device_type: str) -> tuple[str, str] | None:
    """(base, key) of a segment as a subgraph unit, from its traced input values; None with symbolic shapes."""
    base = unit_base("subgraph", segment.gm, segment.example_inputs())
    return None if base is None else (base, unit_key(base, digest, version("subgraph", device_type)))


def op_key(
    op_gm: torch.fx.GraphModule, example_inputs: list[Any], digest: str, device_type: str
) -> tuple[str, str] | None:
    base = unit_base("op", op_gm, example_inputs)
    return None if base is None else (base, unit_key(base, digest, version("op", device_type)))


def impl_for(choice: dict[str, Any], key: str, frozen: list[int]) -> Impl | None:
    """The Impl a subgraph choice stands for; None when it freezes weights and there are none to freeze
    (``frozen``: the segment's inputs that are frozen-able weights)."""
    options = dict(choice["options"])
    backend = options.pop("backend")
    if options.pop("freeze", False):
        if not frozen:
            return None
        options["frozen"] = frozen
    return Impl(backend, "tuning", options, {"bank key": key})


class BankSource:
    """The seam's ImplSource for the tuning bank of ``config.tuning`` (see the module docstring)."""

    def __init__(self, config: CompilerConfig) -> None:
        self.bank = Bank(config.tuning.resolved_bank_dir())

    def lookup(self, segment: Segment, request: GraphRequest) -> Impl | None:
        if segment.gm is None or not request.config.tuning.use_bank or not self.bank.folder.is_dir():
            return None
        file, digest = bank_file(self.bank, request.device)
        if not file.entries():  # a missing file has none
            return None
        keys = segment_key(segment, digest, request.device.type)
        entry = file.lookup(keys[1]) if keys is not None else None
        if entry is not None and entry.status == TUNED:
            frozen = segment_frozen(segment, freezable_positions(request.kind))
            impl = impl_for(entry.choice, entry.key, frozen)
            if impl is not None:
                return impl
        return self._op_choices(segment, request, file, digest)

    def _op_choices(self, segment: Segment, request: GraphRequest, file: BankFile, digest: str) -> Impl | None:
        choices: dict[str, Any] = {}
        used: list[str] = []
        inference = request.kind == "inference"
        for unit in find_units(segment.gm):
            keys = op_key(op_graph(unit), [n.meta.get("val") for n in unit.inputs], digest, request.device.type)
            entry = file.lookup(keys[1]) if keys is not None else None
            if entry is None or entry.status != TUNED:
                continue
            if entry.choice["name"] in {c["name"] for c in op_candidates(unit, request.device, inference)}:
                choices[unit.node.name] = entry.choice
                used.append(entry.key)
        if not choices:
            return None
        return Impl(request.config.kernel_backend, "tuning", {"op_choices": choices}, {"bank key": ", ".join(used)})
