"""Padded RL batches for the compat tests: right and left padding, an interior hole, empty sequences."""

import numpy as np
import torch


def padded(b=8, t=40, seed=0):
    """(logp, old_logp, advantages, rewards, values, mask) with two empty sequences of eight."""
    rng = np.random.default_rng(seed)
    f = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    logp = -torch.from_numpy(rng.random((b, t)).astype(np.float32)) * 2
    old = logp + f(b, t) * 0.2
    mask = torch.ones(b, t, dtype=torch.bool)
    lengths = rng.integers(5, t, b)
    for i, n in enumerate(lengths):
        mask[i, n:] = False                                  # right padding
    mask[1, :4] = False                                      # left padding
    mask[2, 6:9] = False                                     # an interior hole
    mask[3] = mask[5] = False                                # two empty sequences
    return logp, old, f(b, t), f(b, t), f(b, t), mask


def masked_whiten64(x, m, unbiased=True, eps=1e-8, clamp=False):
    n = m.sum()
    mean = x[m].mean()
    var = ((x[m] - mean) ** 2).sum() / (n - 1 if unbiased and n > 1 else n)
    return (x - mean) / np.sqrt(max(var, eps) if clamp else var + eps)
