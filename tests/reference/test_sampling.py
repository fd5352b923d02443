"""sample and filter_logits against their meaning (reference/float64.py): the empirical distribution
of sampled tokens (chi-square) and the kept sets of the filter rule (spec 21-22)."""

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.reference import float64

from ..conftest import implementing

F32 = np.float32
U = 2.0 ** -24

# -- statistics ----------------------------------------------------------------------------

# A fixed V = 8 distribution on which every filter removes something: at T = 0.8, min-p 0.04 removes
# tokens 6 and 7, top-k 5 removes token 5, top-p 0.85 removes token 4.
STAT_LOGITS = [2.0, 1.6, 1.1, 0.9, 0.2, -0.4, -1.0, -3.0]
STAT_PARAMS = {"temperature": 0.8, "top_k": 5, "top_p": 0.85, "min_p": 0.04}
DRAWS = 20000                    # seeds 0 .. DRAWS-1, each at its own position
REJECT_BELOW = 1e-6              # chi-square p-value under which a distribution is rejected


def _draw_counts(backend):
    x = torch.tensor([STAT_LOGITS], dtype=torch.float32).repeat(DRAWS, 1)
    seeds = torch.arange(DRAWS, dtype=torch.int64)
    positions = (seeds * 7919) % 4096
    tokens, _ = bp.sample(x, seeds, positions, backend=backend, **STAT_PARAMS)
    return np.bincount(tokens.numpy(), minlength=len(STAT_LOGITS))


def _probabilities(temperature=STAT_PARAMS["temperature"], top_k=STAT_PARAMS["top_k"], top_p=STAT_PARAMS["top_p"],
                   min_p=STAT_PARAMS["min_p"]):
    row = lambda v, dtype: np.array([v], dtype=dtype)         # noqa: E731 - one row of per-row parameters
    scale = F32(1) / F32(temperature)
    x = np.array([STAT_LOGITS], dtype=F32)
    return float64.sample_probabilities(x, row(scale, F32), row(top_k, np.int64), row(top_p, F32), row(min_p, F32))[0]


def _chi_square_p(counts, probs):
    """p-value of Pearson's chi-square over the tokens with probability > 0 (removed tokens checked apart)."""
    support = probs > 0
    expected = counts.sum() * probs[support]
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# native (vLLM's sort-based sampler with torch's generator) is drawn too: the baseline follows the same rule.
@pytest.fixture(scope="module", params=[*implementing("sample", ("numpy", "cpu")), "native"])
def counts(request):
    return _draw_counts(request.param)


def test_filtered_distribution_is_the_one_in_the_setup():
    probs = _probabilities()
    assert np.flatnonzero(probs > 0).tolist() == [0, 1, 2, 3]      # each filter removed what the comment says
    assert np.flatnonzero(_probabilities(top_p=1.0) > 0).tolist() == [0, 1, 2, 3, 4]
    assert np.flatnonzero(_probabilities(top_p=1.0, top_k=0) > 0).tolist() == [0, 1, 2, 3, 4, 5]


def test_frequencies_match_the_filtered_distribution(counts):
    probs = _probabilities()
    assert counts[probs == 0].sum() == 0                            # a removed token is never drawn
    assert _chi_square_p(counts, probs) > REJECT_BELOW


@pytest.mark.parametrize("wrong", [
    {"top_p": 1.0, "top_k": 0, "min_p": 0.0},                   # no filters at all
    {"temperature": 1.0},                                      # the filters without the temperature
    {"top_p": 1.0},                                            # top-p forgotten
])
def test_the_chi_square_test_rejects_other_distributions(counts, wrong):
    """The negative control: the same draws against a wrong distribution fail the test above."""
    probs = _probabilities(**wrong)
    rejected = counts[probs == 0].sum() > 0 or _chi_square_p(counts, probs) < REJECT_BELOW
    assert rejected


# -- semantics: kept sets against float64 ----------------------------------------------------

