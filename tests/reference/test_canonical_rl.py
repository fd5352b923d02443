"""The RL operators of reference/canonical.py against float64, with the bounds docs/spec.md states."""

import numpy as np
import pytest

from bitparity.compare import cases, metrics
from bitparity.reference import canonical, float64
from tests.reference.test_canonical import sum_depth

F32 = np.float32
U = 2.0 ** -24


def _rl(b, t, seed=0):
    return {k: v.numpy() for k, v in cases.make_rl_batch(b, t, seed).items()}


def gae_error_bound(rewards, values, mask, gamma, gamma_lambda, adv64):
    """First-order running bound on |adv32 - adv64| (spec 14.3): each step adds u * (|g*next_v| + |r + g*next_v|
    + |delta| + 2 |gl*last| + |cand|) and carries gl times the error of the step after it; the 2 counts
    gl's own rounding."""
    r, v = rewards.astype(np.float64), values.astype(np.float64)
    b, t = r.shape
    bound = np.zeros((b, t))
    next_v, last, err = np.zeros(b), np.zeros(b), np.zeros(b)
    for s in range(t - 1, -1, -1):
        gn = gamma * next_v
        delta = (r[:, s] + gn) - v[:, s]
        gll = gamma_lambda * last
        cand = delta + gll
        step = U * (np.abs(gn) + np.abs(r[:, s] + gn) + np.abs(delta) + 2 * np.abs(gll) + np.abs(cand))
        m = mask[:, s]
        err = np.where(m, step + gamma_lambda * err, err)
        next_v, last = np.where(m, v[:, s], next_v), np.where(m, cand, last)
        bound[:, s] = err
    return bound


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.5), (0.0, 1.0), (1.0, 0.0)])
def test_gae_within_its_running_error_bound(gamma, lam):
    d = _rl(16, 8192, seed=1)
    g32, gl32 = F32(gamma), F32(gamma) * F32(lam)
    boot = np.zeros(16, dtype=F32)
    adv, ret = canonical.gae(d["rewards"], d["values"], d["mask"], boot, float(g32), float(gl32), "carry")
    adv64, ret64 = float64.gae(d["rewards"], d["values"], d["mask"], boot, float(g32), float(g32) * float(F32(lam)), "carry")
    bound = gae_error_bound(d["rewards"], d["values"], d["mask"], float(g32), float(g32) * float(F32(lam)), adv64)
    err = np.abs(adv.astype(np.float64) - adv64)
    assert (err <= bound * 1.01 + 1e-30).all(), float((err / np.maximum(bound, 1e-30)).max())
    # returns add one rounding to the advantage
    assert (np.abs(ret - ret64) <= bound * 1.01 + np.abs(ret64) * U * 1.01 + 1e-30).all()


def test_gae_error_at_the_longest_horizon_is_small():
    """The figure docs/spec.md reports: T = 8192, gamma = lambda = 1, one sequence of unit-scale rewards."""
    d = _rl(4, 8192, seed=2)
    boot = np.zeros(4, dtype=F32)
    adv, _ = canonical.gae(d["rewards"], d["values"], np.ones_like(d["mask"]), boot, 1.0, 1.0, "carry")
    adv64, _ = float64.gae(d["rewards"], d["values"], np.ones_like(d["mask"]), boot, 1.0, 1.0, "carry")
    assert np.abs(adv - adv64).max() <= 2e-3


@pytest.mark.parametrize("mag", [1e-6, 1e-4, 1e-2, 1.0, 10.0])
@pytest.mark.parametrize("kind,bound", [("k1", 0.5), ("abs", 0.5), ("k2", 1.5), ("k3", 3.0)])
def test_kl_estimators_accuracy(mag, kind, bound):
    rng = np.random.default_rng(int(mag * 1e6) % 1000)
    logp = (-np.abs(rng.standard_normal(200_000)) * 3).astype(F32)
    d = rng.uniform(0.5, 1.0, logp.size) * mag * np.where(rng.random(logp.size) < 0.5, -1.0, 1.0)
    ref = (logp.astype(np.float64) + d).astype(F32)
    got = canonical.kl_penalty(logp, ref, kind, None, None)
    want = float64.kl_penalty(logp, ref, kind, None, None)
    assert metrics.max_or_zero(metrics.ulp_error(got.astype(np.float64), want)) <= bound


