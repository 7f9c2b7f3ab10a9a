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
