"""bitparity.compat.verl against float64 renderings of verl 0.10's semantics (docs/conventions.md)."""

import numpy as np
import pytest
import torch

from bitparity.compat import verl

from .batches import masked_whiten64, padded


def _gae64(r, v, m, gamma, lam):
    """verl's masked GAE: masked positions carry the next value and advantage; returns from the raw advantages."""
    adv, next_v, last = np.zeros_like(r), np.zeros(r.shape[0]), np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        g = (r[:, t] + gamma * next_v - v[:, t]) + gamma * lam * last
        next_v = np.where(m[:, t], v[:, t], next_v)
        last = np.where(m[:, t], g, last)
        adv[:, t] = last
    return adv, adv + v


def _close(got, want, where=None):
    got, want = got.double().numpy(), np.asarray(want, dtype=np.float64)
    if where is not None:
        got, want = got[where], want[where]
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * max(1.0, np.abs(want).max()))


def test_gae_advantages_whitened_and_returns_from_the_raw_advantages():
    _, _, _, r, v, m = padded()
    adv, ret = verl.compute_gae_advantage_return(r, v, m, 0.99, 0.95)
    adv64, ret64 = _gae64(r.double().numpy(), v.double().numpy(), m.numpy(), 0.99, 0.95)
    _close(ret, ret64)
    _close(adv, masked_whiten64(adv64, m.numpy()), m.numpy())     # outside the mask verl keeps (x - mean) / std


def _agg64(loss, m, mode, dp_size=1, global_batch_size=None, loss_scale_factor=None):
    counted = np.where(m, loss, 0.0)
    if mode == "token-mean":
        return counted.sum() / m.sum()
    if mode == "token-sum":
        return counted.sum() * dp_size
    per_seq = counted.sum(1) / (np.maximum(m.sum(1), 1) if mode == "seq-mean-token-mean" else 1)
    non_empty = m.any(1)
    out = per_seq[non_empty].sum() / (non_empty.sum() if global_batch_size is None else global_batch_size) * dp_size
    return out / (m.shape[1] if loss_scale_factor is None else loss_scale_factor) if mode.endswith("-norm") else out


@pytest.mark.parametrize("mode", verl.AGG_MODES)
def test_agg_loss_every_mode_excludes_empty_sequences(mode):
    _, _, loss, _, _, m = padded()
    _close(verl.agg_loss(loss, m, mode), _agg64(loss.double().numpy(), m.numpy(), mode))
    _close(verl.agg_loss(loss, m.float(), mode, dp_size=2, global_batch_size=16, batch_num_tokens=300,
                         loss_scale_factor=64),
           _agg64(loss.double().numpy(), m.numpy(), mode, 2, 16, 64) if mode.startswith("seq")
           else (np.where(m.numpy(), loss.double().numpy(), 0).sum() * (2 / 300 if mode == "token-mean" else 2)))


def test_seq_mean_differs_from_the_batch_mean_by_the_empty_rows():
    """Two of eight sequences empty: the mean over the six non-empty ones is 8/6 of the old batch mean."""
    _, _, loss, _, _, m = padded()
    per_seq = np.where(m.numpy(), loss.double().numpy(), 0).sum(1)
    assert abs(float(verl.agg_loss(loss, m, "seq-mean-token-sum")) - per_seq.sum() / 6) < 1e-4 * abs(per_seq).max()


def test_agg_loss_refuses_global_modes_without_their_counts():
    _, _, loss, _, _, m = padded()
    with pytest.raises(ValueError, match="global_batch_size must be given when dp_size > 1"):
        verl.agg_loss(loss, m, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        verl.agg_loss(loss, m, "seq-sum")


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalty_names(name):
    logp, old, *_ = padded()
    ref = old * 30                                        # large log-ratios reach low_var_kl's clamps
    d = (logp - ref).double().numpy()
    x = np.clip(-d, -20, 20)
    want = {"kl": d, "k1": d, "abs": np.abs(d), "mse": d * d / 2, "k2": d * d / 2,
            "low_var_kl": np.clip(np.exp(x) - x - 1, -10, 10), "k3": np.clip(np.exp(x) - x - 1, -10, 10)}[name]
    np.testing.assert_allclose(verl.kl_penalty(logp, ref, name).double().numpy(), want, rtol=3e-6, atol=1e-6)


def test_straight_through_kl_has_the_value_of_its_estimator_and_the_gradient_of_k2():
    logp, old, *_ = padded()
    x = logp.clone().requires_grad_()
    out = verl.kl_penalty(x, old, "low_var_kl+")
    assert torch.equal(out.detach(), verl.kl_penalty(logp, old, "low_var_kl"))
    out.sum().backward()
    k2 = logp.clone().requires_grad_()
    verl.kl_penalty(k2, old, "k2").sum().backward()
    assert torch.equal(x.grad, k2.grad)
    with pytest.raises(NotImplementedError, match="kl_penalty must be one of"):
        verl.kl_penalty(logp, old, "full")


def test_policy_loss_tuple():
    logp, old, adv, _, _, m = padded()
    lp = logp.double().numpy()
    nkl = np.clip(lp - old.double().numpy(), -20, 20)
    r, a, mm = np.exp(nkl), adv.double().numpy(), m.numpy()
    l1, l2 = -a * r, -a * np.clip(r, 0.8, 1.2)
    lc = np.maximum(l1, l2)
    loss = np.where(a < 0, np.minimum(-a * 3.0, lc), lc)
    got = verl.compute_policy_loss(old, logp, adv, m, cliprange=0.2)
    want = (loss[mm].mean(), (l2 > l1)[mm].mean(), (-nkl)[mm].mean(), ((lc > -a * 3.0) & (a < 0))[mm].mean())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(float(g), w, rtol=1e-5, atol=1e-7)
