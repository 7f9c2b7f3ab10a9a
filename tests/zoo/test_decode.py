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
