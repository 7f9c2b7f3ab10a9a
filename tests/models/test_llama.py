import pytest
import torch

from airgraph.models import (
    LlamaConfig,
    TinyLlama,
    build_tiny_llama,
    decode_inputs,
    prefill_inputs,
)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_presets_and_defaults() -> None:
    tiny = LlamaConfig.preset("tiny")
    assert tiny == LlamaConfig()
    assert tiny.head_dim == 32
    assert tiny.intermediate_size is not None and tiny.intermediate_size % 32 == 0
    assert tiny.intermediate_size >= 8 * tiny.dim // 3
    small = LlamaConfig.preset("small")
    assert (small.dim, small.n_layers, small.n_heads, small.n_kv_heads) == (256, 4, 8, 4)
    assert (small.vocab_size, small.max_seq_len) == (1024, 256)
    micro = LlamaConfig.preset("micro")
    assert (micro.dim, micro.n_layers, micro.n_heads, micro.n_kv_heads) == (32, 1, 2, 1)
    assert (micro.vocab_size, micro.max_seq_len) == (64, 32)


def test_config_validation_errors() -> None:
    with pytest.raises(ValueError, match=r"n_heads=4.*divisible by n_kv_heads=3"):
        LlamaConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"dim=100.*divisible by n_heads=3"):
        LlamaConfig(dim=100, n_heads=3, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"unknown LlamaConfig preset 'huge'.*tiny, small, micro"):
        LlamaConfig.preset("huge")
    with pytest.raises(ValueError, match=r"vocab_size=0.*positive"):
        LlamaConfig(vocab_size=0)


def test_same_seed_same_weights_and_global_rng_untouched() -> None:
    config = LlamaConfig.preset("micro")
    rng_state = torch.get_rng_state()
    a, b = _weights(TinyLlama(config, seed=3)), _weights(TinyLlama(config, seed=3))
    assert torch.equal(torch.get_rng_state(), rng_state)
    c = _weights(TinyLlama(config, seed=4))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["output.weight"], c["output.weight"])
    assert torch.equal(a["norm.weight"], torch.ones(config.dim))
    assert abs(a["tok_embeddings.weight"].std().item() - 0.02) < 0.005


def test_logits_shape_and_finite() -> None:
    model = build_tiny_llama("micro", max_batch_size=2)
    config = model.config
    with torch.no_grad():
        logits = model(*prefill_inputs(config, 2, 5))
        assert logits.shape == (2, 5, config.vocab_size) and logits.dtype == torch.float32
        assert torch.isfinite(logits).all()
        logits = model(*decode_inputs(config, 2, 5))
        assert logits.shape == (2, 1, config.vocab_size)
        assert torch.isfinite(logits).all()


def test_prefill_matches_prefill_then_decode() -> None:
    model = build_tiny_llama("micro", max_batch_size=2, seed=1)
    tokens, input_pos = prefill_inputs(model.config, 2, 9, seed=7)
    with torch.no_grad():
        full = model(tokens, input_pos)
        model.reset_caches()
        head = model(tokens[:, :-1], input_pos[:-1])
        last = model(tokens[:, -1:], input_pos[-1:])
    torch.testing.assert_close(head, full[:, :-1])
    torch.testing.assert_close(last, full[:, -1:])


def test_forward_without_setup_caches_raises() -> None:
    model = TinyLlama(LlamaConfig.preset("micro"))
    tokens, input_pos = prefill_inputs(model.config, 1, 4)
    with pytest.raises(RuntimeError, match="setup_caches"):
        model(tokens, input_pos)


def test_reset_caches_keeps_storage() -> None:
    model = build_tiny_llama("micro")
    cache = model.layers[0].attention.kv_cache
    assert cache is not None and cache.k_cache.shape == (1, 1, 32, 16)
    ptrs = (cache.k_cache.data_ptr(), cache.v_cache.data_ptr())
    with torch.no_grad():
        model(*prefill_inputs(model.config, 1, 4))
    assert cache.k_cache.abs().sum() > 0
    model.reset_caches()
    assert (cache.k_cache.data_ptr(), cache.v_cache.data_ptr()) == ptrs
    assert not cache.k_cache.any() and not cache.v_cache.any()


def test_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    model = build_tiny_llama("micro", max_batch_size=2)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    prefill = prefill_inputs(model.config, 2, 6)
    decode = decode_inputs(model.config, 2, 6)
    with torch.no_grad():
        expected_prefill, expected_decode = model(*prefill), model(*decode)
        model.reset_caches()
        torch.testing.assert_close(compiled(*prefill), expected_prefill)
        torch.testing.assert_close(compiled(*decode), expected_decode)


def test_1b_and_8b_presets_have_the_llama_shapes() -> None:
    """Built on the meta device (shapes only): the parameter counts of Llama-3.2-1B and Llama-3.1-8B."""
    one = LlamaConfig.preset("1b")
    assert (one.dim, one.n_layers, one.n_heads, one.n_kv_heads, one.head_dim) == (2048, 16, 32, 8, 64)
    assert (one.intermediate_size, one.vocab_size, one.tie_embeddings) == (8192, 128256, True)
    eight = LlamaConfig.preset("8b")
    assert (eight.dim, eight.n_layers, eight.n_heads, eight.n_kv_heads, eight.head_dim) == (4096, 32, 32, 8, 128)
    assert (eight.intermediate_size, eight.vocab_size, eight.tie_embeddings) == (14336, 128256, False)
    counts = {
        name: sum(p.numel() for p in TinyLlama(LlamaConfig.preset(name), device="meta").parameters())
        for name in ("1b", "8b")
    }
    assert counts == {"1b": 1_235_814_400, "8b": 8_030_261_248}


def test_tied_embeddings_share_one_matrix() -> None:
    config = LlamaConfig.preset("micro", tie_embeddings=True)
    model = TinyLlama(config, seed=2)
    assert model.output.weight is model.tok_embeddings.weight
    names = [name for name, _ in model.named_parameters()]
    assert "tok_embeddings.weight" in names and "output.weight" not in names
    untied = TinyLlama(LlamaConfig.preset("micro"), seed=2)
    assert untied.output.weight is not untied.tok_embeddings.weight
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 64 * 32
    model.setup_caches(2)
    tokens, input_pos = prefill_inputs(config, 2, 5)
    with torch.no_grad():
        logits = model(tokens, input_pos)
        hidden = model.tok_embeddings(tokens)
        for layer in model.layers:
            hidden = layer(
                hidden, input_pos, model.rope_cos[input_pos], model.rope_sin[input_pos], model.causal_mask[input_pos]
            )
    torch.testing.assert_close(logits, model.norm(hidden) @ model.tok_embeddings.weight.T)
    with pytest.raises(ValueError, match="tie_embeddings=1: must be True or False"):
        LlamaConfig(tie_embeddings=1)  # type: ignore[arg-type]


def test_weights_made_in_a_dtype_are_the_float32_draw_cast() -> None:
    config = LlamaConfig.preset("small")
    cast = TinyLlama(config, seed=5).to(torch.bfloat16).state_dict()
    made = TinyLlama(config, seed=5, device="cpu", dtype=torch.bfloat16).state_dict()
    assert cast.keys() == made.keys()
    assert all(made[k].dtype == torch.bfloat16 and torch.equal(made[k], cast[k]) for k in cast)
