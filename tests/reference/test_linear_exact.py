"""linear (spec 24.1) against an independent exact computation in Python integers and Fractions.

The oracle shares nothing with bitparity/reference/canonical.py: the exponent is found by comparing Fractions
with powers of two (no bit patterns), Q is Python's round() of a Fraction (ties to even), S a Python int, and
the result the binary32 nearest to the Fraction S * 2^p, found by scaling to the binary32 quantum of its
binade (2^-149 below 2^-126). Pairs with a non-finite row are Python's float sum of float products, which
follows IEEE (finite float32 products are exact and finite in binary64). The cases are the ones random tests
rarely reach: cancellation, ties (with and without bits far below), subnormal results, overflow, specials,
all-zero rows, and K from 1 to 16384.
"""

from fractions import Fraction

import numpy as np
import pytest

from bitparity import spec
from bitparity.reference import canonical

F32 = np.float32
BX, BW = spec.LINEAR_BX, spec.LINEAR_BW


def _exponent(v):
    """floor(log2 |v|) of a nonzero Fraction, by comparisons."""
    a, e = abs(v), 0
    while a >= 2:
        a, e = a / 2, e + 1
    while a < 1:
        a, e = a * 2, e - 1
    return e


def _quantise(row, bits):
    values = [Fraction(float(v)) for v in row]
    nonzero = [v for v in values if v != 0]
    if not nonzero:
        return [0] * len(values), 0
    e = max(_exponent(v) for v in nonzero)
    return [round(v * Fraction(2) ** (bits - 2 - e)) for v in values], e


def _to_binary32(v):
    """The binary32 nearest to the Fraction v, ties to even, subnormals and overflow included; +0.0 for 0."""
    if v == 0:
        return F32(0.0)
    quantum = Fraction(2) ** max(_exponent(v) - 23, -149)
    n = round(abs(v) / quantum)
    magnitude = n * quantum
    if magnitude >= Fraction(2) ** 128:
        return F32(np.copysign(np.inf, float(v)))
    return F32(float(magnitude) if v > 0 else -float(magnitude))   # exact: at most 24 bits, in binary64's range


def _oracle(x, w, bias=None):
    out = np.empty((x.shape[0], w.shape[0]), dtype=F32)
    for m in range(x.shape[0]):
        qx, ex = _quantise(x[m], BX) if np.all(np.isfinite(x[m])) else (None, None)
        for n in range(w.shape[0]):
            if not (np.all(np.isfinite(x[m])) and np.all(np.isfinite(w[n]))):
                out[m, n] = F32(sum(float(a) * float(b) for a, b in zip(x[m], w[n])))
                continue
            qw, ew = _quantise(w[n], BW)
            s = sum(a * b for a, b in zip(qx, qw))
            out[m, n] = _to_binary32(Fraction(s) * Fraction(2) ** (ex + ew - (BX - 2) - (BW - 2)))
    return out if bias is None else out + bias[None, :]


def _bits(a):
    a = np.asarray(a, dtype=F32)
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


def _check(x, w, bias=None):
    x, w = np.asarray(x, dtype=F32), np.asarray(w, dtype=F32)
    got = canonical.linear(x, w, None if bias is None else np.asarray(bias, dtype=F32))
    want = _oracle(x, w, None if bias is None else np.asarray(bias, dtype=F32))
    np.testing.assert_array_equal(_bits(got), _bits(want))
    return got


def test_cancellation_across_k_is_exact():
    # 1.x's tree added lanes 0 and 2 first (2^24 + 1 rounds to 2^24), then lane 1: it gave 0 for the first order.
    assert _check([[4096, -4096, 1]], [[4096, 4096, 1]])[0, 0] == 1
    assert _check([[4096, 1, -4096]], [[4096, 1, 4096]])[0, 0] == 1
    # 1.x rounded each product (1e60 overflows: inf - inf = NaN); exactly they cancel, and the 1 lies below the
    # row's 29-bit resolution (2^-27 of 1e30), so it is quantised to 0: a finite +0.0.
    assert _bits(_check([[1e30, 1e30, 1.0]], [[1e30, -1e30, 1.0]]))[0, 0] == 0


def test_ties_round_to_even_and_bits_below_break_them():
    got = _check([[2.0 ** 24, 1], [2.0 ** 24, 3], [2.0 ** 24, 1, 0.25][:2], [2.0 ** 24, 1.25]], [[1, 1]])
    assert got[:, 0].tolist() == [2.0 ** 24, 2.0 ** 24 + 4, 2.0 ** 24, 2.0 ** 24 + 2]
    got = _check([[2.0 ** 24, 1, 0.25]], [[1, 1, 1]])                       # S = 2^24 + 1.25: above the tie
    assert got[0, 0] == 2.0 ** 24 + 2
    got = _check([[2.0 ** 24, -1, 2.0 ** -2]], [[1, 1, -1]])                # 2^24 - 1.25: below 2^24 - 1 + 1/2
    assert got[0, 0] == 2.0 ** 24 - 1


