"""Selection and sampling (spec 19-22) on every backend, bit for bit against the numpy reference.

These tests call the backends through the contract (docs/backend-contract.md) with per-row
parameters, as ops.py does after validation, so each backend is checked on exactly the inputs
the spec defines.  Tokens are compared as int64; logits as int32 bits after NaN canonicalisation.
"""

import numpy as np
import pytest
import torch

from bitparity.backends import _module
from bitparity.reference import canonical
from bitparity.compare.metrics import canonical_bits
from tests.conftest import _checked, backend_cases

# Random123's kat_vectors for philox4x32 10: counter, key, expected output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

VOCABS = (1, 7, 1024, 32000, 151936)

# One row per parameter combination: (top_k, top_p, min_p), top_k 0 = off and top_p 1 = off.
# "V" stands for the vocabulary size; 1e-30 is a tiny top_p that keeps only the top tokens.
PARAMS = [(0, 1.0, 0.0), (1, 1.0, 0.0), (50, 1.0, 0.0), ("V", 1.0, 0.0), (0, 1e-30, 0.0), (0, 0.5, 0.0),
          (0, 0.9, 0.0), (50, 0.9, 0.0), (0, 1.0, 0.1), (50, 0.9, 0.1), (1, 0.5, 0.1), (0, 0.9, 0.1)]


