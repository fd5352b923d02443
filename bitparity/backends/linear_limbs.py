"""The exact integer of linear (spec 24.1) in the two-limb form that crosses the network in the tensor-parallel
linear (spec 31.1): S = hi * 2^30 + lo with 0 <= lo < 2^30, both int64. Each backend's `linear_exact` forms its
digit planes with its own integer GEMM and carries them into this form here (integer work only, no rounding).

Adding the limbs of W ranks element-wise is exact while W < 2^33 (the lo sum stays below 2^63) and
|S| < 2^92 (hi below 2^62), which holds for every K < 2^26 since |S| <= K 2^66 (spec 31.1).
"""

import torch

LIMB_BITS = 30
_MASK = (1 << LIMB_BITS) - 1


def from_planes(planes, base_bits):
    """planes int64 [D, ...] with S = sum_s planes[s] 2^(base_bits s) -> int64 [2, ...] (hi, lo) of S. Horner from
    the top plane, carrying after each step: lo stays below 2^(30 + base_bits) + |plane| and hi below |S| 2^-30,
    so nothing overflows int64 for base_bits <= 8 and |plane| < 2^50."""
    hi = torch.zeros_like(planes[0])
    lo = torch.zeros_like(planes[0])
    for s in range(planes.shape[0] - 1, -1, -1):
        lo = (lo << base_bits) + planes[s]
        hi = (hi << base_bits) + (lo >> LIMB_BITS)          # arithmetic shift: floor, so lo & mask is the residue
        lo = lo & _MASK
    return torch.stack([hi, lo])


def carry(limbs):
    """int64 [2, ...] (hi, lo) with any lo (e.g. summed over ranks) -> the same S with 0 <= lo < 2^30."""
    hi, lo = limbs[0], limbs[1]
    return torch.stack([hi + (lo >> LIMB_BITS), lo & _MASK])
