"""A kernel library built once per test session by the real flow (compile, record, build, package, install)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from airgraph.backend import AirgraphBackend
from airgraph.kernels.package import read_manifest
from tests.helpers import assert_close, make_config
from tests.kernels.models import Step, inputs

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (2, 3)  # the shape keys the session library holds


def static_config(build_dir: Path, config: dict[str, Any] | None = None, **static_kernels: Any):
    """Static kernels on, recording into ``build_dir``; ``static_kernels``: more of that group's options,
    ``config``: other options by dotted name."""
    options = {"static_kernels.enabled": True, "static_kernels.build_dir": str(build_dir)}
    options.update({f"static_kernels.{k}": v for k, v in static_kernels.items()})
    return make_config(**options, **(config or {}))


def run_step(backend: AirgraphBackend, batches: tuple[int, ...], *, dynamic: bool = True) -> Step:
    """Compile a fresh Step with ``backend``, run it at each batch size, check outputs and cache against eager."""
    model, reference = Step(), Step()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=True)
    with torch.no_grad():
        for batch in batches:
            tokens, pos = inputs(batch)
            assert_close(compiled(tokens, pos), reference(tokens, pos))
            assert_close(model.cache, reference.cache)
    return model


def run_python(
    script: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -c script args`` in a fresh process that imports this checkout's airgraph (``env``: more variables)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


@dataclass
class Built:
    build_dir: Path
    library: Path
    package: Path
    outputs: Path
    pid: int
    backend: AirgraphBackend
    manifest: dict

    def kernel(self, label: str) -> dict:
        return next(k for k in self.manifest["kernels"] if k["label"] == label)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Step run at batch 2 and 3 with static kernels on: two kernels built, packaged and installed (slow)."""
    build_dir = tmp_path_factory.mktemp("built")
    torch._dynamo.reset()
    backend = AirgraphBackend(static_config(build_dir))
    run_step(backend, BATCHES)
    torch._dynamo.reset()
    (outputs,) = (build_dir / "static_kernel_outputs").glob("*_outputs")
    (package,) = outputs.glob("static_kernel_*.zip")
    return Built(
        build_dir=build_dir,
        library=build_dir / "static_kernel_library",
        package=package,
        outputs=outputs,
        pid=os.getpid(),
        backend=backend,
        manifest=read_manifest(package),
    )