PARAM_SETS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 0.9, 0.0), (0.7, 50, 0.9, 0.0), (1.3, 0, 0.5, 0.1), (0.5, 10, 0.95, 0.05), (1.0, 0, 1.0, 0.2),
    (2.0, 3, 1.0, 0.0), (1.0, 0, 0.3, 0.0),
]
ROWS = {7: 96, 100: 64, 1000: 32, 32000: 4}


def _kept_sets(x, params):
    t, k, p, m = (torch.tensor(v) for v in zip(*params))
    out = bp.filter_logits(torch.from_numpy(x), temperature=t, top_k=k, top_p=p, min_p=m, backend="numpy").numpy()
    scale = np.array([F32(1) / F32(v) for v in t.tolist()], dtype=F32)
    args = (x, scale, k.numpy(), p.numpy().astype(F32), m.numpy().astype(F32))
    return out > -np.inf, args


def _classify(x, params, slack):
    """(rows, rows where float32 decided differently from float64 within slack, rows outside it)."""
    got, args = _kept_sets(x, params)
    exact = float64.filter_keep(*args)
    loose, tight = float64.filter_keep(*args, slack=slack), float64.filter_keep(*args, slack=-slack)
    differ = (got != exact).any(axis=1)
    within = (got <= loose).all(axis=1) & (tight <= got).all(axis=1)
    return len(x), int((differ & within).sum()), int((differ & ~within).sum())


# The kept mass Z and A(v) are canonical sums of terms >= 0, each exp within 1 ulp: relative error
# below (depth + 1) u, depth = (chunks - 1) + log2(lanes); thr = p * Z adds one rounding. Each term is
# e_i = exp(w_i - shift) of a rounded difference: relative error up to u |w_i - shift| = u (-log e_i). A
# nonzero Z or A(v) holds the maximum's e = 1 (so it is >= 1), and the e-weighted mean of -log e_i over its
# terms is at most the entropy of e / sum(e), <= ln V: that adds below u ln V to the masses.
# For the knife-edge rows (V = 50, depth 6) that totals below 13u, well within 32u. The random rows
# need no slack: none of them differs from float64 at all.
SLACK = 32 * U


@pytest.mark.parametrize("vocab", sorted(ROWS))
def test_kept_set_is_the_float64_rule_on_random_logits(vocab):
    rng = np.random.default_rng([11, vocab])
    rows = ROWS[vocab]
    x = (rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 4, (rows, 1))).astype(F32)
    params = [PARAM_SETS[r % len(PARAM_SETS)] for r in range(rows)]
    total, boundary, wrong = _classify(x, params, SLACK)
    assert wrong == 0
    assert boundary == 0        # measured: none of the 196 rows (docs/sampling.md): random logits sit far from a boundary


def test_knife_edge_rows_are_decided_by_float32_mass_and_counted():
    """Rows built so that the exact mass above a token equals p * Z: float32 rounding decides them,
    always within the documented slack. The count is reported in docs/sampling.md."""
    rng = np.random.default_rng(12)
    rows, vocab = 400, 50
    x = (rng.standard_normal((rows, vocab)) * 2).astype(F32)
    w = x.astype(np.float64)
    e = np.exp(w - w.max(axis=1, keepdims=True))
    desc = -np.sort(-e, axis=1)
    cut = rng.integers(1, 6, rows)                                     # p = mass of the top `cut` tokens / Z
    p = (np.cumsum(desc, axis=1)[np.arange(rows), cut - 1] / e.sum(axis=1)).astype(F32)
    params = [(1.0, 0, float(pr), 0.0) for pr in p]
    total, boundary, wrong = _classify(x, params, SLACK)
    assert wrong == 0
    assert boundary > 0                 # float32 mass kept a different set than float64 (counted in docs/sampling.md)
    assert _classify(x, params, 0.0)[2] == boundary     # without the slack they would count as wrong: not vacuous
