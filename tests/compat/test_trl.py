"""bitparity.compat.trl against float64 renderings of TRL 1.10's PPO advantages and masked statistics."""

import numpy as np
import pytest
import torch

from bitparity.compat import trl

from .batches import masked_whiten64


def _trl_batch(b=6, t=30, seed=1):
    """TRL's layout: right-padded responses; sequence_lengths is the last kept index (-1 for an empty one)."""
    rng = np.random.default_rng(seed)
    seq_len = rng.integers(-1, t - 1, b)
    seq_len[0], seq_len[1] = -1, t - 1                           # an empty response and a full one
    idx = np.arange(t)[None, :]
    padding_mask = torch.from_numpy(idx > seq_len[:, None])
    padding_mask_p1 = torch.from_numpy(idx > seq_len[:, None] + 1)
    rewards = torch.from_numpy(rng.standard_normal((b, t)).astype(np.float32)).masked_fill(padding_mask_p1, 0.0)
    values = torch.from_numpy(rng.standard_normal((b, t)).astype(np.float32))
    return rewards, values, padding_mask, padding_mask_p1


def _advantages64(r, v, padding_mask, padding_mask_p1, gamma, lam):
    v = np.where(padding_mask_p1, 0.0, v)
    adv, last = np.zeros_like(r), np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        next_v = v[:, t + 1] if t + 1 < r.shape[1] else 0.0
        last = (r[:, t] + gamma * next_v - v[:, t]) + gamma * lam * last
        adv[:, t] = last
    returns = adv + v
    return np.where(padding_mask, 0.0, masked_whiten64(adv, ~padding_mask)), returns


def test_compute_advantages_reproduces_the_trainer():
    r, v, pm, pm1 = _trl_batch()
    adv, ret = trl.compute_advantages(r, v, pm, pm1, 1.0, 0.95)
    want_adv, want_ret = _advantages64(r.double().numpy(), v.double().numpy(), pm.numpy(), pm1.numpy(), 1.0, 0.95)
    for got, want in ((adv, want_adv), (ret, want_ret)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=4e-6 * np.abs(want).max())


def test_the_ordinary_response_mask_is_not_trls_layout():
    """With ~padding_mask in place of ~padding_mask_p1 the advantages come out visibly different."""
    r, v, pm, pm1 = _trl_batch()
    right, _ = trl.compute_advantages(r, v, pm, pm1, 1.0, 0.95)
    wrong, _ = trl.compute_advantages(r, v, pm, pm, 1.0, 0.95)
    assert (right - wrong).abs().max() > 1e-2 * right.abs().max()


def test_masked_statistics():
    r, v, pm, _ = _trl_batch()
    m = ~pm
    x = v.double().numpy()[m.numpy()]
    np.testing.assert_allclose(float(trl.masked_mean(v, m)), x.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(trl.masked_var(v, m)), x.var(ddof=1), rtol=1e-5)
    np.testing.assert_allclose(float(trl.masked_var(v, m, unbiased=False)), x.var(), rtol=1e-5)
    with pytest.raises(ValueError, match="mask has no True entry"):
        trl.masked_var(v, torch.zeros_like(m))


def test_selective_log_softmax_one_or_k_indices():
    logits = torch.randn(3, 5, 100, generator=torch.Generator().manual_seed(0))
    index = torch.randint(0, 100, (3, 5, 2), generator=torch.Generator().manual_seed(1))
    want = torch.log_softmax(logits.double(), -1).gather(-1, index)
    np.testing.assert_allclose(trl.selective_log_softmax(logits, index).double(), want, rtol=0, atol=2e-6)
    np.testing.assert_allclose(trl.selective_log_softmax(logits, index[..., 0]).double(), want[..., 0], atol=2e-6)
