"""Fixtures of the runtime tests: the GraphCapture objects a test's compilations made."""

from __future__ import annotations

import pytest
import torch

import airgraph.runtime.capture as capture_module


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[capture_module.GraphCapture]:
    """Every GraphCapture made during the test, in order (their keys say what was recorded and replayed)."""
    made: list[capture_module.GraphCapture] = []
    original = capture_module.GraphCapture.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(capture_module.GraphCapture, "__init__", init)
    return made


@pytest.fixture
def data_dependent_ops():
    """Dynamo keeps .item() and data-dependent shapes in the graph (instead of breaking it there)."""
    config = torch._dynamo.config
    saved = config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops
    config.capture_scalar_outputs = config.capture_dynamic_output_shape_ops = True
    yield
    config.capture_scalar_outputs, config.capture_dynamic_output_shape_ops = saved
