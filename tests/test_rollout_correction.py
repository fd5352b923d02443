"""rollout_correction and the mismatch metrics (spec 27): the same bits on every backend, the float64 meaning,
and the special values."""

import functools
import math

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.metrics import mismatch

from .backends.test_rl_bit_identity import assert_same_bits

SETTINGS = [dict(level=level, mode=mode, threshold=2.0, threshold_low=low, log_ratio_clamp=clamp)
            for level in bp.ops.ROLLOUT_LEVELS for mode in bp.ops.ROLLOUT_MODES
            for low, clamp in ((None, None), (0.5, 20.0))]


@functools.cache
def batch(b=6, t=50):
    """Padded right and left, an interior hole, an empty sequence, tokens the rollout could not sample."""
    g = torch.Generator().manual_seed(b * t)
    old = -torch.rand(b, t, generator=g) * 3
    rollout = old + torch.randn(b, t, generator=g) * 0.4
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 40:] = False                                      # right padding
    mask[1, :7] = False                                       # left padding
    mask[2, 10:15] = False                                    # an interior hole (an observation span)
    mask[3] = False                                           # an empty sequence
    rollout[4, 3] = -math.inf                                 # the rollout could not sample it
    old[4, 5] = -math.inf
    return old, rollout, mask


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_same_bits_on_every_backend(backend, setting):
    old, rollout, mask = batch()
    assert_same_bits(bp.rollout_correction(old, rollout, mask, backend=backend, **setting)[0],
                     bp.rollout_correction(old, rollout, mask, backend="numpy", **setting)[0])
    keep = [bp.rollout_correction(old, rollout, mask, backend=be, **setting)[1] for be in (backend, "numpy")]
    assert torch.equal(*keep)


def _meaning(old, rollout, mask, level, mode, threshold, threshold_low, log_ratio_clamp):
    """float64, from the binary32 log-ratio l = RN32(old - rollout), whose one rounding every backend shares."""
    l = (old - rollout).double().numpy()
    if log_ratio_clamp is not None:
        l = np.clip(l, -log_ratio_clamp, log_ratio_clamp)
    m = mask.numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        if level == "token":
            rho = np.exp(l)
        else:
            s = np.where(m, l, 0.0).sum(1, keepdims=True)
            if level == "geometric":
                s = s / np.maximum(m.sum(1, keepdims=True), 1)
            rho = np.broadcast_to(np.exp(s), l.shape)
        low = -np.inf if threshold_low is None else threshold_low
        if mode == "truncate":
            w, keep = np.clip(rho, low, threshold), m
        else:
            keep = m & (rho >= low) & (rho <= threshold)
            w = np.where(keep, rho, 0.0)
    return np.where(m, w, 0.0), keep


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_float64_meaning(setting):
    old, rollout, mask = batch()
    w, keep = bp.rollout_correction(old, rollout, mask, backend="numpy", **setting)
    want_w, want_keep = _meaning(old, rollout, mask, **setting)
    # A sequence's sum of 50 log-ratios has depth-many roundings; exp turns their absolute error into relative.
    np.testing.assert_allclose(w.numpy(), want_w, rtol=2e-6 if setting["level"] == "token" else 2e-5)
    near = np.isclose(bp.rollout_correction(old, rollout, mask, backend="numpy",
                                            **{**setting, "mode": "truncate"})[0].numpy(),
                      [setting["threshold"]], rtol=1e-5)
    assert np.array_equal(keep.numpy() | near, want_keep | near)     # a ratio within rounding of a bound may go either way


def test_special_values():
    old, rollout, mask = batch()
    w, keep = bp.rollout_correction(old, rollout, mask, mode="truncate", threshold=2.0, threshold_low=0.5,
                                    backend="numpy")
    assert w[4, 3] == 2.0 and w[4, 5] == 0.5                  # rollout -inf: truncated to U; old -inf: raised to L
    assert not keep[3].any() and (w[3] == 0).all()             # an empty sequence keeps nothing
    w, keep = bp.rollout_correction(old, rollout, mask, mode="mask", threshold=2.0, threshold_low=0.5,
                                    backend="numpy")
    assert not keep[4, 3] and not keep[4, 5] and w[4, 3] == 0
    nan = old.clone()
    nan[0, 0] = math.nan
    w, keep = bp.rollout_correction(nan, rollout, mask, mode="truncate", backend="numpy")
    assert math.isnan(w[0, 0]) and keep[0, 0]
    w, keep = bp.rollout_correction(nan, rollout, mask, mode="mask", backend="numpy")
    assert w[0, 0] == 0 and not keep[0, 0]


def test_arguments_are_checked_by_name():
    old, rollout, mask = batch()
    with pytest.raises(ValueError, match="level must be one of token, sequence, geometric"):
        bp.rollout_correction(old, rollout, mask, level="seq")
    with pytest.raises(ValueError, match="threshold_low must be <= threshold"):
        bp.rollout_correction(old, rollout, mask, threshold=2.0, threshold_low=3.0)
    with pytest.raises(ValueError, match="threshold must be finite"):
        bp.rollout_correction(old, rollout, mask, threshold=-1.0)
    with pytest.raises(ValueError, match="rollout_correction is not differentiable: old_logp requires grad"):
        bp.rollout_correction(old.clone().requires_grad_(), rollout, mask)


def test_mismatch_metrics():
    old, rollout, mask = batch()
    finite = torch.where(torch.isinf(rollout) | torch.isinf(old), -1.0, rollout)
    old = torch.where(torch.isinf(old), -1.0, old)
    same = mismatch(old, old, mask, backend="numpy")
    assert same["max_abs_logp_diff"] == 0 and same["frac_logp_differ"] == 0 and same["mean_k3_kl"] == 0
    got = mismatch(old, finite, mask, correction={"mode": "mask", "threshold": 1.5, "threshold_low": 0.7},
                   backend="numpy")
    m = mask.numpy()
    d = (old - finite).double().numpy()
    assert got["max_abs_logp_diff"] == np.float32(np.abs(np.where(m, d, 0)).max())
    np.testing.assert_allclose(got["mean_k3_kl"], (np.exp(d) - 1 - d)[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(got["frac_logp_differ"], (d != 0)[m].mean(), rtol=1e-6)
    np.testing.assert_allclose(got["frac_rejected"], ((np.exp(d) > 1.5) | (np.exp(d) < 0.7))[m].mean(), rtol=1e-6)


def test_mismatch_metrics_have_the_same_bits_on_every_backend(backend):
    old, rollout, mask = batch()
    rollout = torch.where(torch.isinf(rollout), old, rollout)
    a = mismatch(old, rollout, mask, correction={"level": "geometric", "mode": "mask"}, backend=backend)
    b = mismatch(old, rollout, mask, correction={"level": "geometric", "mode": "mask"}, backend="numpy")
    for key in a:
        assert_same_bits(a[key], b[key])
