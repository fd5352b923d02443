"""Agreement and accuracy metrics: bits, ulps and logdiff.

Bits are compared as int32 after every NaN is replaced by 0x7fc00000: the
spec fixes where NaN appears, not its payload (docs/spec.md, section 9).
"""

import numpy as np
import torch

CANONICAL_NAN_BITS = 0x7FC00000


def canonical_bits(t):
    """int32 view of a float32 tensor with every NaN canonicalised."""
    a = t.detach().to("cpu", torch.float32).contiguous().numpy()
    bits = a.view(np.int32).copy()          # numpy, not torch: torch's threaded kernels crawl on a loaded machine
    bits[np.isnan(a)] = CANONICAL_NAN_BITS
    return torch.from_numpy(bits)


def identical(got, want):
    """How many elements of two float32 arrays have the same bits, every NaN counting as the canonical NaN."""
    same = got.view(np.int32) == want.view(np.int32)
    return int(np.count_nonzero(same | (np.isnan(got) & np.isnan(want))))


def ulp32(y):
    """The spacing of float32 at |y| (float64 array in, float64 array out); subnormal spacing at 0."""
    mag = np.abs(np.asarray(y, dtype=np.float64))
    with np.errstate(over="ignore"):
        f = np.minimum(mag, np.finfo(np.float32).max).astype(np.float32)
    return np.spacing(f).astype(np.float64)


def _beyond_range_as_inf(ref):
    """ref with the finite values that round to +-inf in float32 (beyond its range) made that infinity."""
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    return np.where(np.isinf(ref32) & np.isfinite(ref), ref32.astype(np.float64), ref)


def ulp_error(got, ref, floor=None):
    """|got - ref| in float32 ulps of max(|ref|, floor), element-wise.

    Where got and ref agree on a special value (same infinity, both NaN) the
    error is 0; a special on one side only is an infinite error.
    floor is a per-element (broadcastable) magnitude below which errors are
    measured in its ulps instead: the scale a result is conditioned by
    (docs/spec.md, section 10, says which for each op).
    """
    got = np.asarray(got, dtype=np.float64)
    ref = _beyond_range_as_inf(np.asarray(ref, dtype=np.float64))
    scale = np.abs(ref) if floor is None else np.maximum(np.abs(ref), floor)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref) / ulp32(scale)
    same_special = (got == ref) | (np.isnan(got) & np.isnan(ref))
    err = np.where(same_special, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def max_or_zero(a):
    a = np.asarray(a)
    return float(a.max()) if a.size else 0.0


def logdiff(got, want):
    """max |got - want| over entries where both are finite; inf where only one side is finite or the two
    hold different special values (float32 arrays in)."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    both = np.isfinite(g) & np.isfinite(w)
    same_special = (g == w) | (np.isnan(g) & np.isnan(w))
    if not np.all(both | same_special):
        return float("inf")
    return float(np.abs(g[both] - w[both]).max()) if both.any() else 0.0


def unit_error(got, ref, unit):
    """|got - ref| / unit element-wise (unit > 0, broadcastable): spec 29.14's measure, with unit U = 2^-24 times
    the largest magnitude of the gradient; specials as in ulp_error (agreeing: 0, on one side only: inf)."""
    got = np.asarray(got, dtype=np.float64)
    ref = _beyond_range_as_inf(np.asarray(ref, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref) / unit
    same_special = (got == ref) | (np.isnan(got) & np.isnan(ref))
    err = np.where(same_special, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)