def _logits(vocab, seed):
    """[len(PARAMS) + 6, vocab]: random rows for the parameter grid, then all-equal, one-hot,
    a few +inf / -inf / NaN rows and a wide-range row."""
    rng = np.random.default_rng([seed, vocab])
    x = rng.standard_normal((len(PARAMS) + 6, vocab)).astype(np.float32) * 3
    r = len(PARAMS)
    x[r] = 1.25                                            # ties everywhere
    x[r + 1] = -1e4
    x[r + 1, vocab // 2] = 0.0                             # one-hot
    x[r + 2, rng.integers(0, vocab, max(1, vocab // 3))] = -np.inf
    x[r + 3, rng.integers(0, vocab)] = np.inf              # no distribution: NaN row, token -1
    x[r + 4, rng.integers(0, vocab)] = np.nan
    x[r + 5] = (rng.standard_normal(vocab) * 1e3).astype(np.float32)
    return torch.from_numpy(x)


def _params(x, temperature=0.7):
    rows, vocab = x.shape
    grid = PARAMS + [PARAMS[i % len(PARAMS)] for i in range(rows - len(PARAMS))]
    top_k = torch.tensor([vocab if k == "V" else k for k, _, _ in grid], dtype=torch.int64)
    top_p = torch.tensor([p for _, p, _ in grid], dtype=torch.float32)
    min_p = torch.tensor([m for _, _, m in grid], dtype=torch.float32)
    scale = torch.full((rows,), float(np.float32(1) / np.float32(temperature)), dtype=torch.float32)
    return scale, top_k, top_p, min_p


def _sampling_args(x, seed=0):
    scale, top_k, top_p, min_p = _params(x)
    rows = x.shape[0]
    greedy = torch.zeros(rows, dtype=torch.bool)
    greedy[1::5] = True
    scale[greedy] = 1.0
    seeds = torch.tensor([seed * 1000 + r - 3 for r in range(rows)], dtype=torch.int64)   # negative seeds too
    positions = torch.tensor([r * 7919 + (r % 3) * 2**33 for r in range(rows)], dtype=torch.int64)
    return x, scale, top_k, top_p, min_p, greedy, seeds, positions


def test_philox_known_answers(any_backend):
    counters = torch.tensor([c for c, _, _ in PHILOX_KAT], dtype=torch.int64)
    keys = torch.tensor([k for _, k, _ in PHILOX_KAT], dtype=torch.int64)
    out = _module(any_backend).philox(counters, keys)
    assert out.tolist() == [list(e) for _, _, e in PHILOX_KAT]


def test_philox_matches_numpy(backend):
    rng = np.random.default_rng(1)
    counters = torch.from_numpy(rng.integers(0, 2**32, (4096, 4), dtype=np.int64))
    keys = torch.from_numpy(rng.integers(0, 2**32, (4096, 2), dtype=np.int64))
    assert torch.equal(_module(backend).philox(counters, keys), _module("numpy").philox(counters, keys))


@pytest.mark.parametrize("vocab", (1, 7, 1024, 32000))
def test_topk_bits(backend, vocab):
    x = _logits(vocab, 2)
    x[0, : vocab // 2] = -0.0                              # signed zeros tie with each other
    # A full sort where the row is short; beam search takes k = beam_width <= V, usually small.
    for k in sorted({1, min(5, vocab), min(300, vocab), vocab if vocab <= 1024 else 1}):
        want_v, want_i = _module("numpy").topk(x, k)
        got_v, got_i = _module(backend).topk(x, k)
        assert torch.equal(got_i, want_i), (k, (got_i != want_i).nonzero()[:5])
        assert torch.equal(canonical_bits(got_v), canonical_bits(want_v))


# The interpreter filters and samples up to the 32000-token vocabulary (already past one 16384-wide segment):
# the 151936-wide rows took 70 s there.
VOCAB_CASES = backend_cases([(v,) for v in VOCABS], lambda vocab: vocab <= 32000)


@pytest.mark.parametrize("backend,vocab", VOCAB_CASES)
def test_filter_logits_bits(backend, vocab):
    _checked(backend)
    x = _logits(vocab, 3)
    args = (x, *_params(x))
    want = _module("numpy").filter_logits(*args)
    got = _module(backend).filter_logits(*args)
    bad = (canonical_bits(got) != canonical_bits(want)).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ"


@pytest.mark.parametrize("backend,vocab", VOCAB_CASES)
def test_sample_tokens(backend, vocab):
    _checked(backend)
    args = _sampling_args(_logits(vocab, 4))
    want = _module("numpy").sample(*args)
    got = _module(backend).sample(*args)
    assert torch.equal(got, want), (got, want)


def test_sample_is_batch_invariant(any_backend):
    """A row's token depends on its logits, seed, position and parameters only: not on the rows around it,
    their order or the batch size."""
    args = _sampling_args(_logits(1024, 5))
    module = _module(any_backend)
    whole = module.sample(*args)
    perm = torch.randperm(args[0].shape[0], generator=torch.Generator().manual_seed(0))
    permuted = module.sample(*(a[perm] for a in args))
    assert torch.equal(permuted, whole[perm])
    for r in (0, 7, args[0].shape[0] - 1):
        alone = module.sample(*(a[r:r + 1].contiguous() for a in args))
        assert alone.item() == whole[r].item()


# -- Knife edges: inputs whose decision a 1-ulp error anywhere on the path would flip ------------------------

def _noise_at(seeds, positions, tokens):
    """Spec 20's noise of one token per row, from spec 19's counter layout written out here (not
    through race_noise): Philox(token >> 1, pos_lo, pos_hi, SAMPLE_STREAM; seed_lo, seed_hi), words
    (0, 1) for an even token and (2, 3) for an odd one."""
    u = lambda v: np.asarray(v, dtype=np.int64).view(np.uint64)
    lo = lambda v: (u(v) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = lambda v: (u(v) >> np.uint64(32)).astype(np.uint32)
    counters = np.stack([(np.asarray(tokens) >> 1).astype(np.uint32), lo(positions), hi(positions),
                         np.zeros(len(tokens), dtype=np.uint32)], axis=1)
    words = canonical.philox(counters, np.stack([lo(seeds), hi(seeds)], axis=1))
    odd = (np.asarray(tokens) & 1).astype(bool)
    a, b = np.where(odd, words[:, 2], words[:, 0]), np.where(odd, words[:, 3], words[:, 1])
    return canonical.log(canonical._exponential(a, b))


def _knife_edge_race(pairs=240, vocab=4096):
    """Sampling args for rows where two tokens' race scores are exactly tied, or one ulp apart either way.

    Each row keeps two tokens i < j (every other logit -inf). The one with the larger noise, a, has
    logit 0 (the row maximum, so shift = 0); the other, b, the logit d <= 0 that makes d - noise_b land
    on -noise_a, one ulp below it, or one ulp above it. A backend whose noise or score arithmetic is off
    by one ulp for either token picks the other token in some of these rows. The candidates are
    searched so that a third of them draw a noise from spec 20's fine branch (V < 2**-8); a pair whose
    exact tie no float32 d reaches is left out (about half of them).
    """
    rng = np.random.default_rng(77)
    m = 256 * pairs
    seeds, positions = rng.integers(-2**62, 2**62, m), rng.integers(0, 2**40, m)
    i = rng.integers(0, vocab - 1, m)
    j = i + 1 + (rng.integers(0, vocab, m) % (vocab - 1 - i))
    n_i, n_j = _noise_at(seeds, positions, i), _noise_at(seeds, positions, j)
    fine = np.minimum(n_i, n_j) < np.float32(-5.6)            # log(E) < log(2**-8)
    pick = np.concatenate([np.flatnonzero(fine)[: pairs // 3], np.flatnonzero(~fine)[: pairs - pairs // 3]])
    x, want, keep = [], [], []
    for r in pick:
        (a, na), (b, nb) = sorted(((i[r], n_i[r]), (j[r], n_j[r])), key=lambda t: -t[1])
        target = np.float32(-na)                               # a's score: (0 - 0) - n_a
        d = np.float32(np.float64(nb) - np.float64(na))
        for _ in range(8):                                     # walk d until d - n_b rounds onto the target
            s = np.float32(d - nb)
            if s == target:
                break
            d = np.nextafter(d, np.float32(np.inf) if s < target else np.float32(-np.inf))
        if np.float32(d - nb) != target or d > 0:
            continue
        for step, winner in ((0, min(a, b)), (-1, a), (1, b)):   # tied (lower index wins), b below, b above
            dd = d
            while step and np.float32(dd - nb) == target:
                dd = np.nextafter(dd, np.float32(np.inf) if step > 0 else np.float32(-np.inf))
            if dd > 0:
                continue
            row = np.full(vocab, -np.inf, dtype=np.float32)
            row[a], row[b] = 0.0, dd
            x.append(row)
            want.append(winner)
            keep.append(r)
    rows = len(x)
    args = (torch.from_numpy(np.stack(x)), torch.ones(rows), torch.zeros(rows, dtype=torch.int64), torch.ones(rows),
            torch.zeros(rows), torch.zeros(rows, dtype=torch.bool), torch.from_numpy(seeds[keep]),
            torch.from_numpy(positions[keep]))
    return args, torch.tensor(want)


def test_knife_edge_race_is_decided_by_the_reference_noise():
    """The construction works: the reference itself picks the designed token in every row."""
    args, want = _knife_edge_race()
    assert len(want) > 300
    got = _module("numpy").sample(*args)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {len(want)} rows not as designed"


def test_sample_agrees_on_knife_edge_races(backend):
    args, want = _knife_edge_race()
    got = _module(backend).sample(*args)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {len(want)} knife-edge rows differ"


def _knife_edge_top_p(rows=24, vocab=20000):
    """filter_logits args for rows where top_p * Z sits on the canonical mass above the cut value:
    p = A(v)/Z rounded to float32, and one float32 step either side. Two segments per row, so a
    backend that sums Z or A(v) in any order other than spec 3's keeps a different set in some rows."""
    rng = np.random.default_rng(78)
    x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
    e = canonical.exp(x - x.max(axis=1, keepdims=True))
    total = canonical.canonical_sum(e)
    top_p = []
    for r in range(rows):
        cut = np.sort(x[r])[::-1][1 + r % 4]                     # a value below the top few tokens
        above = canonical.canonical_sum(np.where(x[r:r + 1] > cut, e[r:r + 1], np.float32(-0.0)))[0]
        p = np.float32(np.float64(above) / np.float64(total[r]))
        top_p.append([p, np.nextafter(p, np.float32(0)), np.nextafter(p, np.float32(1))][r % 3])
    n = len(top_p)
    return (torch.from_numpy(x), torch.ones(n), torch.zeros(n, dtype=torch.int64),
            torch.tensor(np.array(top_p, dtype=np.float32)), torch.zeros(n))


def test_filter_logits_agrees_on_knife_edge_top_p(backend):
    args = _knife_edge_top_p()
    want = _module("numpy").filter_logits(*args)
    got = _module(backend).filter_logits(*args)
    bad = (canonical_bits(got) != canonical_bits(want)).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ"
