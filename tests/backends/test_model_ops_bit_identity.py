"""The model building blocks (spec 24) on every backend, bit for bit against the numpy reference.

The backends are called through the contract (docs/backend-contract.md), as ops.py calls them after
validation. Shapes are small enough for the Triton interpreter and the Ascend emulation, and odd
enough (K = 1, 63, 1100 > LANES; D = 6; Tk = 1 .. 40) to cross every lane and tile boundary. Floats are
compared as int32 bits after NaN canonicalisation.
"""


import numpy as np
import pytest
import torch

from bitparity.backends import _module
from bitparity.compare.metrics import canonical_bits


def _same(a, b):
    assert a.dtype == torch.float32 and a.shape == b.shape
    diff = canonical_bits(a) != canonical_bits(b)
    assert not bool(diff.any()), f"{int(diff.sum())} of {diff.numel()} elements differ; first at {diff.nonzero()[0].tolist()}"


def _randn(rng, *shape, scale=1.0):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def _both(op, backend, *args):
    return getattr(_module(backend), op)(*args), getattr(_module("numpy"), op)(*args)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 63, 5), (7, 64, 33), (2, 1100, 4), (5, 16, 130)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(backend, m, k, n, with_bias):
    rng = np.random.default_rng([m, k, n])
    x, w = _randn(rng, m, k), _randn(rng, n, k, scale=0.3)
    bias = _randn(rng, n) if with_bias else None
    _same(*_both("linear", backend, x, w, bias))


def test_linear_specials(backend):
    # NaN, ±inf, ±0, subnormal and huge products: a row or weight row holding NaN or inf is decided per pair
    # outside the integer path (spec 24.1); finite rows beside them are not touched; 3e38 * 3e38 terms are exact.
    x = torch.tensor([[np.nan, 1.0, 2.0, -0.0], [np.inf, 1.0, 0.0, 3e38], [-0.0, -0.0, 0.0, 1e-40],
                      [3e38, 3e38, -3e38, 1.0], [-np.inf, 1.0, 1.0, 1.0]], dtype=torch.float32)
    w = torch.tensor([[1.0, -1.0, 0.5, 2.0], [0.0, 1.0, -0.0, 1.0], [1e-40, 1.0, 1.0, 1e30],
                      [1.0, np.inf, -np.inf, 0.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float32)
    _same(*_both("linear", backend, x, w, torch.tensor([0.0, -np.inf, 1.0, 0.0, -0.0])))
    _same(*_both("linear", backend, x, w, None))
    # An exact zero is +0.0 (spec 24.1, 2.0.0), whatever the signs of the zero products; -0.0 + -0.0 bias is too.
    x3, w3 = torch.tensor([[-0.0, -0.0, -0.0], [1.0, -1.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 3.0]])
    out, ref = _both("linear", backend, x3, w3, torch.tensor([-0.0, -0.0]))
    _same(out, ref)
    assert (canonical_bits(out) == 0).all()


def test_linear_rows_are_independent(backend):
    # Batch invariance: a row's bits do not depend on how many rows share the call.
    rng = np.random.default_rng(1)
    x, w = _randn(rng, 37, 64), _randn(rng, 50, 64)
    full = getattr(_module(backend), "linear")(x, w, None)
    for r in (0, 17, 36):
        _same(getattr(_module(backend), "linear")(x[r:r + 1].contiguous(), w, None), full[r:r + 1])


@pytest.mark.parametrize("rows,d", [(1, 1), (4, 6), (9, 64), (3, 1100)])
def test_rms_norm(backend, rows, d):
    rng = np.random.default_rng([rows, d])
    x = _randn(rng, rows, d, scale=3.0)
    x[0, 0] = 0.0
    _same(*_both("rms_norm", backend, x, _randn(rng, d), float(np.float32(1e-6))))


def test_rms_norm_specials(backend):
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [np.inf, 1.0, 1.0, 1.0], [np.nan, 1.0, 2.0, 3.0],
                      [1e-40, -1e-40, 1e-39, 0.0], [3e38, 3e38, 1.0, -1.0]], dtype=torch.float32)
    _same(*_both("rms_norm", backend, x, torch.ones(4), float(np.float32(1e-6))))


@pytest.mark.parametrize("rows,d", [(1, 2), (5, 16), (3, 130)])
def test_rotary(backend, rows, d):
    rng = np.random.default_rng([rows, d])
    x = _randn(rng, rows, d)
    x[0, 0] = np.nan
    angles = rng.uniform(0, 100, (rows, d // 2))
    cos, sin = (torch.from_numpy(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
    _same(*_both("rotary", backend, x, cos, sin))


ATTENTION_SHAPES = [  # (groups, Tq, Tk, D, causal)
    (1, 1, 1, 1, True), (3, 5, 5, 16, True), (2, 1, 9, 16, True), (2, 4, 11, 6, True),
    (2, 7, 7, 16, False), (1, 3, 40, 8, False),
]


@pytest.mark.parametrize("g,tq,tk,d,causal", ATTENTION_SHAPES)
def test_attention(backend, g, tq, tk, d, causal):
    rng = np.random.default_rng([g, tq, tk, d])
    q, k, v = _randn(rng, g, tq, d), _randn(rng, g, tk, d), _randn(rng, g, tk, d)
    low = tq if causal else 1
    lengths = torch.from_numpy(rng.integers(low, tk + 1, g).astype(np.int64))
    lengths[0] = tk
    scale = float(np.float32(1.0 / np.sqrt(d)))
    _same(*_both("attention", backend, q, k, v, lengths, causal, scale))


def test_attention_ignores_keys_past_the_length(backend):
    # NaN and inf in unused cache slots must not reach the output: they are never combined with a number.
    rng = np.random.default_rng(3)
    q, k, v = _randn(rng, 2, 1, 16), _randn(rng, 2, 12, 16), _randn(rng, 2, 12, 16)
    lengths = torch.tensor([5, 12])
    clean = getattr(_module(backend), "attention")(q, k, v, lengths, True, 0.25)
    k[0, 5:], v[0, 5:] = float("nan"), float("inf")
    dirty = getattr(_module(backend), "attention")(q, k, v, lengths, True, 0.25)
    _same(dirty, clean)
    assert not bool(dirty.isnan().any())


def test_attention_decode_equals_prefill(backend):
    # Spec 24.4's promise: query t of a prefill over T tokens == a one-token step against a cache of Tk > t slots.
    rng = np.random.default_rng(4)
    t_total, d = 9, 16
    q, k, v = _randn(rng, 2, t_total, d), _randn(rng, 2, t_total, d), _randn(rng, 2, t_total, d)
    prefill = getattr(_module(backend), "attention")(q, k, v, torch.tensor([t_total] * 2), True, 0.25)
    cache_k = torch.cat([k, torch.full((2, 4, d), float("nan"))], dim=1)
    cache_v = torch.cat([v, torch.full((2, 4, d), float("nan"))], dim=1)
    for t in range(t_total):
        step = getattr(_module(backend), "attention")(q[:, t:t + 1].contiguous(), cache_k, cache_v,
                                                      torch.tensor([t + 1] * 2), True, 0.25)
        _same(step, prefill[:, t:t + 1])


def test_silu_mul(backend):
    rng = np.random.default_rng(5)
    g = torch.cat([_randn(rng, 500, scale=8.0),
                   torch.tensor([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 88.0, -88.0, 200.0, -200.0])])
    u = _randn(rng, g.numel())
    _same(*_both("silu_mul", backend, g, u))
