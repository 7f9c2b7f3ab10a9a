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
    write_rows,
)
from airgraph.models.mixer import MixerBlock, MlpMixer
from airgraph.models.serving import ServingDecode, build_serving_decode, mark_batch_dynamic, serving_decode_inputs

__all__ = [
    "Attention",
    "FeedForward",
    "KVCache",
    "LlamaConfig",
    "MixerBlock",
    "MlpMixer",
    "RMSNorm",
    "ServingDecode",
    "TinyLlama",
    "TransformerBlock",
    "TwoBranch",
    "build_serving_decode",
    "build_tiny_llama",
    "decode_inputs",
    "mark_batch_dynamic",
    "prefill_inputs",
    "serving_decode_inputs",
    "two_branch_inputs",
    "write_rows",
]
