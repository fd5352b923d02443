"""topk, filter_logits, sample and beam_search_step through the public API: validation, the logprob
compositions of spec 22.1, per-row parameters, and the beam step's order and independence (spec 21-23)."""

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.compare.metrics import canonical_bits
from bitparity.reference import canonical

from .conftest import implementing

X = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
SEEDS = torch.tensor([1, 2, 3])
POS = torch.tensor([0, 5, 9])


def _bits_equal(a, b):
    return torch.equal(canonical_bits(a), canonical_bits(b))


# -- errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda **kw: bp.filter_logits(X, backend="numpy", **kw),
    lambda **kw: bp.sample(X, SEEDS, POS, backend="numpy", **kw),
])
@pytest.mark.parametrize("kwargs, error, match", [
    ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\].*got 0.0"),
    ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1e-40}, ValueError, "top_p must .*normal float32"),
    ({"top_p": float("nan")}, ValueError, "top_p must be"),
    ({"top_p": torch.tensor([0.5, 0.0, 0.9])}, ValueError, r"top_p must be in \(0, 1\].*got 0.0"),
    ({"top_p": torch.tensor([0.5, 0.9])}, ValueError, r"top_p must be a scalar or a tensor of shape \(3,\)"),
    ({"top_p": "0.9"}, TypeError, "top_p must be a real number or a tensor"),
    ({"top_k": -1}, ValueError, "top_k must be an integer >= 0"),
    ({"top_k": torch.tensor([1, -2, 3])}, ValueError, "top_k must be an integer >= 0.*got -2"),
    ({"top_k": 2.0}, TypeError, "top_k must be an integer"),
    ({"top_k": True}, TypeError, "top_k must be an integer"),
    ({"top_k": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "top_k must be an integer tensor"),
    ({"top_k": 2 ** 70}, ValueError, "top_k must fit in int64; got 1180591620717411303424"),
    ({"min_p": -0.1}, ValueError, r"min_p must be in \[0, 1\]"),
    ({"min_p": 1.5}, ValueError, r"min_p must be in \[0, 1\]"),
    ({"min_p": torch.tensor([0.1, 0.2, 2.0])}, ValueError, r"min_p must be in \[0, 1\].*got 2.0"),
    ({"min_p": torch.tensor([1, 0, 0])}, TypeError, "min_p must be a floating-point tensor"),
    ({"temperature": -1.0}, ValueError, "temperature must be finite"),
    ({"temperature": float("inf")}, ValueError, "temperature must be finite"),
    ({"temperature": float("nan")}, ValueError, "temperature must be finite"),
    ({"temperature": 1e-40}, ValueError, "temperature must be in float32's normal range"),
    ({"temperature": 1e39}, ValueError, "temperature must be in float32's normal range"),
    ({"temperature": torch.tensor([1.0, -0.5, 1.0])}, ValueError, "temperature must be finite.*got -0.5"),
    ({"temperature": torch.tensor([1.0, 1.0, 1.0], device="meta")}, ValueError, "temperature must be on logits' device"),
])
def test_filter_and_sample_reject_bad_parameters(call, kwargs, error, match):
    with pytest.raises(error, match=match):
        call(**kwargs)


def test_temperature_zero_is_greedy_for_sample_only():
    with pytest.raises(ValueError, match="temperature must be finite and > 0; got 0.0"):
        bp.filter_logits(X, temperature=0.0, backend="numpy")
    with pytest.raises(ValueError, match="temperature must be finite and > 0; got 0.0"):
        bp.filter_logits(X, temperature=torch.tensor([1.0, 0.0, 1.0]), backend="numpy")
    tokens, _ = bp.sample(X, SEEDS, POS, temperature=0.0, backend="numpy")
    assert torch.equal(tokens, X.argmax(dim=1))


