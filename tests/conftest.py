"""Shared test set-up: the `cuda` marker is skipped here, centrally, when no GPU is present; the tuning bank is a
fresh folder for the session (a user's bank must not change what the tests compile)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches would otherwise carry compiled code across tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cuda_device() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(autouse=True, scope="session")
def _session_tuning_bank(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRGRAPH_TUNE_BANK", str(tmp_path_factory.mktemp("tuning-bank")))
        for name in ("AIRGRAPH_TUNE_MODE", "AOE_MODE", "TUNE_BANK_PATH", "REPEAT_TUNE", "ASCEND_WORK_PATH"):
            patch.delenv(name, raising=False)
        yield
