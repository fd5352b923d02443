"""linear's accuracy (spec 24.1, 24.7): the 2.0.0 exact integer product against binary64 and against 1.6.0's
float32 tree (§3's sum of rounded products) on the same inputs.

Inputs (issue 24): Gaussian rows; Gaussian activations against bf16-rounded weights; activations whose rows hold
K/256 outlier channels (at least one) at 100x, 1000x and 10000x the median |x|, against bf16 weights; K from 64 to
16384; 32 x 32 outputs each. The bar: the median and the 99th percentile of the relative error |y - y64| / |y64|
are no larger than the tree's. A 16-bit quantisation fails it (the negative control), and every element is within
the analytic bound of spec 24.1.

The tree is computed here, from the reference's canonical_sum, only as the comparator: it is 1.6.0's linear.
"""

import numpy as np
import pytest

from bitparity import spec
from bitparity.reference import canonical

F32 = np.float32
KS = (64, 256, 1024, 4096, 16384)
KINDS = ("gaussian", "bf16 weights", "outliers 100x", "outliers 1000x", "outliers 10000x")


def _bf16(a):
    """Round binary32 to bfloat16 (RNE on the pattern), back as binary32."""
    bits = a.astype(F32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(F32)


def _inputs(kind, k, seed=0):
    rng = np.random.default_rng([k, KINDS.index(kind), seed])
    x = rng.standard_normal((32, k)).astype(F32)
    w = (rng.standard_normal((32, k)) / np.sqrt(k)).astype(F32)
    if kind != "gaussian":
        w = _bf16(w)
    if kind.startswith("outliers"):
        factor = float(kind.split()[1][:-1])
        median = np.median(np.abs(x))
        channels = rng.choice(k, max(1, k // 256), replace=False)
        x[:, channels] = (np.sign(x[:, channels]) * median * factor).astype(F32)
    return x, w


def _tree(x, w):
    """1.6.0's linear: each product rounded once, then §3's canonical sum over K."""
    return canonical.canonical_sum((x[:, None, :] * w[None, :, :]).reshape(-1, x.shape[1])).reshape(len(x), len(w))


def _quantised_product(x, w, bits):
    """Spec 24.1's product with Bx = Bw = bits (the definition's steps, other bit counts)."""
    qx, ex, _ = canonical.quantise_rows(x, bits)
    qw, ew, _ = canonical.quantise_rows(w, bits)
    hi, lo = canonical.exact_products(qx, qw)
    return canonical.round_scaled(hi, lo, ex[:, None] + ew[None, :] - 2 * (bits - 2))


def _errors(y, exact):
    keep = exact != 0
    rel = np.abs(y.astype(np.float64) - exact)[keep] / np.abs(exact[keep])
    return np.median(rel), np.percentile(rel, 99)


@pytest.fixture(scope="module")
def table():
    """(kind, K) -> (median, p99) of 2.0.0, of the tree and of 16-bit quantisation."""
    out = {}
    for kind in KINDS:
        for k in KS:
            x, w = _inputs(kind, k)
            exact = x.astype(np.float64) @ w.astype(np.float64).T
            out[kind, k] = (_errors(canonical.linear(x, w, None), exact), _errors(_tree(x, w), exact),
                            _errors(_quantised_product(x, w, 16), exact))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_median_and_p99_no_worse_than_the_float32_tree(table, kind):
    for k in KS:
        (median, p99), (tree_median, tree_p99), _ = table[kind, k]
        assert median <= tree_median and p99 <= tree_p99, (kind, k, median, tree_median, p99, tree_p99)
        # Stated bounds (spec 24.7): measured at most 2.3e-8 at the median and 3.0e-7 at p99 (5.4e-8 but for
        # binary32 Gaussian weights at K = 16384), near the correctly rounded result's; the tree: up to 1.3e-7 and
        # 8.2e-6.
        assert median <= 5e-8 and p99 <= 5e-7, (kind, k, median, p99)


def test_cheaper_quantisations_fail_the_bar(table):
    # The negative controls: Bx = Bw = 16 (three int8 slices each) is worse than the tree everywhere; even
    # Bx = Bw = 31 (four slices each, 16 GEMMs instead of 20) is worse at p99 on short outlier rows, where the
    # outlier's binades leave the other entries too few bits.
    worse16 = [(kind, k) for (kind, k), (_, tree, b16) in table.items() if b16[1] > tree[1]]
    assert len(worse16) == len(table)
    x, w = _inputs("outliers 1000x", 256)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert _errors(_quantised_product(x, w, 31), exact)[1] > _errors(_tree(x, w), exact)[1]


@pytest.mark.parametrize("k", KS)
def test_every_element_within_the_analytic_bound(k):
    # |y - x.w| <= half an ulp of y + 2^-38 2^Ex sum|w| + 2^-28 2^Ew sum|x| + K 2^(Ex+Ew-66) (spec 24.1: 39 and 29
    # bits), plus binary64's own error on x.w (at most K 2^-53 sum|x w|).
    x, w = _inputs("outliers 10000x", k, seed=1)
    y = canonical.linear(x, w, None).astype(np.float64)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    _, ex, _ = canonical.quantise_rows(x, spec.LINEAR_BX)
    _, ew, _ = canonical.quantise_rows(w, spec.LINEAR_BW)
    sx, sw = np.exp2(ex.astype(np.float64))[:, None], np.exp2(ew.astype(np.float64))[None, :]
    ax, aw = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
    bound = (np.spacing(np.abs(y).astype(F32)).astype(np.float64) / 2
             + 2.0 ** -38 * sx * aw.sum(1)[None, :] + 2.0 ** -28 * sw * ax.sum(1)[:, None] + k * sx * sw * 2.0 ** -66
             + k * 2.0 ** -53 * (ax @ aw.T))
    assert (np.abs(y - exact) <= bound).all()