@pytest.mark.parametrize("name", ("seeds", "positions"))
def test_sample_rejects_bad_seeds_and_positions(name):
    def call(value):
        args = {"seeds": SEEDS, "positions": POS, name: value}
        return bp.sample(X, args["seeds"], args["positions"], backend="numpy")
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor of dtype int64; got list"):
        call([1, 2, 3])
    with pytest.raises(TypeError, match=f"{name} must have dtype torch.int64; got torch.int32"):
        call(torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=rf"{name} must have shape \[B\] = \(3,\); got \(2,\)"):
        call(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=rf"{name} must have shape \[B\] = \(3,\); got \(1, 3\)"):
        call(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match=f"{name} must be on logits' device"):
        call(torch.tensor([1, 2, 3], device="meta"))


def test_sample_rejects_negative_positions_bad_logits_and_logprob_kind():
    with pytest.raises(ValueError, match="positions must be >= 0; got -4"):
        bp.sample(X, SEEDS, torch.tensor([0, -4, 1]), backend="numpy")
    with pytest.raises(ValueError, match=r"logits must have shape \[B, V\]; got \(1, 3, 7\)"):
        bp.sample(X[None], SEEDS, POS, backend="numpy")
    with pytest.raises(ValueError, match="logits must have at least 2 dimension"):
        bp.sample(X[0], SEEDS, POS, backend="numpy")
    with pytest.raises(TypeError, match="logits must be a torch.Tensor"):
        bp.sample(X.tolist(), SEEDS, POS, backend="numpy")
    with pytest.raises(ValueError, match="logits must not be empty"):
        bp.sample(torch.zeros(0, 7), SEEDS[:0], POS[:0], backend="numpy")
    with pytest.raises(ValueError, match="logprobs must be one of processed, scaled, raw; got 'sampled'"):
        bp.sample(X, SEEDS, POS, logprobs="sampled", backend="numpy")


def test_topk_rejects_bad_input():
    with pytest.raises(ValueError, match=r"k must be in \[1, 7\] \(the row length\); got 0"):
        bp.topk(X, 0, backend="numpy")
    with pytest.raises(ValueError, match=r"k must be in \[1, 7\] \(the row length\); got 8"):
        bp.topk(X, 8, backend="numpy")
    with pytest.raises(TypeError, match="k must be an integer; got float"):
        bp.topk(X, 2.0, backend="numpy")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        bp.topk([1.0, 2.0], 1, backend="numpy")
    with pytest.raises(ValueError, match="x must not be empty"):
        bp.topk(torch.zeros(2, 0), 1, backend="numpy")


S, L = torch.zeros(2, 3), torch.randn(2, 3, 5)


@pytest.mark.parametrize("call, error, match", [
    (lambda: bp.beam_search_step(S, L, 0), ValueError, r"beam_width must be in \[1, 5\] \(the vocabulary size V\); got 0"),
    (lambda: bp.beam_search_step(S, L, 6), ValueError, r"beam_width must be in \[1, 5\].*got 6"),
    (lambda: bp.beam_search_step(S[0, :1], L[0, :1], 6), ValueError, r"beam_width must be in \[1, 5\]"),  # > W * V too
    (lambda: bp.beam_search_step(S, L, 2.5), TypeError, "beam_width must be an integer"),
    (lambda: bp.beam_search_step(S, L[None], 2), ValueError, r"logits must have shape \[W, V\] or \[B, W, V\]"),
    (lambda: bp.beam_search_step(S[0, 0], L[0, 0], 2), ValueError, "logits must have at least 2 dimension"),
    (lambda: bp.beam_search_step(S[:, :2], L, 2), ValueError, r"beam_scores must have shape logits.shape\[:-1\] = \(2, 3\)"),
    (lambda: bp.beam_search_step(S.tolist(), L, 2), TypeError, "beam_scores must be a torch.Tensor"),
    (lambda: bp.beam_search_step(S, L.double(), 2), TypeError, "logits must be float32"),
    (lambda: bp.beam_search_step(S[:, :0], L[:, :0], 2), ValueError, "logits must not be empty"),
    (lambda: bp.beam_search_step(S, L, 2, lengths=torch.ones(2, 2, dtype=torch.int64)), ValueError,
     r"lengths must have shape beam_scores.shape = \(2, 3\)"),
    (lambda: bp.beam_search_step(S, L, 2, lengths=torch.ones(2, 3)), TypeError, "lengths must have dtype torch.int64"),
    (lambda: bp.beam_search_step(S, L, 2, lengths=torch.zeros(2, 3, dtype=torch.int64)), ValueError, "lengths must be >= 1"),
    (lambda: bp.beam_search_step(S, L, 2, length_penalty=2.0), ValueError, "length_penalty needs lengths"),
    (lambda: bp.beam_search_step(S, L, 2, length_penalty=float("inf"), lengths=torch.ones(2, 3, dtype=torch.int64)),
     ValueError, "length_penalty must be finite"),
    (lambda: bp.beam_search_step(S, L, 2, length_penalty=-500.0, lengths=torch.full((2, 3), 9, dtype=torch.int64)),
     ValueError, "length_penalty must be such that lengths"),
])
def test_beam_search_step_rejects_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- per-row parameters ------------------------------------------------------------------

