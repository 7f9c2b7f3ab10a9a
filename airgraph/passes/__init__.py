"""Graph passes over the ATen FX graph; see base.py for the contract and pipeline.py for the order."""

from airgraph.passes.base import CompileContext, PassResult
from airgraph.passes.pipeline import PIPELINE, run_pipeline

__all__ = ["PIPELINE", "CompileContext", "PassResult", "run_pipeline"]
