"""Deterministic inputs: the row kinds every op is compared and tested on.

A case is a function of (kind, rows, n, seed) only, so a failing case can be
rebuilt anywhere.  Kinds cover the numerics that break naive code: wide
dynamic range, ties (all-equal rows), near-one-hot rows (low entropy),
masks with fully masked rows, and IEEE specials.
"""

import numpy as np
import torch

ROW_KINDS = ("random", "wide", "equal", "peaked", "masked", "specials")


def _wide(rng, shape):
    """Magnitudes log-uniform over [1e-30, 1e30] with random signs, a few exact zeros."""
    mag = np.exp(rng.uniform(np.log(1e-30), np.log(1e30), shape))
    x = np.where(rng.random(shape) < 0.5, -mag, mag)
    return np.where(rng.random(shape) < 0.01, 0.0, x)


def _specials(rng, x):
    """Row r gets, by r % 4: a NaN; a +inf; some -inf; a mixture of +0.0 and -0.0."""
    rows, n = x.shape
    for r in range(rows):
        cols = rng.integers(0, n, size=max(1, n // 8))
        kind = r % 4
        if kind == 0:
            x[r, cols[0]] = np.nan
        elif kind == 1:
            x[r, cols[0]] = np.inf
        elif kind == 2:
            x[r, cols] = -np.inf
        else:
            x[r, cols] = np.where(rng.random(cols.size) < 0.5, 0.0, -0.0)
    return x


def _mask(rng, rows, n):
    """Random keep-masks, with row 0 fully masked and row 1 (if any) a left-padded prefix mask."""
    mask = rng.random((rows, n)) < 0.6
    mask[0] = False
    if rows > 1:
        mask[1] = np.arange(n) >= n // 3
    return mask


def make_logits(kind, rows, n, seed=0):
    """(x float32 [rows, n], mask bool [rows, n] or None) for a row kind."""
    rng = np.random.default_rng([seed, rows, n, ROW_KINDS.index(kind)])
    mask = None
    if kind == "random":
        x = rng.standard_normal((rows, n)) * 4.0
    elif kind == "wide":
        x = _wide(rng, (rows, n))
    elif kind == "equal":
        x = np.repeat(rng.standard_normal((rows, 1)) * 10.0, n, axis=1)
    elif kind == "peaked":
        x = rng.standard_normal((rows, n))
        x[np.arange(rows), rng.integers(0, n, rows)] += 40.0
    elif kind == "masked":
        x = rng.standard_normal((rows, n)) * 4.0
        mask = torch.from_numpy(_mask(rng, rows, n))
    elif kind == "specials":
        x = _specials(rng, rng.standard_normal((rows, n)) * 4.0)
    else:
        raise ValueError(f"kind must be one of {ROW_KINDS}; got {kind!r}")
    return torch.from_numpy(x.astype(np.float32)), mask


def make_tokens(x, seed=0):
    """Token ids [rows]: the row's argmax for even rows (the likely sample), uniform for odd rows."""
    rows, n = x.shape
    rng = np.random.default_rng([seed, rows, n, 99])
    tokens = rng.integers(0, n, rows)
    finite = torch.nan_to_num(x, nan=-np.inf)
    tokens[::2] = torch.argmax(finite, dim=1).numpy()[::2]
    return torch.from_numpy(tokens.astype(np.int64))


def make_elementwise(op, n, seed=0):
    """float32 [n] inputs for exp or log: uniform bit patterns over the interesting range, then specials."""
    rng = np.random.default_rng([seed, n, 7])
    if op == "exp":
        body = rng.uniform(-110.0, 95.0, n).astype(np.float32)
    else:
        body = rng.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.uint32).view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45,
                         1.17549435e-38, 3.4028235e38, 88.72283, 88.72284, -103.97207, -103.97208],
                        dtype=np.float32)
    return torch.from_numpy(np.concatenate([specials, body]).astype(np.float32))


def make_batch(rows, n, seed=0):
    """(x [rows, n], mask [rows, n]): row r is of kind ROW_KINDS[r % 6]; the mask is all True outside masked rows."""
    x = torch.empty(rows, n)
    mask = torch.ones(rows, n, dtype=torch.bool)
    for k, kind in enumerate(ROW_KINDS):
        idx = list(range(k, rows, len(ROW_KINDS)))
        if not idx:
            continue
        xk, mk = make_logits(kind, len(idx), n, seed)
        x[idx] = xk
        if mk is not None:
            mask[idx] = mk
    return x, mask


def make_rl_batch(rows, t, seed=0):
    """An RL batch [rows, t]: variable-length right-padded responses, rewards on the last token
    plus small per-token rewards, values, advantages, and log-probs of three policies close to
    each other (as consecutive PPO iterates are)."""
    rng = np.random.default_rng([seed, rows, t, 123])
    lengths = rng.integers(1, t + 1, rows)
    lengths[0] = t
    mask = np.arange(t)[None, :] < lengths[:, None]
    rewards = rng.standard_normal((rows, t)) * 0.01
    rewards[np.arange(rows), lengths - 1] += rng.standard_normal(rows) * 5.0
    logp = -np.abs(rng.standard_normal((rows, t))) * 2.0
    out = {
        "mask": mask,
        "rewards": rewards,
        "values": rng.standard_normal((rows, t)),
        "advantages": rng.standard_normal((rows, t)),
        "logp": logp,
        "old_logp": logp + rng.standard_normal((rows, t)) * 0.1,
        "ref_logp": logp + rng.standard_normal((rows, t)) * 0.05,
    }
    return {k: torch.from_numpy(v if v.dtype == bool else v.astype(np.float32)) for k, v in out.items()}