def test_per_row_temperature_equals_per_row_scalar_calls():
    """Spec 8.1/22.1: a per-row temperature is the same single multiply as a scalar one, bit for bit."""
    x = torch.randn(4, 2, 300, generator=torch.Generator().manual_seed(1)) * 4
    temps = torch.tensor([[0.7, 1.0], [1.3, 0.05], [2.5, 0.9], [1e-3, 3.0]])
    tokens = torch.randint(0, 300, (4, 2), generator=torch.Generator().manual_seed(2))
    per_row = {"token_logprobs": bp.token_logprobs(x, tokens, temperature=temps, backend="numpy")}
    for op in (bp.logsumexp, bp.log_softmax, bp.softmax, bp.entropy):
        per_row[op.__name__] = op(x, temperature=temps, backend="numpy")
    for i in range(4):
        for j in range(2):
            t = float(temps[i, j])
            assert _bits_equal(per_row["token_logprobs"][i, j],
                               bp.token_logprobs(x[i, j], tokens[i, j], temperature=t, backend="numpy"))
            for op in (bp.logsumexp, bp.log_softmax, bp.softmax, bp.entropy):
                assert _bits_equal(per_row[op.__name__][i, j], op(x[i, j], temperature=t, backend="numpy")), op


def test_temperature_that_rounds_to_float32_infinity_is_rejected():
    """1e39 is finite but RN32(1e39) = inf, whose reciprocal 0 would zero every logit."""
    with pytest.raises(ValueError, match="temperature must be in float32's normal range"):
        bp.log_softmax(X, temperature=1e39)


def test_per_row_temperature_rejects_bad_tensors():
    for wrong in (torch.ones(7), torch.tensor(1.0)):                # a tensor is one value per row
        with pytest.raises(ValueError, match=r"temperature must be a scalar or a tensor of shape \(3,\)"):
            bp.log_softmax(X, temperature=wrong)
    with pytest.raises(ValueError, match="temperature must be finite and > 0; got 0.0"):
        bp.token_logprobs(X, torch.zeros(3, dtype=torch.int64), temperature=torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(TypeError, match="temperature must be a floating-point tensor"):
        bp.softmax(X, temperature=torch.ones(3, dtype=torch.int64))


def _grid_logits(rows, vocab, seed):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, vocab)).astype(np.float32) * 3)


PER_ROW = {"temperature": torch.tensor([0.7, 1.0, 1.6, 0.3]), "top_k": torch.tensor([0, 3, 50, 1]),
           "top_p": torch.tensor([0.9, 1.0, 0.5, 1e-30]), "min_p": torch.tensor([0.0, 0.1, 0.0, 0.2])}


