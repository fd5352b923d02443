"""bitparity.compat.openrlhf against float64 renderings of OpenRLHF 0.11's semantics."""

import numpy as np
import pytest
import torch

import bitparity
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


def _ppo_token_loss64(logp, old, adv, dual_clip=None):
    """OpenRLHF's per-token PPO loss in float64: log-ratio clamped to +-20, clip [0.8, 1.2], dual clip."""
    r = np.exp(np.clip((logp - old).double().numpy(), -20, 20))
    a = adv.double().numpy()
    loss = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
    return loss if dual_clip is None else np.where(a < 0, np.minimum(loss, -dual_clip * a), loss)


def test_policy_loss_takes_openrlhf_011_arguments():
    """The trainer's call (openrlhf/trainer/ray/ppo_actor.py): every constructor and forward keyword."""
    logp, old, adv, _, _, m = padded()
    fn = openrlhf.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                             policy_loss_type="ppo", enable_vllm_is_correction=False,
                             vllm_is_truncated_threshold=None, vllm_is_correction_type="tis")
    out = fn(logp, old, adv, action_mask=m, rollout_log_probs=None, dp_size=1,
             batch_num_tokens=torch.tensor(float(m.sum())), global_batch_size=torch.tensor(6.0))
    assert len(out) == 4 and out[3] is None
    # dp_size 1 and the local count: the global normalisation is the plain token mean, bit for bit.
    assert torch.equal(out[0], fn(logp, old, adv, m)[0])


@pytest.mark.parametrize("token_level", [True, False])
def test_policy_loss_global_normalisation(token_level):
    """OpenRLHF: token mode sum(loss * mask) / batch_num_tokens * dp_size, sequence mode the sum of non-empty
    sequences' token means / global_batch_size * dp_size; the other count is unused. Bound: the canonical mean
    (rtol 1e-5, as test_policy_loss) and two float32 roundings more."""
    logp, old, adv, _, _, m = padded()
    loss, mm = _ppo_token_loss64(logp, old, adv, dual_clip=3.0), m.numpy()
    dp, total = 4, 777.0
    if token_level:
        want = np.where(mm, loss, 0).sum() / total * dp
        kwargs = {"batch_num_tokens": torch.tensor(total), "global_batch_size": torch.tensor(1.0)}
    else:
        keep = mm.any(1)
        want = (np.where(mm, loss, 0).sum(1)[keep] / mm.sum(1)[keep]).sum() / total * dp
        kwargs = {"batch_num_tokens": torch.tensor(1.0), "global_batch_size": total}
    fn = openrlhf.PolicyLoss(dual_clip=3.0, token_level_loss=token_level)
    bits = []
    for name in ("numpy", "cpu", "ascend"):
        with bitparity.use_backend(name):
            lp = logp.clone().requires_grad_()
            got = fn(lp, old, adv, m, dp_size=dp, **kwargs)[0]
            got.backward()
        np.testing.assert_allclose(float(got.detach()), want, rtol=1e-5 + 2 * 2.0 ** -24)
        bits.append((got.detach().view(torch.int32), lp.grad.view(torch.int32)))
    for got_bits, grad_bits in bits[1:]:
        assert torch.equal(got_bits, bits[0][0]) and torch.equal(grad_bits, bits[0][1])


def test_policy_loss_empty_local_batch_with_global_count():
    """No counted token on this rank: OpenRLHF's masked sum is 0, so the loss is 0 (not the empty-mask NaN)."""
    logp, old, adv, *_ = padded()
    m = torch.zeros(logp.shape, dtype=torch.bool)
    for token_level in (True, False):
        got = openrlhf.PolicyLoss(token_level_loss=token_level)(logp, old, adv, m, dp_size=2, batch_num_tokens=10.0,
                                                                global_batch_size=3.0)[0]
        assert float(got) == 0.0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"policy_loss_type": "gspo"}, NotImplementedError, "policy_loss_type='gspo'"),
    ({"policy_loss_type": "grpo"}, ValueError, "policy_loss_type must be one of"),
    ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.5, 5.0]}, NotImplementedError,
     "enable_vllm_is_correction=True .*'tis'"),
    ({"enable_vllm_is_correction": True, "vllm_is_correction_type": "icepop"}, NotImplementedError,
     "enable_vllm_is_correction=True .*'icepop'"),
    ({"vllm_is_correction_type": "bogus"}, ValueError, "vllm_is_correction_type must be one of"),
])
def test_policy_loss_refuses_options_it_cannot_express(kwargs, error, match):
    with pytest.raises(error, match=match):
        openrlhf.PolicyLoss(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"dp_size": 0}, "dp_size must be an int >= 1"),
    ({"batch_num_tokens": 0.0}, "batch_num_tokens must be finite and > 0"),
])
def test_policy_loss_rejects_bad_counts(kwargs, match):
    logp, old, adv, _, _, m = padded()
    with pytest.raises(ValueError, match=match):
        openrlhf.PolicyLoss()(logp, old, adv, m, **kwargs)
