"""Shared test set-up: the `cuda` marker is skipped here, centrally, when no GPU is present, and each `cuda` test that
leaves the device unusable fails (so its neighbours in the worker do not); the tuning bank is a fresh folder for
the session (a user's bank must not change what the tests compile)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import cuda_unusable


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


@pytest.fixture(autouse=True)
def _cuda_left_usable(request: pytest.FixtureRequest):
    """After each `cuda` test: a random op and a small capture still work, or this test fails (in its teardown) naming
    why, and the generator is reset for the worker's next tests."""
    yield
    if request.node.get_closest_marker("cuda") is None or not torch.cuda.is_available():
        return
    reason = cuda_unusable()
    if reason is not None:
        pytest.fail(f"this test left CUDA unusable for the tests after it: {reason}", pytrace=False)


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
