"""The rollout engine: the decode batch really changes from step to step, and cache slots past a request's
length are NaN (never written, never read as numbers) while the ones below hold its keys and values."""

import pytest
import torch

from bitparity.models import TinyMoEPolicy
from bitparity.rl import Request, default_requests, rollout
from tests.models.test_tiny_moe import SMALL


@pytest.fixture(scope="module")
def done():
    return rollout(TinyMoEPolicy(SMALL, seed=0), default_requests(0, vocab=SMALL.vocab), max_batch=6, temperature=0.7)


def test_the_batch_changes_between_steps(done):
    batches = [s["decode"] for s in done.steps]
    assert len({len(b) for b in batches}) >= 5                         # sizes vary
    assert sum(bool(s["prefill"]) for s in done.steps) >= 4            # joins at several steps, not only at start
    assert max(len(s["prefill"]) for s in done.steps) >= 2             # joiners prefilled together, padded
    members_change = sum(set(a) != set(b) for a, b in zip(batches, batches[1:]))
    assert members_change >= len(batches) // 3
    # Where two consecutive steps decode the same requests, the order differs (the rotation).
    assert all(a != b for a, b in zip(batches, batches[1:]) if len(a) >= 2 and len(b) >= 2)
    assert max(map(len, batches)) == 6 and [len(t) for t in done.tokens] == [r.max_new_tokens for r in done.requests]


def test_cache_slots_past_the_length_hold_nan(done):
    for request, tokens, (keys, vals) in zip(done.requests, done.tokens, done.caches):
        filled = len(request.prompt) + len(tokens) - 1              # the last sampled token is never fed
        for cache in (*keys, *vals):
            assert bool(torch.isfinite(cache[:, :filled]).all())
            assert bool(torch.isnan(cache[:, filled:]).all())


def test_bad_requests_are_rejected():
    model = TinyMoEPolicy(SMALL)
    with pytest.raises(ValueError, match="must fit max_positions = 64"):
        rollout(model, [Request((1, 2), 63, seed=0)], max_batch=1, temperature=1.0)
    with pytest.raises(ValueError, match=r"prompt must be a non-empty sequence of token ids in \[0, 256\)"):
        rollout(model, [Request((), 3, seed=0)], max_batch=1, temperature=1.0)
    with pytest.raises(ValueError, match="max_batch must be a positive int"):
        rollout(model, [Request((1,), 3, seed=0)], max_batch=0, temperature=1.0)
