"""Every canonical backend gives the canonical bits (the numpy backend) on every op.

Rows of every kind (random, wide, all-equal, peaked, masked, specials) are
mixed in one batch, at every row length where the reduction structure changes
shape: around one vector repeat (64), one lane block (1024), one segment
(16384), and real vocabularies (32000, 151936).
"""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bitparity as bp
from bitparity.compare import cases
from bitparity.compare.metrics import canonical_bits
from tests.conftest import _checked, backend_cases

LENGTHS = (1, 2, 63, 64, 65, 1000, 1024, 1025, 16384, 16385, 32000, 151936)
BATCHES = (1, 3, 64)
ROW_OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy")


def assert_same_bits(got, want):
    g, w = canonical_bits(got), canonical_bits(want)
    assert g.shape == w.shape
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (f"{bad.shape[0]} of {g.numel()} elements differ; first at {bad[0].tolist()}: "
                              f"got {got.flatten()[0] if got.dim() == 0 else got[tuple(bad[0])]}, "
                              f"want {want[tuple(bad[0])]}")


def run(op, backend, *args, **kw):
    return getattr(bp, op)(*args, backend=backend, **kw)


@functools.cache
def batch(n, rows):
    return cases.make_batch(rows, n, seed=n)


@functools.cache
def canonical_row_op(op, n, rows, masked, temperature):
    """The numpy backend's result, computed once for all backends under test."""
    x, mask = batch(n, rows)
    return run(op, "numpy", x, mask if masked else None, **temperature_kw(op, temperature))


def temperature_kw(op, temperature):
    return {} if op == "sum" else {"temperature": temperature}


# The interpreter runs rows of 16384 and more (segments, real vocabularies) as the 3-row batch only: the 1- and
# 64-row batches of those widths took 7.5 minutes of CI there, and every row kind of the 64-row batch is run by
# the interpreter at the narrower widths (and by a GPU at all).
ROW_CASES = backend_cases([(n, rows) for n in LENGTHS for rows in BATCHES], lambda n, rows: n < 16384 or rows == 3)


@pytest.mark.parametrize("backend,n,rows", ROW_CASES)
def test_row_ops_match_canonical(backend, n, rows):
    _checked(backend)
    x, mask = batch(n, rows)
    for op in ROW_OPS:
        for masked in (False, True):
            for temperature in ((1.0,) if op == "sum" else (1.0, 0.7)):
                got = run(op, backend, x, mask if masked else None, **temperature_kw(op, temperature))
                assert_same_bits(got, canonical_row_op(op, n, rows, masked, temperature))


@pytest.mark.parametrize("backend,n,rows", ROW_CASES)
def test_token_logprobs_match_canonical(backend, n, rows):
    _checked(backend)
    x, _ = batch(n, rows)
    tokens = cases.make_tokens(x, seed=n)
    for kw in ({}, {"temperature": 0.7}):
        got = run("token_logprobs", backend, x, tokens, **kw)
        assert_same_bits(got, run("token_logprobs", "numpy", x, tokens, **kw))
        # The logdiff quantity: bit-identical to the full log_softmax at the chosen token.
        full = run("log_softmax", backend, x, None, **kw)
        assert_same_bits(got, full.gather(1, tokens[:, None])[:, 0])


@pytest.mark.parametrize("n", (65, 32000))
def test_bf16_inputs_match_canonical(backend, n):
    x, mask = cases.make_batch(3, n, seed=5)
    x = x.to(torch.bfloat16)
    for op in ROW_OPS:
        assert_same_bits(run(op, backend, x, mask), run(op, "numpy", x.float(), mask))


@pytest.mark.parametrize("op", ("exp", "log"))
def test_elementwise_match_canonical(backend, op):
    x = cases.make_elementwise(op, 200_000, seed=3)
    assert_same_bits(run(op, backend, x), run(op, "numpy", x))


@settings(max_examples=25)
@given(st.data())
def test_random_shapes_values_and_masks_match_canonical(backend, data):
    """Hypothesis-chosen rows: any length up to two lane blocks, any float32 including specials, any mask."""
    rows = data.draw(st.integers(1, 4), label="rows")
    n = data.draw(st.integers(1, 2100), label="n")
    x = torch.from_numpy(data.draw(hnp.arrays(np.float32, (rows, n), elements=st.floats(width=32)), label="x"))
    mask = torch.from_numpy(data.draw(hnp.arrays(np.bool_, (rows, n)), label="mask"))
    temperature = data.draw(st.sampled_from([1.0, 0.7, 3.0]), label="temperature")
    for op in ROW_OPS:
        kw = {} if op == "sum" else {"temperature": temperature}
        assert_same_bits(run(op, backend, x, mask, **kw), run(op, "numpy", x, mask, **kw))
