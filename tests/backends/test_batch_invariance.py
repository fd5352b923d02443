"""A row's bits do not depend on the batch: its size, the row's position, or the other rows."""

import pytest
import torch

import bitparity as bp
from bitparity.compare import cases
from bitparity.compare.metrics import canonical_bits

OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy")


@pytest.mark.parametrize("n", (1000, 16385))
def test_rows_are_independent_of_batch(any_backend, n):
    x, mask = cases.make_batch(64, n, seed=11)
    others, other_mask = cases.make_batch(64, n, seed=12)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    for op in OPS:
        fn = getattr(bp, op)
        full = canonical_bits(fn(x, mask, backend=any_backend))
        shuffled = canonical_bits(fn(x[perm], mask[perm], backend=any_backend))
        assert torch.equal(shuffled, full[perm]), f"{op}: bits depend on the row's position"
        for r in (0, 1, 5, 31, 63):
            alone = canonical_bits(fn(x[r:r + 1], mask[r:r + 1], backend=any_backend))
            assert torch.equal(alone[0], full[r]), f"{op}: row {r} alone differs from row {r} in a batch of 64"
        mixed_x = torch.cat([others[:7], x[5:6], others[7:40]])
        mixed_m = torch.cat([other_mask[:7], mask[5:6], other_mask[7:40]])
        mixed = canonical_bits(fn(mixed_x, mixed_m, backend=any_backend))
        assert torch.equal(mixed[7], full[5]), f"{op}: row 5 differs among other rows"


def test_token_logprobs_independent_of_batch(any_backend):
    x, _ = cases.make_batch(64, 4099, seed=13)
    tokens = cases.make_tokens(x, seed=13)
    full = canonical_bits(bp.token_logprobs(x, tokens, backend=any_backend))
    for r in (0, 17, 63):
        alone = canonical_bits(bp.token_logprobs(x[r:r + 1], tokens[r:r + 1], backend=any_backend))
        assert torch.equal(alone[0], full[r])
    # Leading dimensions are only a view: [8, 8, V] gives the bits of [64, V].
    folded = canonical_bits(bp.token_logprobs(x.reshape(8, 8, -1), tokens.reshape(8, 8), backend=any_backend))
    assert torch.equal(folded.reshape(-1), full)
