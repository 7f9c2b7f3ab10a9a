"""A LLaMA-style decoder in plain PyTorch (gpt-fast's layout), used for demos, benchmarks and compiler tests.

Design goals: readable top to bottom, deterministic (seeded, local generators only) and traceable with
``torch.compile(fullgraph=True)`` for both prefill and single-token decode. It uses a static KV cache, a
precomputed causal mask and rotary tables, so ``forward`` has no data-dependent Python control flow.

Presets: "tiny", "small", "micro" for tests and demos; "1b" (Llama-3.2-1B's shapes, tied embeddings) and "8b"
(Llama-3.1-8B's) for benchmarks/llm_roofline.py, built with random weights where they run
(``TinyLlama(config, device="cuda", dtype=torch.bfloat16)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_PRESETS: dict[str, dict[str, int | float | bool]] = {
    "tiny": {},
    "small": {"dim": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 1024, "max_seq_len": 256},
    "micro": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 64, "max_seq_len": 32},
    # Llama-3.2-1B's shapes (head_dim 64, rope theta 500000; its llama3 rope scaling is left out: random weights)
    "1b": {
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "tie_embeddings": True,
        "rope_base": 500000.0,
        "max_seq_len": 2048,
    },
    # Llama-3.1-8B's shapes (head_dim 128, untied embeddings)
    "8b": {
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_base": 500000.0,
        "max_seq_len": 2048,
    },
}


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 512
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads % n_kv_heads == 0
    intermediate_size: int | None = None  # default: ~8/3 * dim rounded up to a multiple of 32
    max_seq_len: int = 128
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # the output projection is the token embedding matrix (Llama-3.2-1B)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LlamaConfig.{name}={value!r}: must be a positive integer")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"LlamaConfig.n_heads={self.n_heads}: must be divisible by n_kv_heads={self.n_kv_heads} "
                "(grouped-query attention shares each kv head between n_heads // n_kv_heads query heads)"
            )
        if self.dim % self.n_heads != 0:
            raise ValueError(f"LlamaConfig.dim={self.dim}: must be divisible by n_heads={self.n_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"LlamaConfig.dim={self.dim}: head_dim=dim//n_heads={self.head_dim} must be even (RoPE)")
        if self.intermediate_size is None:
            hidden = (8 * self.dim + 2) // 3
            object.__setattr__(self, "intermediate_size", (hidden + 31) // 32 * 32)
        elif self.intermediate_size <= 0:
            raise ValueError(f"LlamaConfig.intermediate_size={self.intermediate_size}: must be positive or None")
        for name in ("rope_base", "norm_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LlamaConfig.{name}={getattr(self, name)}: must be > 0")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"LlamaConfig.tie_embeddings={self.tie_embeddings!r}: must be True or False")

    @classmethod
    def preset(cls, name: str, **overrides: int | float | bool) -> LlamaConfig:
        """Named configuration ("tiny", "small", "micro", "1b", "8b"), optionally with some fields overridden."""
        if name not in _PRESETS:
            raise ValueError(f"unknown LlamaConfig preset {name!r}; available presets: {', '.join(_PRESETS)}")
        return cls(**{**_PRESETS[name], **overrides})

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def _linear(in_features: int, out_features: int, **where: Any) -> nn.Linear:
    # skip_init allocates without running nn.Linear's default init, which would consume the global RNG.
    return torch.nn.utils.skip_init(nn.Linear, in_features, out_features, bias=False, **where)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding on x [B, H, S, head_dim] with cos/sin [S, head_dim] (rotate-half layout)."""
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, **where: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **where))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class KVCache(nn.Module):
    """Static KV cache: buffers k_cache/v_cache of shape [max_batch_size, n_kv_heads, max_seq_len, head_dim]."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k/v [B, n_kv_heads, S, head_dim] at positions input_pos [S]; return the caches for those B rows."""
        bsz = k.shape[0]
        k_out, v_out = self.k_cache[:bsz], self.v_cache[:bsz]
        k_out.index_copy_(2, input_pos, k.to(k_out.dtype))
        v_out.index_copy_(2, input_pos, v.to(v_out.dtype))
        return k_out, v_out


