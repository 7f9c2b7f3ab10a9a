"""Judging greedy tokens that differ from eager's (airgraph/bench/ties.py), as benchmarks/hf_generate.py and
benchmarks/llm_roofline.py use it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from airgraph.bench import ties

ROOT = Path(__file__).resolve().parents[2]


def test_margins_are_eager_top_logit_minus_the_chosen_token_s():
    # prompt of 2 tokens, 3 generated: logits row i predicts token i + 1, so rows 1..3 judge the generated ones
    logits = torch.tensor(
        [
            [
                [9.0, 9.0, 9.0],  # predicts the second prompt token: not judged
                [4.0, 1.0, 0.0],  # top 4.0 (token 0)
                [0.5, 0.25, 0.0],  # top 0.5 (token 0), |top| < 1
                [-2.0, -3.0, -10.0],  # top -2.0 (token 0)
            ]
        ]
    )
    sequences = torch.tensor([[7, 7, 0, 1, 1]])
    margins = ties.margins(logits, sequences, prompt_len=2)
    torch.testing.assert_close(margins, torch.tensor([[0.0, 0.25, 0.5]]))
    assert margins.device.type == "cpu"


def test_judge_calls_a_sequence_a_tie_only_within_the_dtype_s_tolerance():
    close = torch.tensor([[0.0, 2**-6, 0.0]])
    assert ties.judge(close, "bfloat16")["verdict"] == "rounding tie"
    judged = ties.judge(close, "float32")
    assert judged["verdict"] == "wrong"
    assert (judged["tokens_not_eager_argmax"], judged["tokens_past_tolerance"]) == (1, 1)
    assert ties.judge(torch.tensor([[0.0, 0.1]]), "bfloat16")["verdict"] == "wrong"
    assert ties.judge(torch.zeros(1, 4), "float32") == {
        "max_margin": 0.0,
        "tokens_not_eager_argmax": 0,
        "tokens_past_tolerance": 0,
        "tolerance": 1e-4,
        "verdict": "rounding tie",
    }


def test_hf_generate_judges_with_the_shared_rule():
    """hf_generate's teacher forcing (an HF model's eager forward) feeds the shared margins: the model's own greedy
    tokens are its top choice, a token it ranks low is not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = importlib.util.spec_from_file_location("hf_generate_under_test", ROOT / "benchmarks" / "hf_generate.py")
    hf_generate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hf_generate
    try:
        spec.loader.exec_module(hf_generate)
    finally:
        del sys.modules[spec.name]
    assert hf_generate.TIE_TOLERANCE is ties.TIE_TOLERANCE
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sequences = model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        worst = model(sequences[:, :-1]).logits[:, 4:].argmin(-1)
    own = hf_generate.teacher_forced_margins(model, sequences, 5)
    assert own.shape == (2, 6) and float(own.max()) <= ties.TIE_TOLERANCE["float32"]
    wrong = sequences.clone()
    wrong[0, 5] = worst[0, 0]  # the first generated token: the one eager ranks last
    assert ties.judge(hf_generate.teacher_forced_margins(model, wrong, 5), "bfloat16")["verdict"] == "wrong"