def test_filter_logits_per_row_equals_scalar_calls():
    x = _grid_logits(4, 64, 3)
    whole = bp.filter_logits(x, backend="numpy", **PER_ROW)
    for r in range(4):
        alone = bp.filter_logits(x[r:r + 1], backend="numpy", **{k: v[r].item() for k, v in PER_ROW.items()})
        assert _bits_equal(whole[r:r + 1], alone)


def test_bfloat16_and_float16_parameter_tensors_act_as_their_exact_float32_values():
    x = _grid_logits(4, 64, 3)
    params = {**PER_ROW, "top_p": torch.tensor([0.9, 1.0, 0.5, 1e-3])}          # float16 has no 1e-30
    floats = ("temperature", "top_p", "min_p")
    for dtype in (torch.bfloat16, torch.float16):
        narrow = {k: v.to(dtype) if k in floats else v.to(torch.int32) for k, v in params.items()}
        wide = {k: v.to(torch.float32) if k in floats else v.to(torch.int64) for k, v in narrow.items()}
        assert _bits_equal(bp.filter_logits(x, backend="numpy", **narrow), bp.filter_logits(x, backend="numpy", **wide))
        seeds, positions = torch.arange(4), torch.arange(4) * 3
        got = bp.sample(x, seeds, positions, backend="numpy", **narrow)
        want = bp.sample(x, seeds, positions, backend="numpy", **wide)
        assert torch.equal(got[0], want[0]) and _bits_equal(got[1], want[1])


def test_filter_logits_is_the_canonical_reference_on_rounded_parameters():
    x = _grid_logits(4, 64, 4)
    got = bp.filter_logits(x, backend="numpy", **PER_ROW)
    f32 = np.float32
    scale = np.array([f32(1) / f32(t) for t in PER_ROW["temperature"].tolist()], dtype=f32)
    want = canonical.filter_logits(x.numpy(), scale, PER_ROW["top_k"].numpy(), PER_ROW["top_p"].numpy(),
                                   PER_ROW["min_p"].numpy())
    assert _bits_equal(got, torch.from_numpy(want))


# -- sample: logprobs (spec 22.1) ----------------------------------------------------------

def _sample_case():
    x = _grid_logits(8, 40, 5)
    x[4] = float("-inf")                        # no distribution: token -1, logprob -inf
    x[5, 3] = float("nan")                      # NaN row: token -1, logprob NaN
    x[6, 7] = float("inf")                      # +inf row: token -1, logprob NaN
    params = {"temperature": torch.tensor([0.7, 0.0, 1.3, 1.0, 0.8, 0.9, 0.0, 2.0]),
              "top_k": torch.tensor([5, 0, 0, 3, 0, 0, 0, 40]), "top_p": torch.tensor([0.9, 0.5, 1.0, 0.8, 1.0, 1.0, 1.0, 0.3]),
              "min_p": torch.tensor([0.0, 0.1, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0])}
    return x, torch.arange(8) * 31 - 5, torch.arange(8) * 1000, params


@pytest.mark.parametrize("kind", ("processed", "scaled", "raw"))
def test_logprobs_are_the_stated_compositions(kind):
    x, seeds, positions, params = _sample_case()
    tokens, logprobs = bp.sample(x, seeds, positions, logprobs=kind, backend="numpy", **params)
    assert tokens[4] == tokens[5] == tokens[6] == -1
    assert (tokens[[0, 1, 2, 3, 7]] >= 0).all()
    assert logprobs[4] == float("-inf") and logprobs[5].isnan() and logprobs[6].isnan()
    ok = torch.tensor([0, 1, 2, 3, 7])
    greedy = params["temperature"][ok] == 0
    t = torch.where(greedy, 1.0, params["temperature"][ok])          # a greedy row uses T = 1
    if kind == "processed":                                            # a greedy row has no filters
        dist = bp.filter_logits(x[ok], temperature=t, top_k=params["top_k"][ok], top_p=params["top_p"][ok],
                                min_p=params["min_p"][ok], backend="numpy")
        dist = torch.where(greedy[:, None], x[ok], dist)
        want = bp.token_logprobs(dist, tokens[ok], backend="numpy")
    elif kind == "scaled":
        want = bp.token_logprobs(x[ok], tokens[ok], temperature=t, backend="numpy")
    else:
        want = bp.token_logprobs(x[ok], tokens[ok], backend="numpy")
    assert _bits_equal(logprobs[ok], want)
    assert torch.equal(tokens[1], x[1].argmax())                       # greedy: the first maximum