def test_subnormal_results_round_once_on_the_subnormal_grid():
    tiny = 2.0 ** -149
    got = _check([[2.0 ** -75], [3 * 2.0 ** -76], [2.0 ** -75]], [[2.0 ** -75], [2.0 ** -74]])
    assert got[0, 0] == 0 and np.signbit(got[0, 0]) == False       # 2^-150: a tie, to even: +0.0   # noqa: E712
    assert got[1, 1] == 2 * tiny                                         # 1.5 * 2^-148 / 2: 3 * 2^-150 -> 4 * 2^-150
    # Rounding to 24 bits first and then into the subnormal grid would give 2^-136 exactly (notes 4).
    got = _check([[2.0 ** -56, 2.0 ** -70, 2.0 ** -80]], [[2.0 ** -80] * 3])
    assert got[0, 0] == F32(2.0 ** -136 + 2.0 ** -149)


def test_subnormal_inputs_are_quantised_from_their_bits():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 40)) * 2.0 ** -130).astype(F32)            # subnormal entries, various lengths
    x[1, :] = F32(2.0 ** -149) * rng.integers(-3, 4, 40).astype(F32)
    w = rng.standard_normal((4, 40)).astype(F32) * F32(2.0 ** 60)
    _check(x, w)
    _check(x, x)


def test_overflow_to_infinity_and_largest_finite():
    big = float(np.finfo(F32).max)
    got = _check([[big, big], [big, -big]], [[1, 1], [1, 0.5]])
    assert got[0, 0] == np.inf and got[1, 1] == F32(big / 2)


def test_all_zero_rows_give_plus_zero_and_the_bias():
    got = _check([[0, -0.0, 0], [-0.0, -0.0, -0.0]], [[-1, 2, 3], [1, 1, 1]], bias=[-0.0, 5])
    assert _bits(got).tolist() == [[0, 0x40A00000]] * 2                      # +0.0 + -0.0 = +0.0
    got = _check([[1, 2, 3]], [[0, 0, 0], [1, -1, 1.0 / 3]])                 # zero weight row, cancellation
    assert _bits(got)[0, 0] == 0


def test_rows_holding_nan_or_inf_take_the_ieee_value_per_pair():
    inf, nan = np.inf, np.nan
    x = [[inf, 1, 2], [1, 2, 3], [-inf, 0, 1], [nan, 1, 1], [inf, -inf, 1], [1e30, 1e30, 0]]
    w = [[1, 1, 1], [0, 1, 1], [1, inf, 0], [-1, 0, 0], [1e30, 1e30, 5]]
    got = _check(x, w, bias=[0, 0, 0, 0, -inf])
    assert np.isnan(got[0, 1]) and got[0, 0] == inf and got[1, 2] == inf and np.isnan(got[2, 2])
    assert np.isnan(got[4, 0]) and np.isnan(got[3, 0]) and got[0, 3] == -inf
    assert np.isfinite(got[5, [0, 1, 3]]).all()          # finite rows against finite rows: 1e30 * 1e30 terms do not
    assert got[5, 2] == inf and np.isnan(got[5, 4])      # overflow on their own; the inf column and +inf + -inf bias


@pytest.mark.parametrize("k", [1, 2, 3, 31, 32, 33, 64, 1000, 4096, 16384])
def test_random_rows_match_the_oracle(k):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((3, k)) * np.exp2(rng.integers(-30, 30, (3, 1)))
    x[1] *= np.exp2(rng.integers(-40, 40, k))                                # wide exponent spread in a row
    x[2, :: max(1, k // 16)] *= 1e4                                           # outlier channels
    w = rng.standard_normal((2, k)) * np.exp2(rng.integers(-30, 30, (2, 1)))
    _check(x.astype(F32), w.astype(F32), bias=rng.standard_normal(2).astype(F32))


@pytest.mark.parametrize("k", [1, 64, 16384])
def test_adversarial_digits_at_the_largest_quantised_magnitude(k):
    # Every |Q| at the largest a binary32 quantises to (2^38 - 2^14 for x, 2^28 - 16 for the weight), all of one
    # sign (S near k * 2^66, 80 bits at K = 16384) and alternating (cancellation down to one product).
    top = F32(np.nextafter(F32(2), F32(0)))
    x = np.stack([np.full(k, top), np.resize(np.array([top, -top], F32), k)])
    w = np.stack([np.full(k, -top), np.full(k, top)]).astype(F32)
    _check(x, w)


def test_quantisation_bits_and_exponents():
    rng = np.random.default_rng(7)
    v = (rng.standard_normal((5, 33)) * np.exp2(rng.integers(-160, 120, (5, 33)))).astype(F32)
    v[3] = 0
    v[4, 5] = F32(2.0 ** -149)
    for bits in (BX, BW):
        q, e, finite = canonical.quantise_rows(v, bits)
        for r in range(5):
            want_q, want_e = _quantise(v[r], bits)
            assert q[r].tolist() == want_q and e[r] == want_e
        assert finite.all() and np.abs(q).max() <= 2 ** (bits - 1)