def test_k3_has_no_cancellation_for_tiny_differences():
    d = np.array([1e-7, -1e-7, 1e-18, -3e-4], dtype=F32)       # d*d stays normal
    got = canonical.kl_penalty(np.zeros_like(d), d, "k3", None, None)
    assert np.all(got > 0)
    np.testing.assert_allclose(got, d.astype(np.float64) ** 2 / 2 * (1 + d / 3), rtol=3e-7)


def test_masked_mean_and_whiten_accuracy():
    d = _rl(64, 2048, seed=3)
    x, m = d["advantages"].reshape(1, -1) * F32(3) + F32(1), d["mask"].reshape(1, -1)
    err = metrics.ulp_error(canonical.masked_mean(x, m).astype(np.float64), float64.masked_mean(x, m),
                            np.abs(np.where(m, x, 0)).sum() / m.sum())
    assert metrics.max_or_zero(err) <= sum_depth(x.size) + 1.5
    for unbiased in (True, False):
        for shift in (True, False):
            for eps_mode, scale in (("add", F32(1)), ("clamp", F32(1)), ("clamp", F32(1e-5))):
                got = canonical.masked_whiten(x * scale, m, shift, unbiased, 1e-8, eps_mode)
                want = float64.masked_whiten(x * scale, m, shift, unbiased, 1e-8, eps_mode)
                assert metrics.max_or_zero(metrics.ulp_error(got.astype(np.float64), want, 1.0)) <= 5.0


def test_rsqrt_within_two_ulps():
    y = np.exp(np.random.default_rng(4).uniform(-87, 88, 1_000_000)).astype(F32)
    err = metrics.ulp_error(canonical.rsqrt(y).astype(np.float64), 1 / np.sqrt(y.astype(np.float64)))
    assert metrics.max_or_zero(err) <= 2.0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_loss_accuracy(agg, dual_clip):
    d = _rl(32, 1024, seed=5)
    low, high = float(F32(1) - F32(0.2)), float(F32(1) + F32(0.28))
    args = (d["logp"], d["old_logp"], d["advantages"], d["mask"], low, high, dual_clip, 20.0, agg)
    loss, frac = canonical.ppo_policy_loss(*args)
    loss64, frac64 = float64.ppo_policy_loss(*args)
    tokens, _ = canonical.ppo_token_losses(*args[:3], low, high, dual_clip, 20.0)
    scale = np.abs(np.where(d["mask"], tokens, 0)).sum() / d["mask"].sum()
    if agg != "token-mean":
        scale = scale * d["mask"].shape[1]
    # each token loss is within 3 ulps (exp, two products); the sums add depth ulps of the scale
    bound = (sum_depth(d["mask"].size) + 4) * metrics.ulp32(scale) + 2 * metrics.ulp32(loss64)
    assert abs(float(loss) - loss64) <= bound
    assert abs(float(frac) - frac64) <= 2 * metrics.ulp32(frac64)


def test_all_masked_inputs_give_defined_results():
    x = np.array([[1.0, np.nan, 3.0]], dtype=F32)
    m = np.zeros((1, 3), dtype=bool)
    assert canonical.masked_mean(x, m).view(np.int32)[0] == 0           # +0.0
    assert np.array_equal(canonical.masked_whiten(x, m, True, True, 1e-8, "add"), np.zeros((1, 3), dtype=F32))
    loss, frac = canonical.ppo_policy_loss(x, x, x, m, 0.8, 1.2, None, 20.0, "token-mean")
    assert float(loss) == 0.0 and float(frac) == 0.0
