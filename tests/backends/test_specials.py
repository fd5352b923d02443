"""The special-value table of docs/spec.md section 9, on every canonical backend.

Expected values come from the spec's table (IEEE facts and the spec's rules),
not from running the code.
"""

import math

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity import spec

INF, NAN = math.inf, math.nan
MIN_SUB = 2.0 ** -149

EXP_TABLE = [
    (0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN),
    (spec.f32(spec.EXP_HI_BITS), 3.4027985e38),              # largest finite result
    (spec.f32(spec.EXP_HI_BITS + 1), INF),                   # first overflow
    (spec.f32(spec.EXP_LO_BITS), 0.0),                       # first underflow to +0
    (spec.f32(spec.EXP_LO_BITS - 1), MIN_SUB),               # last input giving the smallest subnormal
    (MIN_SUB, 1.0), (1.0, 2.7182817459106445),
]
LOG_TABLE = [
    (0.0, -INF), (-0.0, -INF), (INF, INF), (-INF, NAN), (-1.0, NAN), (-MIN_SUB, NAN), (NAN, NAN),
    (1.0, 0.0), (2.0, 0.6931471824645996),
    (MIN_SUB, -103.27892990343184),                          # subnormal input: rescaled by 2**23 (spec 6)
    (2.0 ** -126, -87.33654475055310),
]


def _bits(values):
    a = np.asarray(values, dtype=np.float32)
    return np.where(np.isnan(a), np.float32(np.nan), a).view(np.int32)


@pytest.mark.parametrize("op,table", [("exp", EXP_TABLE), ("log", LOG_TABLE)], ids=["exp", "log"])
def test_elementwise_specials(any_backend, op, table):
    x = torch.tensor([a for a, _ in table], dtype=torch.float32)
    got = getattr(bp, op)(x, backend=any_backend).numpy()
    want = np.array([b for _, b in table], dtype=np.float32)
    assert np.array_equal(_bits(got), _bits(want)), list(zip(x.tolist(), got.tolist(), want.tolist()))
    assert np.signbit(got[np.asarray(want) == 0]).tolist() == np.signbit(want[want == 0]).tolist()


def _row(values):
    return torch.tensor([values], dtype=torch.float32)


def test_fully_masked_row(any_backend):
    x = _row([1.0, 2.0, 3.0])
    mask = torch.zeros(1, 3, dtype=torch.bool)
    kw = {"backend": any_backend}
    assert bp.logsumexp(x, mask, **kw).item() == -INF
    assert bp.log_softmax(x, mask, **kw).tolist() == [[-INF] * 3]
    assert bp.softmax(x, mask, **kw).tolist() == [[0.0] * 3]
    ent = bp.entropy(x, mask, **kw).item()
    assert ent == 0.0 and not math.copysign(1.0, ent) < 0
    assert bp.sum(x, mask, **kw).item() == 0.0 and math.copysign(1.0, bp.sum(x, mask, **kw).item()) < 0


def test_all_minus_inf_row_is_an_empty_distribution(any_backend):
    x = _row([-INF, -INF])
    kw = {"backend": any_backend}
    assert bp.logsumexp(x, **kw).item() == -INF
    assert bp.log_softmax(x, **kw).tolist() == [[-INF, -INF]]
    assert bp.softmax(x, **kw).tolist() == [[0.0, 0.0]]
    assert bp.entropy(x, **kw).item() == 0.0
    assert bp.token_logprobs(x, torch.tensor([1]), **kw).item() == -INF


@pytest.mark.parametrize("bad", [NAN, INF])
def test_nan_or_plus_inf_poisons_the_row(any_backend, bad):
    x = torch.tensor([[0.5, bad, -INF, 2.0], [0.5, 1.0, -INF, 2.0]])
    kw = {"backend": any_backend}
    for op in (bp.logsumexp, bp.log_softmax, bp.softmax, bp.entropy):
        out = op(x, **kw)
        assert torch.isnan(out[0]).all(), op.__name__
        assert not torch.isnan(out[1]).any(), op.__name__
    assert math.isnan(bp.token_logprobs(x, torch.tensor([0, 0]), **kw)[0].item())


def test_masked_nan_does_not_count(any_backend):
    x = _row([NAN, 0.0, 0.0])
    mask = torch.tensor([[False, True, True]])
    assert bp.softmax(x, mask, backend=any_backend).tolist() == [[0.0, 0.5, 0.5]]
    assert bp.logsumexp(x, mask, backend=any_backend).item() == np.float32(math.log(2.0))


def test_minus_inf_entries_get_zero_probability(any_backend):
    x = _row([-INF, 0.0, 0.0, -INF])
    assert bp.softmax(x, backend=any_backend).tolist() == [[0.0, 0.5, 0.5, 0.0]]
    assert bp.log_softmax(x, backend=any_backend)[0, 0].item() == -INF


def test_single_element_rows(any_backend):
    x = torch.tensor([[-0.0], [3.0], [-1e30]])
    kw = {"backend": any_backend}
    assert bp.softmax(x, **kw).tolist() == [[1.0], [1.0], [1.0]]
    logp = bp.log_softmax(x, **kw)
    assert logp.tolist() == [[0.0], [0.0], [0.0]]
    assert not torch.signbit(logp[1:]).any()             # +0.0: the maximum is canonicalised to +0.0
    assert bp.entropy(x, **kw).tolist() == [0.0, 0.0, 0.0]
    assert bp.logsumexp(x, **kw).tolist() == [0.0, 3.0, float(np.float32(-1e30))]


def test_sum_of_signed_zeros_and_infinities(any_backend):
    kw = {"backend": any_backend}
    assert math.copysign(1.0, bp.sum(_row([-0.0, -0.0]), **kw).item()) < 0    # -0.0 is the identity
    assert math.copysign(1.0, bp.sum(_row([-0.0, 0.0]), **kw).item()) > 0
    assert bp.sum(_row([INF, 1.0]), **kw).item() == INF
    assert math.isnan(bp.sum(_row([INF, -INF]), **kw).item())


def test_ties_give_equal_probabilities(any_backend):
    x = torch.full((1, 1000), 7.25)
    p = bp.softmax(x, backend=any_backend)
    assert (p == p[0, 0]).all()
    assert bp.entropy(x, backend=any_backend).item() == pytest.approx(math.log(1000), rel=2 ** -22)
