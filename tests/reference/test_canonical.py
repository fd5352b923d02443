"""reference/canonical.py against the spec's own words, and its accuracy against float64."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bitparity import spec
from bitparity.compare import cases, metrics
from bitparity.compare.cases import ROW_SHAPES
from bitparity.compare.run import ulp_floor
from bitparity.ops import inverse_temperature
from bitparity.reference import canonical, float64

F32 = np.float32
NEG_ZERO = F32(-0.0)


def spec_sum(row):
    """docs/spec.md section 3 read literally, one float32 scalar operation at a time."""
    n = len(row)
    partials = []
    for g in range(-(-n // spec.SEGMENT)):
        lanes = [NEG_ZERO] * spec.LANES
        for i in range(g * spec.SEGMENT, min((g + 1) * spec.SEGMENT, n)):
            j = (i - g * spec.SEGMENT) % spec.LANES
            lanes[j] = F32(lanes[j] + row[i])
        partials.append(_tree(lanes))
    width = 1 << (len(partials) - 1).bit_length()
    return _tree(partials + [NEG_ZERO] * (width - len(partials)))


def _tree(values):
    values = list(values)
    while len(values) > 1:
        h = len(values) // 2
        values = [F32(values[i] + values[i + h]) for i in range(h)]
    return values[0]


def bits(a):
    return np.asarray(a, dtype=F32).view(np.int32)


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 1000, 1024, 1025, 16384, 16385, 40000])
def test_sum_is_the_spec_read_literally(n):
    rng = np.random.default_rng(n)
    # Values of mixed magnitude and sign, so any change of order changes bits.
    row = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(F32)
    assert bits(canonical.canonical_sum(row[None, :])[0]) == bits(spec_sum(row))


@given(hnp.arrays(F32, st.integers(1, 300), elements=st.floats(-1e6, 1e6, width=32)),
       st.integers(0, 724))
def test_negative_zero_padding_changes_no_bit(row, extra):
    """The identity that lets short rows use fewer lanes (spec 3.2): padding to any width <= LANES."""
    padded = np.concatenate([row, np.full(extra, NEG_ZERO, dtype=F32)])
    assert bits(canonical.canonical_sum(row[None])) == bits(canonical.canonical_sum(padded[None]))


@given(hnp.arrays(F32, st.integers(1, 2000), elements=st.floats(-50, 50, width=32)), st.data())
def test_masked_entries_are_minus_infinity(row, data):
    mask = data.draw(hnp.arrays(np.bool_, row.shape))
    as_inf = np.where(mask, row, F32(-np.inf))[None]
    one = np.ones(1, dtype=F32)
    for op in (canonical.log_softmax, canonical.softmax, canonical.logsumexp, canonical.entropy):
        assert np.array_equal(bits(op(row[None], mask[None], one)), bits(op(as_inf, None, one)))


@given(hnp.arrays(F32, st.tuples(st.integers(1, 4), st.integers(1, 3000)), elements=st.floats(-80, 80, width=32)),
       st.data())
def test_token_logprobs_is_log_softmax_gathered(x, data):
    tokens = data.draw(hnp.arrays(np.int64, x.shape[:1], elements=st.integers(0, x.shape[1] - 1)))
    ones = np.ones(x.shape[0], dtype=F32)
    full = canonical.log_softmax(x, None, ones)
    assert np.array_equal(bits(canonical.token_logprobs(x, tokens, ones)), bits(full[np.arange(x.shape[0]), tokens]))


def _max_ulp(got, ref):
    return metrics.max_or_zero(metrics.ulp_error(got.astype(np.float64), ref))


def test_exp_within_one_ulp_on_ten_million_inputs():
    x = np.random.default_rng(1).uniform(-104.0, 89.0, 10_000_000).astype(F32)
    with np.errstate(over="ignore"):
        assert _max_ulp(canonical.exp(x), np.exp(x.astype(np.float64))) <= 1.0


def test_log_within_one_ulp_on_ten_million_inputs():
    bit_patterns = np.random.default_rng(2).integers(1, 0x7F800000, 10_000_000, dtype=np.int64)
    x = bit_patterns.astype(np.uint32).view(F32)           # every positive finite float32 equally likely
    assert _max_ulp(canonical.log(x), np.log(x.astype(np.float64))) <= 1.0


def test_reciprocal_within_half_an_ulp_plus_on_softmax_denominators():
    s = np.random.default_rng(3).uniform(1.0, 2.0**31, 1_000_000).astype(F32)
    assert _max_ulp(canonical.reciprocal(s), 1.0 / s.astype(np.float64)) <= 0.5 + 1e-6


def sum_depth(n):
    """Additions on the longest path of the sum (spec 10.1): the first-order error bound in ulps of sum |x|."""
    if n <= spec.LANES:
        return math.ceil(math.log2(n)) if n > 1 else 0
    chunks = min(spec.SEGMENT, n) // spec.LANES + (n < spec.SEGMENT and n % spec.LANES != 0)
    segments = -(-n // spec.SEGMENT)
    return (chunks - 1) + int(math.log2(spec.LANES)) + math.ceil(math.log2(segments))


# Bounds in the op's ulp measure (spec 10); every case of the compare suite, at T = 1 and T = 0.7.
ACCURACY_BOUNDS = {"logsumexp": 1.0, "log_softmax": 1.5, "token_logprobs": 1.5, "softmax": 2.5, "entropy": 3.0}


@pytest.mark.parametrize("op", ["sum", *ACCURACY_BOUNDS])
@pytest.mark.parametrize("shape", ROW_SHAPES["quick"], ids=str)
@pytest.mark.parametrize("kind", cases.ROW_KINDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_accuracy_against_float64(op, shape, kind, temperature):
    x, mask = cases.make_logits(kind, *shape)
    x, m = x.numpy(), None if mask is None else mask.numpy()
    scale = inverse_temperature(temperature)
    with np.errstate(all="ignore"):
        if op == "sum":
            got, ref = canonical.sum(x, m), float64.sum(x, m)
            bound = sum_depth(shape[1])
        elif op == "token_logprobs":
            m = None                                   # token_logprobs takes no mask
            tokens = cases.make_tokens(_t(x)).numpy()
            got = canonical.token_logprobs(x, tokens, np.full(shape[0], scale, dtype=F32))
            ref = float64.token_logprobs(x, tokens, scale)
            bound = ACCURACY_BOUNDS[op]
        else:
            got = getattr(canonical, op)(x, m, np.full(shape[0], scale, dtype=F32))
            ref = getattr(float64, op)(x, m, scale)
            bound = ACCURACY_BOUNDS[op]
        floor = ulp_floor(op, _t(x), None if m is None else _t(m), scale, ref)
        err = metrics.ulp_error(got.astype(np.float64), ref, floor)
    assert metrics.max_or_zero(err) <= bound


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))