def write_rows(cache: Tensor, positions: Tensor, new: Tensor) -> Tensor:
    """Write ``new`` [B, n_kv_heads, 1, head_dim] into ``cache`` [B, n_kv_heads, max_seq_len, head_dim] in place, row
    ``b`` at position ``positions[b]`` ([B] int64), and return ``cache``. A scatter along the sequence dimension:
    each batch row writes only its own cache row."""
    index = positions.view(-1, 1, 1, 1).expand(new.shape)
    return cache.scatter_(2, index, new.to(cache.dtype))


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, **where: Any) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = _linear(config.dim, config.n_heads * config.head_dim, **where)
        self.wk = _linear(config.dim, config.n_kv_heads * config.head_dim, **where)
        self.wv = _linear(config.dim, config.n_kv_heads * config.head_dim, **where)
        self.wo = _linear(config.n_heads * config.head_dim, config.dim, **where)
        self.kv_cache: KVCache | None = None  # installed by TinyLlama.setup_caches

    def forward(
        self,
        x: Tensor,
        input_pos: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        caches: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """``caches``: None for this layer's KVCache, written at the positions ``input_pos`` [S]; or the caller's
        (k_cache, v_cache) [B, n_kv_heads, max_seq_len, head_dim], one row per batch row, a one-token step written
        at each row's position ``input_pos`` [B] (:func:`write_rows`). cos/sin and mask broadcast against
        [B, heads, S, ...]."""
        bsz, seq_len, _ = x.shape
        q = self.wq(x).view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if caches is None:
            assert self.kv_cache is not None, "call TinyLlama.setup_caches() first"
            k, v = self.kv_cache.update(input_pos, k, v)  # [B, n_kv_heads, max_seq_len, head_dim]
        else:
            k, v = write_rows(caches[0], input_pos, k), write_rows(caches[1], input_pos, v)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        attn_mask = mask.expand(bsz, self.n_heads, seq_len, mask.shape[-1])
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=attn_mask)
        return self.wo(y.transpose(1, 2).reshape(bsz, seq_len, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int, **where: Any) -> None:
        super().__init__()
        self.w1, self.w3 = _linear(dim, hidden_dim, **where), _linear(dim, hidden_dim, **where)
        self.w2 = _linear(hidden_dim, dim, **where)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig, **where: Any) -> None:
        super().__init__()
        assert config.intermediate_size is not None  # resolved in LlamaConfig.__post_init__
        self.attention_norm = RMSNorm(config.dim, config.norm_eps, **where)
        self.attention = Attention(config, **where)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, **where)
        self.feed_forward = FeedForward(config.dim, config.intermediate_size, **where)

    def forward(
        self,
        x: Tensor,
        input_pos: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        caches: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        h = x + self.attention(self.attention_norm(x), input_pos, cos, sin, mask, caches)
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    """The model, its weights drawn from N(0, 0.02) by a generator seeded with ``seed`` (norms 1).

    ``device`` and ``dtype`` (default: the CPU, float32): where the parameters are made and drawn. Each weight is
    drawn in float32 by a generator on ``device`` and cast, so on the CPU any dtype gives the float32 model cast;
    another device's generator draws other numbers (no float32 copy of a large model on the host first). On
    ``device="meta"`` nothing is drawn: shapes only (parameter counts of the large presets)."""

    def __init__(
        self,
        config: LlamaConfig,
        seed: int = 0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        where = {"device": torch.device(device or "cpu"), "dtype": dtype or torch.float32}
        self.config = config
        self.tok_embeddings = torch.nn.utils.skip_init(nn.Embedding, config.vocab_size, config.dim, **where)
        self.layers = nn.ModuleList(TransformerBlock(config, **where) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, **where)
        self.output = _linear(config.dim, config.vocab_size, **where)
        if config.tie_embeddings:  # one matrix: parameters() yields it once, as tok_embeddings.weight
            self.output.weight = self.tok_embeddings.weight
        self.max_batch_size = 0
        self._caches_ready = False  # plain Python flag: checking it in forward does not break tracing
        self._init_weights(seed, where["device"])

    @torch.no_grad()
    def _init_weights(self, seed: int, device: torch.device) -> None:
        if device.type == "meta":
            return
        generator = torch.Generator(device=device).manual_seed(seed)
        for param in self.parameters():  # registration order is fixed, so the result depends only on the seed
            if param.ndim == 1:  # RMSNorm weights
                param.fill_(1.0)
            else:
                param.copy_(torch.empty(param.shape, device=device).normal_(0.0, 0.02, generator=generator))

    def setup_caches(
        self, max_batch_size: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> None:
        """Allocate zeroed KV caches, rotary cos/sin tables [max_seq_len, head_dim] and a causal mask buffer."""
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size={max_batch_size}: must be a positive integer")
        weight = self.output.weight
        dtype = weight.dtype if dtype is None else dtype
        device = torch.device(device) if device is not None else weight.device
        cfg = self.config
        cache_shape = (max_batch_size, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(cache_shape, dtype, device)
        inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # [max_seq_len, head_dim], rotate-half layout
        self.register_buffer("rope_cos", angles.cos().to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", angles.sin().to(device=device, dtype=dtype), persistent=False)
        causal = torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool, device=device).tril()
        self.register_buffer("causal_mask", causal, persistent=False)
        self.max_batch_size = max_batch_size
        self._caches_ready = True

    @torch.no_grad()
    def reset_caches(self) -> None:
        """Zero the KV caches in place (same storage, so captured CUDA graphs stay valid)."""
        for layer in self.layers:
            if layer.attention.kv_cache is not None:
                layer.attention.kv_cache.k_cache.zero_()
                layer.attention.kv_cache.v_cache.zero_()

    def forward(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        """tokens [B, S] int64 and input_pos [S] int64 positions -> logits [B, S, vocab_size]."""
        if not self._caches_ready:
            raise RuntimeError(
                "TinyLlama.forward: KV caches are not allocated; call model.setup_caches(max_batch_size)"
            )
        bsz, seq_len = tokens.shape
        if bsz > self.max_batch_size or seq_len > self.config.max_seq_len:
            raise RuntimeError(
                f"TinyLlama.forward: tokens of shape {tuple(tokens.shape)} exceed the caches "
                f"(max_batch_size={self.max_batch_size}, max_seq_len={self.config.max_seq_len})"
            )
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        mask = self.causal_mask[input_pos]  # [S, max_seq_len]: a token sees itself and earlier positions
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return self.output(self.norm(x))


def build_tiny_llama(
    preset: str | LlamaConfig = "tiny",
    *,
    seed: int = 0,
    max_batch_size: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TinyLlama:
    """A TinyLlama in eval mode with caches set up, on device/dtype."""
    config = LlamaConfig.preset(preset) if isinstance(preset, str) else preset
    model = TinyLlama(config, seed=seed).to(device=device, dtype=dtype)
    model.setup_caches(max_batch_size, dtype=dtype, device=device)
    return model.eval()


def prefill_inputs(
    config: LlamaConfig, batch_size: int, seq_len: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """Random tokens [B, S] (local generator) and input_pos = arange(S)."""
    if not 0 < seq_len <= config.max_seq_len:
        raise ValueError(f"seq_len={seq_len}: must be in [1, max_seq_len={config.max_seq_len}]")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    return tokens.to(device), torch.arange(seq_len, device=device)


def decode_inputs(
    config: LlamaConfig, batch_size: int, pos: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """Random tokens [B, 1] (local generator) and input_pos = tensor([pos])."""
    if not 0 <= pos < config.max_seq_len:
        raise ValueError(f"pos={pos}: must be in [0, max_seq_len={config.max_seq_len})")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch_size, 1), generator=generator)
    return tokens.to(device), torch.tensor([pos], dtype=torch.long, device=device)
