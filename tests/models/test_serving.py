"""The serving decode step (airgraph/models/serving.py): a batch of requests, each at its own position, over caches
the caller passes in, equals TinyLlama's own decode of each request alone."""

from __future__ import annotations

import pytest
import torch

from airgraph.models import build_serving_decode, serving_decode_inputs, write_rows


def test_each_row_equals_the_request_decoded_alone():
    step = build_serving_decode("micro", seed=1)
    model, config = step.model, step.config  # TinyLlama, with its own one-row KV cache
    starts = [0, 5, 11]  # each request at its own position
    steps = 4
    tokens = torch.randint(0, config.vocab_size, (steps, len(starts), 1), generator=torch.Generator().manual_seed(0))
    k, v = step.new_caches(len(starts))
    with torch.no_grad():
        got = [step(tokens[t], torch.tensor(starts) + t, k, v) for t in range(steps)]
        for row, start in enumerate(starts):
            model.reset_caches()
            for t in range(steps):
                want = model(tokens[t, row : row + 1], torch.tensor([start + t]))
                torch.testing.assert_close(got[t][row : row + 1], want)
            layer = model.layers[0].attention.kv_cache
            torch.testing.assert_close(k[0][row], layer.k_cache[0])
            torch.testing.assert_close(v[0][row], layer.v_cache[0])


def test_write_rows_writes_each_row_at_its_own_position_only():
    cache = torch.zeros(3, 2, 6, 4)
    new = torch.randn(3, 2, 1, 4)
    write_rows(cache, torch.tensor([4, 0, 2]), new)
    want = torch.zeros(3, 2, 6, 4)
    for row, pos in enumerate([4, 0, 2]):
        want[row, :, pos] = new[row, :, 0]
    torch.testing.assert_close(cache, want)


def test_bad_inputs_are_refused_naming_the_problem():
    step = build_serving_decode("micro")
    tokens, positions = serving_decode_inputs(step.config, 2)
    k, v = step.new_caches(2)
    with pytest.raises(ValueError, match=r"expected tokens \[B, 1\] and positions \[B\]"):
        step(tokens, positions[:1], k, v)
    with pytest.raises(ValueError, match=r"0 k and 1 v caches for 1 layers .*new_caches"):
        step(tokens, positions, [], v)
    with pytest.raises(ValueError, match=r"a cache of shape \(3, 1, 32, 16\), expected \(2, 1, 32, 16\)"):
        step(tokens, positions, *step.new_caches(3))
    with pytest.raises(ValueError, match=r"batch=0: must be a positive integer"):
        step.new_caches(0)
