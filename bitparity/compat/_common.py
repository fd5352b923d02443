"""Pieces the compat modules share: host-side scale factors, rounded once to float32."""

import numpy as np
import torch


def host_factor(numerator, denominator, name):
    """RN32(numerator / denominator), divided in float64 on the host: the one rounding every platform shares."""
    if denominator <= 0:
        raise ValueError(f"{name} must be > 0; got {denominator}")
    return float(np.float32(numerator / denominator))


def clip_bounds(low, high):
    """The ratio bounds ppo_policy_loss uses: RN32(1 - RN32(low)), RN32(1 + RN32(high)) (spec 17.1)."""
    one = np.float32(1.0)
    return float(one - np.float32(low)), float(one + np.float32(high))


def check_mask(name, mask):
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(mask).__name__}")
    return mask if mask.dtype == torch.bool else mask != 0
