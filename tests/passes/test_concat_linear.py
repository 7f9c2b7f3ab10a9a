"""The concat_linear pass with frozen parameters (config.frozen_parameters): q/k/v and gate/up projections of one
input become one matmul over their weights concatenated, on the tiny LLaMA and on transformers' LLaMA, with the
results of eager PyTorch; and what the pass leaves alone (graph outputs), or rewrites (a view the new strides
refuse)."""

from __future__ import annotations

import pytest
import torch
import transformers as hf
from torch._dynamo.utils import counters

from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs
from tests.helpers import TOLERANCES, compile_with

MM = ("aten.mm.default", "aten.addmm.default")


def _mm_count(backend) -> list[int]:
    """Per compiled graph, the matmuls of its final ATen graph (after the passes)."""
    return [sum(1 for n in r.nodes if n.target in MM) for r in backend.reports]


def _concat_details(backend) -> list[str]:
    return [d for r in backend.reports for p in r.passes if p.name == "concat_linear" for d in p.details]


def _llama_steps(model, compiled, dtype=torch.float32):
    """Prefill 5 tokens, then two decode steps, each compared with eager (twin model, same seed)."""
    eager = build_tiny_llama(model.config, dtype=dtype)
    steps = [prefill_inputs(model.config, 1, 5), decode_inputs(model.config, 1, 5), decode_inputs(model.config, 1, 6)]
    with torch.no_grad():
        for tokens, pos in steps:
            torch.testing.assert_close(compiled(tokens, pos), eager(tokens, pos), **TOLERANCES[dtype])


@pytest.mark.parametrize("kernel_backend", ["aten", pytest.param("inductor", marks=pytest.mark.slow)])
def test_llama_projections_become_one_matmul_each_and_equal_eager(kernel_backend):
    model = build_tiny_llama("tiny")  # 2 layers: q, k, v, o, w1, w3, w2 per layer, and the output projection
    compiled, backend = compile_with(model, kernel_backend=kernel_backend, frozen_parameters=True, fullgraph=True)
    _llama_steps(model, compiled)
    # prefill and decode graphs: q/k/v -> 1 and w1/w3 -> 1 per layer: 2 * (1 + 1 + 1 + 1) + 1
    assert _mm_count(backend) == [9, 9]
    details = _concat_details(backend)
    assert sum("over one weight of 128+64+64 columns" in d for d in details) == 4, details  # q/k/v: GQA widths
    assert sum("over one weight of 352+352 columns" in d for d in details) == 4, details  # gate/up


@pytest.mark.slow
def test_inductors_graph_cache_neither_keys_nor_keeps_the_frozen_weights(tmp_path):
    """The constants are marked as torch's freezing marks them (graph/meta.py): Inductor's FX graph cache keys them by
    their metadata and its entries name them, so a model of other weights compiled afterwards is a cache hit that
    reads its own weights (unmarked, every weight would be hashed value by value, and an entry would hold them)."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path)):
        for seed in (0, 1):
            torch._dynamo.reset()
            counters.clear()
            model, eager = build_tiny_llama("micro", seed=seed), build_tiny_llama("micro", seed=seed)
            compiled, _ = compile_with(model, frozen_parameters=True, fullgraph=True)
            inputs = decode_inputs(model.config, 1, 3)
            with torch.no_grad():
                torch.testing.assert_close(compiled(*inputs), eager(*inputs), **TOLERANCES[torch.float32])
            hits = counters["inductor"]["fxgraph_cache_hit"]
            assert hits == seed, dict(counters["inductor"])  # the second model: served from the cache


@pytest.mark.parametrize(
    "options",
    [{"frozen_parameters": False}, {"frozen_parameters": True, "passes.concat_linear": False}],
    ids=["lever off", "pass off"],
)
def test_without_the_lever_each_projection_keeps_its_matmul(options):
    model = build_tiny_llama("tiny")
    compiled, backend = compile_with(model, kernel_backend="aten", fullgraph=True, **options)
    _llama_steps(model, compiled)
    assert _mm_count(backend) == [15, 15]
    assert not any(p.changed for r in backend.reports for p in r.passes if p.name == "concat_linear")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights(dtype):
    model = build_tiny_llama("micro", dtype=dtype)
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True, fullgraph=True)
    _llama_steps(model, compiled, dtype)
    assert _mm_count(backend) == [5, 5]  # 1 layer: qkv, o, w13, w2, and the output projection
    assert backend.reports[0].frozen_parameters  # bf16/fp16 parameters frozen like float32 ones


def _hf_llama() -> torch.nn.Module:
    config = hf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_bias=True,  # q/k/v with biases: addmm
    )
    torch.manual_seed(0)
    return hf.LlamaForCausalLM(config).eval()


def test_transformers_llama_with_biases_equals_eager():
    eager, model = _hf_llama(), _hf_llama()
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = compiled(input_ids=ids, use_cache=False).logits
        want = eager(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])
    details = _concat_details(backend)
    qkv = [d for d in details if "aten.addmm.default over one weight of 64+32+32 columns" in d]
    gate_up = [d for d in details if "aten.mm.default over one weight of 128+128 columns" in d]
    assert len(qkv) == 2 and len(gate_up) == 2, details  # per layer
    # 2 layers x (qkv, o, gate/up, down) + lm_head
    assert _mm_count(backend) == [9]


class _Projections(torch.nn.Module):
    def __init__(self, flatten: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 4, bias=False)
        self.flatten = flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x), self.k(x)
        if self.flatten:  # a view over both dims: not a view of a column slice
            return torch.cat([q.view(-1), k.view(-1)]) * 2
        return q, k


def test_a_view_the_new_strides_refuse_becomes_a_reshape():
    model = _Projections(flatten=True)
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    details = _concat_details(backend)
    assert any("over one weight of 8+4 columns" in d for d in details), details
    assert any("a view of the new strides, now" in d and "aten.reshape.default" in d for d in details), details
    assert _mm_count(backend) == [1]


def test_projections_returned_as_graph_outputs_are_left_as_they_are():
    model = _Projections(flatten=False)
    compiled, backend = compile_with(model, kernel_backend="aten", frozen_parameters=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for got, want in zip(compiled(x), model(x), strict=True):
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride()
    details = _concat_details(backend)
    assert any("left as they are" in d and "graph output" in d for d in details), details
    assert _mm_count(backend) == [2]
