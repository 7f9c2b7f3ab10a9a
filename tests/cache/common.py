"""What the compile cache's tests share: the test's cache folder, its entries, the small mixer compiled by a new
backend (a process's view of it: Dynamo's caches reset)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from airgraph.backend import AirgraphBackend
from airgraph.models.mixer import MlpMixer
from tests.helpers import assert_close, make_config

SIZES = {"tokens": 8, "channels": 16, "token_hidden": 16, "channel_hidden": 32}


def cache_dir() -> Path:
    """The test's compile cache (tests/conftest.py gives each test its own)."""
    return Path(os.environ["AIRGRAPH_CACHE_DIR"])


def entries() -> list[Path]:
    return sorted((cache_dir() / "entries").glob("*.entry"))


def compiled_mixer(seed: int = 0, blocks: int = 2, runtime=None, **options) -> tuple[MlpMixer, object, AirgraphBackend]:
    model = MlpMixer(blocks=blocks, seed=seed, **SIZES).eval()
    backend = AirgraphBackend(make_config(kernel_backend="aten", **options), runtime=runtime)
    return model, torch.compile(model, backend=backend), backend


def run_once(seed: int = 0, blocks: int = 2, batch: int = 2, **options) -> AirgraphBackend:
    """A new backend compiling and running the mixer once, its output checked against eager."""
    torch._dynamo.reset()
    model, compiled, backend = compiled_mixer(seed, blocks, **options)
    x = model.example_input(batch)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    return backend
