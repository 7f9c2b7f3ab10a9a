"""The zoo's LLaMA generating with a ``transformers`` StaticCache, the case reduce-overhead is for: a prefill,
then one-token decode steps that write the key/value caches in place, recorded once and replayed on the
simulated CUDA runtime with Inductor's kernels (the configuration a GPU runs). Every step's logits are kept
to the end, and the caches must hold eager's values."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.runtime.simulated import SimulatedCuda
from tests.zoo.compare import assert_tensors_close
from tests.zoo.hf_models import HF_SPECS

pytestmark = pytest.mark.slow

PROMPT, STEPS, MAX_LEN = 6, 5, 16


def _cache_tensors(cache: hf.StaticCache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def test_static_cache_decode_is_captured_once_and_replayed():
    spec = next(s for s in HF_SPECS if s.name == "llama")
    eager, model = spec.build().eval(), spec.build().eval()
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"  # Inductor kernels: the default
    sim = SimulatedCuda()
    backend = AirgraphBackend(config, runtime=sim)
    compiled = torch.compile(model, backend=backend)
    caches = [hf.StaticCache(config=m.config, max_cache_len=MAX_LEN) for m in (eager, model)]
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 128, (2, PROMPT), generator=generator)
    kept = []
    with torch.no_grad():
        for step in range(STEPS + 1):  # step 0: the prefill
            position = torch.arange(PROMPT) if step == 0 else torch.tensor([PROMPT + step - 1])
            kwargs = {"cache_position": position, "use_cache": True}
            want = eager(tokens, past_key_values=caches[0], **kwargs).logits
            with sim.call():
                got = compiled(tokens.clone(), past_key_values=caches[1], **kwargs).logits
            kept.append((got, want))
            tokens = torch.randint(0, 128, (2, 1), generator=generator)
    for step, (got, want) in enumerate(kept):
        assert_tensors_close(got, want, f"logits of step {step}")
    assert_tensors_close(_cache_tensors(caches[1]), _cache_tensors(caches[0]), "key/value caches")
    sim.check()
    decode = [r for r in backend.reports if r.captured]
    assert decode, [r.uncaptured_reason for r in backend.reports]
    assert sum(r.capture_keys for r in backend.reports) == 2  # the prefill's shape and the decode step's


@pytest.mark.parametrize("input_copies", ["launch", "in-graph"])
def test_hf_generate_with_a_static_cache_replays_on_the_simulator(captures, input_copies):
    """transformers' own ``generate`` with a static cache, its compiled forward on airgraph reduce-overhead with the
    simulated CUDA runtime: each call makes a new cache (tensors marked static, which the recording keeps by address
    only); three calls give eager's tokens, record their step at most once each, are never given up, and no replay
    races or runs on memory freed since its recording. With in-graph input copies, the step's new tensors (the
    token, its position) are fed to the graph, not copied by a launch."""
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        eos_token_id=None,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    config = airgraph.CompilerConfig()
    config.mode, config.kernel_backend = "reduce-overhead", "aten"
    config.reduce_overhead.input_copies = input_copies
    sim = SimulatedCuda()
    backend = AirgraphBackend(config, runtime=sim)

    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> object:  # CompileConfig deep-copies a backend
        return backend(gm, example_inputs)

    compile_config = CompileConfig(backend=compiler, mode=None, dynamic=False)
    compile_config._compile_all_devices = True  # generate compiles on a GPU only, unless told so
    generates, new_tokens = 3, 6
    with torch.no_grad():
        for call in range(generates):
            ids = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(call))
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            common = {"max_new_tokens": new_tokens, "do_sample": False, "cache_implementation": "static"}
            want = model.generate(**inputs, **common, disable_compile=True)
            got = model.generate(**inputs, **common, compile_config=compile_config)
            assert torch.equal(got, want), (call, got, want)
    sim.check()
    (report,) = [r for r in backend.reports if r.captured]
    assert report.uncaptured_reason is None and report.recaptures <= generates - 1
    (entry,) = [k for c in captures for k in c.keys.values() if k.replays]
    assert entry.replays == generates * (new_tokens - 1) - 1 - report.recaptures  # a recording: one call
    assert bool(entry.recorded.fed) == (input_copies == "in-graph")
    if entry.recorded.fed:  # every tensor with a buffer of its own is fed
        assert not entry.recorded.batches and not entry.recorded.copies, (
            entry.recorded.fed,
            entry.recorded.batches,
            entry.recorded.copies,
        )
