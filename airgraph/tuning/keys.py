"""The bank keys of tuning units: what is tuned (an operator or a segment), at which shapes, where, with what.

A unit's *base* is the digest of its kind, its canonical graph (lowering/keys.py ``canonical_text``: the ops with
their arguments, independent of node names) and its inputs' dtypes, sizes and strides. Its *key* adds the
environment (tuning/env.py: device, torch and airgraph versions) and the candidate set's version, so a key found in
the bank was measured here, with these candidates. Both processes of a tune-then-run pair compute keys from the
traced values (``node.meta["val"]``), so they agree whatever layout a value really had when measured.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from airgraph.lowering.keys import canonical_text, shape_key

__all__ = ["unit_base", "unit_key"]


def unit_base(kind: str, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str | None:
    """The environment-free digest of a unit, or None when its shapes are symbolic (dynamic shapes: not tuned)."""
    shapes = shape_key(example_inputs)
    if shapes is None:
        return None
    text = f"{kind}\n{canonical_text(gm)}\n{shapes!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def unit_key(base: str, env_digest: str, candidates: int) -> str:
    payload = json.dumps([base, env_digest, candidates])
    return hashlib.sha256(payload.encode()).hexdigest()[:20]
