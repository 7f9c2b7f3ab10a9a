"""A serving engine's decode step on the tiny LLaMA: the KV caches are inputs that follow the batch.

TinyLlama's own decode writes a cache of the largest batch, sliced to the call's rows; capture sizes refuse it
(a padded row would write into the cache row of another request). Here, as in a serving engine, the caller owns
the caches: one (k, v) pair per layer of shape [B, n_kv_heads, max_seq_len, head_dim], passed in with the call's
B rows, and each row's new key and value are written in place at that row's own position (``positions`` [B]:
per-row positions, a scatter along the sequence dimension, llama.py's ``write_rows``). A padded row then writes
only into a padded cache row, so capture sizes pad the batch: ``plan_padding`` accepts the step, and
``PaddedRun`` copies the real rows of the caches back. The weights, blocks and rotary tables are TinyLlama's.

    step = build_serving_decode("small")
    k, v = step.new_caches(8)
    tokens, positions = serving_decode_inputs(step.config, 8)
    mark_batch_dynamic(tokens, positions, k, v)
    logits = torch.compile(step, backend=..., fullgraph=True)(tokens, positions, k, v)   # [B, 1, vocab]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from airgraph.models.llama import LlamaConfig, TinyLlama, build_tiny_llama

__all__ = ["ServingDecode", "build_serving_decode", "mark_batch_dynamic", "serving_decode_inputs"]


class ServingDecode(nn.Module):
    """One decode step of a batch of requests, each at its own position, over caches the caller passes in."""

    def __init__(self, model: TinyLlama) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def new_caches(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Zeroed (k_caches, v_caches): one [batch, n_kv_heads, max_seq_len, head_dim] tensor per layer each."""
        if not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"ServingDecode.new_caches: batch={batch!r}: must be a positive integer")
        weight = self.model.output.weight
        cfg = self.config
        shape = (batch, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
        device, dtype = device or weight.device, dtype or weight.dtype
        k, v = ([torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)] for _ in range(2))
        return k, v

    def forward(self, tokens: Tensor, positions: Tensor, k_caches: list[Tensor], v_caches: list[Tensor]) -> Tensor:
        """tokens [B, 1] int64, positions [B] int64 (each in [0, max_seq_len)), and per layer the caches [B,
        n_kv_heads, max_seq_len, head_dim], written in place -> logits [B, 1, vocab_size]."""
        cfg, model = self.config, self.model
        bsz = tokens.shape[0]
        if tokens.dim() != 2 or tokens.shape[1] != 1 or positions.shape != (bsz,):
            raise ValueError(
                f"ServingDecode: tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)}: expected "
                "tokens [B, 1] and positions [B] (one new token per request, at its own position)"
            )
        if len(k_caches) != cfg.n_layers or len(v_caches) != cfg.n_layers:
            raise ValueError(
                f"ServingDecode: {len(k_caches)} k and {len(v_caches)} v caches for {cfg.n_layers} layers "
                "(make them with ServingDecode.new_caches(batch))"
            )
        shape = (bsz, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
        for cache in (*k_caches, *v_caches):
            if cache.shape != shape:
                raise ValueError(
                    f"ServingDecode: a cache of shape {tuple(cache.shape)}, expected {shape}: the caches hold the "
                    "call's rows only (pass cache[:B] of a larger one)"
                )
        rows = (bsz, 1, 1, -1)  # per-row tables broadcast over heads: [B, 1, 1, head_dim] and [B, 1, 1, max_seq_len]
        cos, sin = model.rope_cos[positions].view(rows), model.rope_sin[positions].view(rows)
        mask = model.causal_mask[positions].view(rows)  # a row sees its own position and the earlier ones
        x = model.tok_embeddings(tokens)
        for layer, k_cache, v_cache in zip(model.layers, k_caches, v_caches, strict=True):
            x = layer(x, positions, cos, sin, mask, (k_cache, v_cache))
        return model.output(model.norm(x))


def build_serving_decode(
    preset: str | LlamaConfig = "tiny",
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ServingDecode:
    """The serving decode step of a TinyLlama (``build_tiny_llama``'s weights for the preset and seed), in eval
    mode. Its own KV caches are made for one row and never used: the caches are the step's inputs."""
    return ServingDecode(build_tiny_llama(preset, seed=seed, max_batch_size=1, device=device, dtype=dtype)).eval()


def serving_decode_inputs(
    config: LlamaConfig, batch: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """Random tokens [batch, 1] and positions [batch] in [0, max_seq_len) (a local generator)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch, 1), generator=generator)
    positions = torch.randint(0, config.max_seq_len, (batch,), generator=generator)
    return tokens.to(device), positions.to(device)


def mark_batch_dynamic(tokens: Tensor, positions: Tensor, k_caches: list[Tensor], v_caches: list[Tensor]) -> None:
    """``torch._dynamo.mark_dynamic`` on dimension 0 (the batch) of every input of the step."""
    for tensor in (tokens, positions, *k_caches, *v_caches):
        torch._dynamo.mark_dynamic(tensor, 0)
