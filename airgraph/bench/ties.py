"""Greedy tokens that differ from eager's: a rounding tie or a wrong answer (benchmarks/hf_generate.py and
benchmarks/llm_roofline.py judge them alike).

With random weights, bfloat16 logits tie exactly now and then (one unit in the last place decides), so a compiled
model may pick another token than eager at some step and follow another sequence from there. Each token of such a
sequence is judged on eager's logits for the sequence's own prefix (teacher forcing: one eager forward over the
whole sequence): its margin is eager's top logit minus eager's logit for it, as a fraction of max(1, |top logit|),
0 where it is eager's greedy choice. When every margin is within ``TIE_TOLERANCE`` the verdict is "rounding tie",
else "wrong".
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TIE_TOLERANCE", "judge", "margins"]

# A chosen token is a rounding tie when eager's logit for it is within this of eager's top logit, as a fraction of
# max(1, |top logit|): about 4 units in the last place of bfloat16 (8 significant bits); float32 gets far less.
TIE_TOLERANCE = {"float32": 1e-4, "bfloat16": 2**-5}


def margins(logits: torch.Tensor, sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Each generated token's margin [B, new tokens] (on the CPU, float32).

    ``logits`` [B, L - 1, V]: eager's logits over ``sequences[:, :-1]`` (position i predicts token i + 1);
    ``sequences`` [B, L]: the prompt (``prompt_len`` tokens) and the generated tokens."""
    logits = logits[:, prompt_len - 1 :].float()  # on the logits' device; only the margins come back
    top = logits.max(dim=-1).values
    picked = logits.gather(-1, sequences[:, prompt_len:, None].to(logits.device)).squeeze(-1)
    return ((top - picked) / top.abs().clamp(min=1.0)).cpu()


def judge(token_margins: torch.Tensor, dtype: str) -> dict[str, Any]:
    """The verdict on a sequence from its tokens' margins, with what it rests on."""
    tolerance = TIE_TOLERANCE[dtype]
    worst = float(token_margins.max()) if token_margins.numel() else 0.0
    return {
        "max_margin": round(worst, 6),
        "tokens_not_eager_argmax": int((token_margins > 0).sum()),
        "tokens_past_tolerance": int((token_margins > tolerance).sum()),
        "tolerance": tolerance,
        "verdict": "rounding tie" if worst <= tolerance else "wrong",
    }