def test_greedy_rows_return_the_raw_logprob_under_every_kind():
    """Spec 22: filters are not applied to a greedy row, so "processed" is what it was chosen from: the raw logits."""
    x = _grid_logits(2, 40, 6)
    filters = {"top_k": 3, "top_p": 0.5, "min_p": 0.1}
    raw = bp.token_logprobs(x, x.argmax(dim=1), backend="numpy")
    filtered = bp.filter_logits(x, **filters, backend="numpy")
    assert (bp.token_logprobs(filtered, x.argmax(dim=1), backend="numpy") > raw).all()   # the filters remove mass
    for kind in ("processed", "scaled", "raw"):
        tokens, logprobs = bp.sample(x, SEEDS[:2], POS[:2], temperature=0.0, logprobs=kind, backend="numpy", **filters)
        assert torch.equal(tokens, x.argmax(dim=1)) and _bits_equal(logprobs, raw)


def test_a_logit_that_overflows_under_temperature_gives_token_minus_one_and_nan():
    x = torch.tensor([[3e38, 0.0], [1.0, 0.0]])
    tokens, logprobs = bp.sample(x, SEEDS[:2], POS[:2], temperature=0.5, logprobs="raw", backend="numpy")
    assert tokens[0] == -1 and logprobs[0].isnan()            # w = 6e38 rounds to +inf: no distribution
    assert tokens[1] >= 0 and logprobs[1] < 0


def test_native_filter_is_the_same_rule_away_from_ties():
    """The native backend (vLLM's sort + cumsum) keeps the canonical set on random rows: the baseline
    differs in arithmetic and noise, not in the rule."""
    x = _grid_logits(4, 500, 9)
    native = bp.filter_logits(x, backend="native", **PER_ROW)
    canonical_out = bp.filter_logits(x, backend="numpy", **PER_ROW)
    assert torch.equal(native > float("-inf"), canonical_out > float("-inf"))


def test_sampled_token_is_the_reference_race():
    x, seeds, positions, params = _sample_case()
    tokens, _ = bp.sample(x, seeds, positions, backend="numpy", **params)
    keep = torch.arange(8) != 1                                         # non-greedy rows, -1 rows included
    rows = keep & (params["temperature"] > 0)
    f = bp.filter_logits(x[rows], temperature=params["temperature"][rows], top_k=params["top_k"][rows],
                         top_p=params["top_p"][rows], min_p=params["min_p"][rows], backend="numpy").numpy()
    scores = f - canonical.race_noise(seeds[rows].numpy(), positions[rows].numpy(), x.shape[1])
    valid = ~np.isnan(f).any(axis=1) & (f != -np.inf).any(axis=1)
    want = np.where(valid, np.argmax(np.where(np.isnan(scores), -np.inf, scores), axis=1), -1)
    assert tokens[rows].tolist() == want.tolist()


def test_sample_depends_on_seed_and_position_only():
    x = _grid_logits(1, 1000, 6).repeat(64, 1)
    seeds = torch.tensor([7] * 32 + [8] * 32)
    positions = torch.tensor(list(range(32)) * 2)
    tokens, _ = bp.sample(x, seeds, positions, temperature=2.0, backend="numpy")
    again, _ = bp.sample(x.flip(0), seeds.flip(0), positions.flip(0), temperature=2.0, backend="numpy")
    assert torch.equal(tokens, again.flip(0))
    assert len(set(tokens.tolist())) > 20                                # the noise does vary with (seed, position)


