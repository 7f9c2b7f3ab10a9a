"""Reference models for demos, benchmarks and tests."""

from airgraph.models.branches import TwoBranch, two_branch_inputs
from airgraph.models.llama import (
    Attention,
    FeedForward,
    KVCache,
    LlamaConfig,
    RMSNorm,
    TinyLlama,
    TransformerBlock,
    build_tiny_llama,
    decode_inputs,
    prefill_inputs,
)

__all__ = [
    "Attention",
    "FeedForward",
    "KVCache",
    "LlamaConfig",
    "RMSNorm",
    "TinyLlama",
    "TransformerBlock",
    "TwoBranch",
    "build_tiny_llama",
    "decode_inputs",
    "prefill_inputs",
    "two_branch_inputs",
]
