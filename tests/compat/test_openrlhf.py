"""bitparity.compat.openrlhf against float64 renderings of OpenRLHF 0.11's semantics."""

import numpy as np
import pytest
import torch

from bitparity.compat import openrlhf

from .batches import masked_whiten64, padded


@pytest.mark.parametrize("kind", openrlhf.KL_ESTIMATORS)
def test_approx_kl_every_estimator_clamped(kind):
    logp, old, *_ = padded()
    base = old * 25                                       # large ratios reach the +-10 clamp
    d = (logp - base).double().numpy()
    want = np.clip({"k1": d, "k2": d * d / 2, "k3": np.exp(-d) - 1 + d}[kind], -10, 10)
    np.testing.assert_allclose(openrlhf.compute_approx_kl(logp, base, kind).double(), want, rtol=3e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 1e-4])
def test_normalize_advantages_biased_and_clamped(scale):
    """At var = 5e-9 rsqrt(max(var, 1e-8)) and rsqrt(var + 1e-8) differ by 18%: the clamped form is OpenRLHF's."""
    _, _, adv, _, _, m = padded()
    adv = adv * scale
    want = masked_whiten64(adv.double().numpy(), m.numpy(), unbiased=False, clamp=True)
    got = openrlhf.normalize_advantages(adv, m).double().numpy()
    np.testing.assert_allclose(got[m.numpy()], want[m.numpy()], rtol=0, atol=4e-6 * np.abs(want).max())


def test_gae_runs_through_masked_positions():
    _, _, _, r, v, m = padded()
    rr, vv = (t.double().numpy() * m.numpy() for t in (r, v))
    adv, last = np.zeros_like(rr), np.zeros(rr.shape[0])
    for t in reversed(range(rr.shape[1])):
        next_v = vv[:, t + 1] if t + 1 < rr.shape[1] else 0.0
        last = (rr[:, t] + next_v - vv[:, t]) + 0.95 * last
        adv[:, t] = last
    got_adv, got_ret = openrlhf.get_advantages_and_returns(v, r, m, 1.0, 0.95)
    mm = m.numpy()
    np.testing.assert_allclose(got_adv.double().numpy()[mm], adv[mm], rtol=0, atol=4e-6 * np.abs(adv).max())
    np.testing.assert_allclose(got_ret.double().numpy()[mm], (adv + vv)[mm], rtol=0, atol=4e-6 * np.abs(adv).max())


@pytest.mark.parametrize("token_level", [True, False])
def test_policy_loss(token_level):
    logp, old, adv, _, _, m = padded()
    r = np.exp(np.clip((logp - old).double().numpy(), -20, 20))
    a, mm = adv.double().numpy(), m.numpy()
    s1, s2 = r * a, np.clip(r, 0.8, 1.2) * a
    loss = np.where(a < 0, np.minimum(-np.minimum(s1, s2), -3.0 * a), -np.minimum(s1, s2))
    if token_level:
        want = loss[mm].mean()
    else:
        keep = mm.any(1)
        want = (np.where(mm, loss, 0).sum(1)[keep] / mm.sum(1)[keep]).mean()
    got, clip_ratio, ppo_kl, vllm_kl = openrlhf.PolicyLoss(dual_clip=3.0, token_level_loss=token_level)(
        logp, old, adv, m)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(float(clip_ratio), (s2 < s1)[mm].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(ppo_kl), (old - logp).double().numpy()[mm].mean(), rtol=1e-5, atol=1e-7)
    assert vllm_kl is None