# -- topk and the beam step (spec 21, 23) ------------------------------------------------------

def test_topk_keeps_leading_dimensions_and_order():
    x = torch.tensor([[[1.0, 3.0, 3.0, -0.0, 0.0, float("nan"), float("-inf")]]])
    values, indices = bp.topk(x, 7, backend="numpy")
    assert values.shape == indices.shape == (1, 1, 7)
    assert indices.tolist() == [[[1, 2, 0, 3, 4, 6, 5]]]


def _beam_case(batch, width, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(batch, width, generator=g) * 5, torch.randn(batch, width, vocab, generator=g) * 3


def test_beam_step_is_log_softmax_plus_score_then_topk():
    scores, logits = _beam_case(2, 4, 50, 7)
    logits[1, 2, :10] = logits[1, 2, 10]                                 # ties across the flat order
    new, parents, tokens = bp.beam_search_step(scores, logits, 6, backend="numpy")
    lp = canonical.log_softmax(logits.reshape(-1, 50).numpy(), None, np.ones(8, dtype=np.float32)).reshape(2, 4, 50)
    cand = (scores.numpy()[:, :, None] + lp).reshape(2, -1)
    for b in range(2):
        order = sorted(range(200), key=lambda i: (-cand[b, i], i))[:6]
        assert (parents[b] * 50 + tokens[b]).tolist() == order
        assert _bits_equal(new[b], torch.from_numpy(cand[b, order]))


@pytest.mark.parametrize("backend", implementing("topk"))
def test_beam_step_request_alone_equals_in_batch(backend):
    scores, logits = _beam_case(5, 3, 37, 8)
    batched = bp.beam_search_step(scores, logits, 4, backend=backend)
    for b in (0, 3):
        alone = bp.beam_search_step(scores[b], logits[b], 4, backend=backend)
        for got, want in zip(alone, batched):
            assert torch.equal(canonical_bits(got) if got.is_floating_point() else got,
                               canonical_bits(want[b]) if want.is_floating_point() else want[b])


@pytest.mark.parametrize("backend", implementing("topk")[1:])
@pytest.mark.parametrize("shape", ((4, 1000), (3, 4, 1000)))
def test_beam_step_bits_across_backends(backend, shape):
    scores, logits = _beam_case(3, 4, 1000, 9)
    scores, logits = scores[: shape[0]] if len(shape) == 3 else scores[0], logits if len(shape) == 3 else logits[0]
    lengths = torch.arange(1, scores.numel() + 1).reshape(scores.shape)
    for kwargs in ({}, {"length_penalty": 1.3, "lengths": lengths}):
        want = bp.beam_search_step(scores, logits, 5, backend="numpy", **kwargs)
        got = bp.beam_search_step(scores, logits, 5, backend=backend, **kwargs)
        assert _bits_equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_beam_step_length_penalty_ranks_by_normalised_score():
    scores = torch.tensor([-1.0, -1.5])
    logits = torch.tensor([[0.0, -1.0, -8.0], [0.0, -2.0, -8.0]])
    lengths = torch.tensor([2, 6])
    new, parents, tokens = bp.beam_search_step(scores, logits, 2, length_penalty=1.0, lengths=lengths, backend="numpy")
    cand = scores[:, None] + bp.log_softmax(logits, backend="numpy")
    factor = torch.tensor([np.float32(0.5), np.float32(1 / 6)])
    flat = sorted(range(6), key=lambda i: (-float(cand.flatten()[i] * factor[i // 3]), i))[:2]
    assert (parents * 3 + tokens).tolist() == flat
    assert parents.tolist() == [1, 1]                   # the longer beam wins once divided by its length
    assert _bits_equal(new, cand.flatten()[flat])       # the scores returned are the running sums
    plain = bp.beam_search_step(scores, logits, 2, backend="numpy")
    assert (plain[1] * 3 + plain[2]).tolist() == [0, 3]  # without lengths the raw sums rank
