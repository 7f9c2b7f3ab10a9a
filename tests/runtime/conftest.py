"""Fixtures of the runtime tests: where a test runs (``target``: a GPU, or the CUDA simulator), Dynamo's flags for
data-dependent ops. (The GraphCapture objects a test's compilations made: tests/conftest.py.)"""

from __future__ import annotations

import pytest
import torch

from airgraph.runtime.simulated import SimulatedCuda
from tests.helpers import Target


@pytest.fixture
def data_dependent_ops():
    """Dynamo keeps .item() and data-dependent shapes in the graph (instead of breaking it there)."""
    config = torch._dynamo.config
    saved = config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops
    config.capture_scalar_outputs = config.capture_dynamic_output_shape_ops = True
    yield
    config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops = saved


@pytest.fixture(params=["simulated", pytest.param("cuda", marks=pytest.mark.cuda)])
def target(request):
    if request.param == "cuda":
        yield Target("cuda", None)
        return
    target = Target("cpu", SimulatedCuda())
    yield target
    target.check()  # no unordered access, early free or unjoined stream in any of the test's calls
