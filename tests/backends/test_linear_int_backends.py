"""spec 2.0.0's linear (24.1) where the integer kernels of cuda (Triton int8 tl.dot, run in the interpreter here)
and ascend (the Cube unit's int8 Mmad, in the host emulation) have their own structure: digit slices, int32
chunks of K, carries into two words, the one rounding. Each case is compared with the numpy reference as int32
bits after NaN canonicalisation; tests/reference checks that reference against Python integers.
"""

import numpy as np
import pytest
import torch

from bitparity.backends import _module
from bitparity.backends.ascend import host_emulation
from bitparity.compare.metrics import canonical_bits

BACKENDS = ("cuda", "ascend")


def _check(backend, x, w, bias=None):
    got = _module(backend).linear(x, w, bias)
    want = _module("numpy").linear(x, w, bias)
    diff = canonical_bits(got) != canonical_bits(want)
    assert not bool(diff.any()), f"{int(diff.sum())} of {diff.numel()} differ; first at {diff.nonzero()[0].tolist()}"
    return got


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancellation_ties_subnormals_and_overflow(backend):
    """Exact answers the 1.x tree misses (4096 - 4096 + 1), ties to even at 24 bits, results on the subnormal
    grid and below it, overflow to inf from finite products, and a product exponent far below the rows'."""
    x = _t([[4096.0, -4096.0, 1.0], [1.0, 2.0**-24, 0.0], [1.0 + 2.0**-23, 2.0**-24, 0.0],
            [2.0**-70, 3 * 2.0**-71, -(2.0**-72)], [3e38, 3e38, 0.0], [-3e38, 1.0, 2.0**-149]])
    w = _t([[4096.0, 4096.0, 1.0], [1.0, 1.0, 1.0], [2.0**-70, 2.0**-74, 5 * 2.0**-75], [2.0**-80, 1.0, -1.0],
            [3e38, 2.0, 0.0]])
    y = _check(backend, x, w)
    assert y[0, 0].item() == 1.0 and y[1, 1].item() == 1.0 and y[2, 1].item() == 1.0 + 2.0**-22
    assert y[4, 4].item() == float("inf") and 0 < abs(y[3, 2].item()) < 2.0**-126
    _check(backend, x, w, _t([0.5, -0.0, 1e-45, -np.inf, 2.0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_specials_per_pair(backend):
    """NaN and +-inf rows decide only their own pairs: inf * 0 and +inf with -inf give NaN, else the infinity."""
    x = _t([[np.inf, 0.0, 1.0], [1.0, -np.inf, 2.0], [np.nan, 1.0, 1.0], [1.0, 2.0, 3.0], [-0.0, -0.0, 0.0]])
    w = _t([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [-1.0, np.inf, 0.0], [1.0, 2.0, 3.0], [np.inf, -np.inf, 1.0]])
    y = _check(backend, x, w, _t([1.0, -np.inf, 0.0, -0.0, 2.0]))
    assert torch.isfinite(y[3, [0, 3]]).all() and (canonical_bits(_module(backend).linear(x[4:], w[3:4], None)) == 0).all()


@pytest.mark.parametrize("backend, k", [("cuda", 8200), ("ascend", 8200), ("ascend", 16384 + 40)])
def test_k_past_one_int32_chunk(backend, k):
    """K beyond CHUNK_K = 8192 terms: two or three int32 partials per digit weight, added in int64; entries at the
    row maximum make every quantised value large, with outlier channels."""
    rng = np.random.default_rng(k)
    x = torch.from_numpy(np.float32(1.9999999) * np.sign(rng.standard_normal((2, k))).astype(np.float32))
    x[:, ::97] *= 1000.0
    w = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32))
    _check(backend, x, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_in_any_order_and_any_batch(backend):
    """A row's outputs depend on its row and the weight only: permuted rows, a row alone and two calls give the
    same bits as one call."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy((rng.standard_normal((37, 70)) * np.exp2(rng.integers(-8, 8, (37, 1)))).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((20, 70)).astype(np.float32))
    linear = _module(backend).linear
    full = _check(backend, x, w)
    order = torch.from_numpy(rng.permutation(37))
    assert torch.equal(canonical_bits(linear(x[order].contiguous(), w, None)), canonical_bits(full[order]))
    parts = torch.cat([linear(x[:5].contiguous(), w, None), linear(x[5:].contiguous(), w, None)])
    assert torch.equal(canonical_bits(parts), canonical_bits(full))
    assert torch.equal(canonical_bits(linear(x[17:18].contiguous(), w, None)), canonical_bits(full[17:18]))


@pytest.mark.parametrize("blocks", (1, 3, 40))
def test_ascend_core_count_changes_no_bit(blocks):
    """The Cube kernel's (tile, digit weight, chunk) items and the other kernels' rows spread over 1, 3 or 40
    emulated cores give the numpy bits: integer sums are exact in any order."""
    rng = np.random.default_rng(blocks)
    x = torch.from_numpy(rng.standard_normal((130, 300)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((70, 300)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(70).astype(np.float32))
    want = _module("numpy").linear(x, w, b)
    assert torch.equal(canonical_bits(host_emulation.linear(x, w, b, blocks=blocks)), canonical_bits(want))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m, k, n", [(0, 5, 3), (2, 5, 0), (2, 0, 3)])
def test_empty_operands(backend, m, k, n):
    """No rows (an expert no token chose), no outputs, or K = 0 (every S = 0: +0.0, then the bias)."""
    bias = torch.arange(n, dtype=torch.float32) - 1.0
    _check(backend, torch.ones(m, k), torch.ones(n, k), bias)
