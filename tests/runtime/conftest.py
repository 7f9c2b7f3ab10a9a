"""Fixtures of the runtime tests (the GraphCapture objects a test's compilations made: tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def data_dependent_ops():
    """Dynamo keeps .item() and data-dependent shapes in the graph (instead of breaking it there)."""
    config = torch._dynamo.config
    saved = config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops
    config.capture_scalar_outputs = config.capture_dynamic_output_shape_ops = True
    yield
    config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops = saved


@pytest.fixture
def checked_simulators(monkeypatch):
    """Every SimulatedCuda the test makes, checked when it ends: a replay read no tensor at an address other than the
    one its graph was recorded with, no race, no early free (an output equal to eager's does not show those: the
    simulator computes on the tensors it is given and only records the problem)."""
    from airgraph.runtime.simulated import SimulatedCuda

    made: list[SimulatedCuda] = []
    init = SimulatedCuda.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(SimulatedCuda, "__init__", tracked)
    yield made
    for sim in made:
        sim.check()
