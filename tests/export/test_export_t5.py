"""A tiny T5ForConditionalGeneration (random weights) exported and run with onnxruntime, equal to eager (issue #14).

torch.onnx alone stops on it ("Cannot view a tensor ... as a tensor with shape (2, 7, 16)" at
``attn_output.reshape(*input_shape, -1)``); airgraph/export/views.py is why it exports.
"""

from __future__ import annotations

import pytest
import torch

import airgraph
from airgraph.export.runner import run_export
from tests.export.export_models import read_metadata

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # a capture and a conversion of the whole model: 3-7 s each on a 2-core CPU


def tiny_t5() -> torch.nn.Module:
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def token_ids(batch: int, source_len: int, target_len: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(1, 64, (batch, source_len), generator=generator),
        "decoder_input_ids": torch.randint(1, 64, (batch, target_len), generator=generator),
    }


def eager(model: torch.nn.Module, ids: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(**ids, use_cache=False)
    return out.logits, out.encoder_last_hidden_state


def check(got: dict, expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, encoder_states = expected
    torch.testing.assert_close(torch.from_numpy(got["output_0"]), logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(got["output_1"]), encoder_states, rtol=1e-4, atol=1e-5)


def test_tiny_t5_exports_and_matches_eager(tmp_path):
    model, ids = tiny_t5(), token_ids(2, 7, 5, seed=0)
    result = airgraph.dynamo_export(model=model, export_path=tmp_path, **ids, use_cache=False)
    meta = result.metadata
    assert [o["shape"] for o in meta["outputs"]] == [[2, 5, 64], [2, 7, 32]]
    assert meta["passes"]["contiguous_view_inputs"] > 0
    check(run_export(tmp_path), eager(model, ids))


def test_tiny_t5_dynamic_runs_at_other_sizes(tmp_path):
    model = tiny_t5()
    airgraph.dynamo_export(
        model=model, export_path=tmp_path, dynamic=True, **token_ids(2, 7, 5, seed=0), use_cache=False
    )
    meta = read_metadata(tmp_path)
    assert [i["shape"] for i in meta["inputs"]] == [["batch", "seq"], ["batch", "seq_2"]]
    for batch, source_len, target_len in [(1, 3, 4), (3, 9, 2), (2, 16, 11)]:
        ids = token_ids(batch, source_len, target_len, seed=batch)
        got = run_export(tmp_path, {name: t.numpy() for name, t in ids.items()})
        check(got, eager(model, ids))
