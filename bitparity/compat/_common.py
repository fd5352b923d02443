"""Pieces the compat modules share: their callers' argument names on the canonical ops' errors, checked host
factors rounded once to float32, and 0/1 masks."""

import contextlib
import math
import numbers
import re

import numpy as np
import torch

from .. import ops


@contextlib.contextmanager
def caller_names(**names):
    """Re-raise a TypeError/ValueError of the canonical ops with their argument names replaced by the caller's
    (names: op's name -> caller's name, whole words only). ops.py checks every input once, under its own names
    (logp, mask, clip_low, lam, ...); a compat function passes its caller's arguments under those names, so the
    message must be translated back to name what the caller wrote."""
    try:
        yield
    except (TypeError, ValueError) as error:
        pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
        message = re.sub(pattern, lambda m: names[m.group(1)], str(error))
        if message == str(error):
            raise
        raise type(error)(message).with_traceback(error.__traceback__) from None


def tensor(name, t):
    """t, after checking it is a tensor: the compat functions call tensor methods (detach, reshape) before ops.py."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    return t


def dp_size_checked(dp_size):
    """The data-parallel size: an integer >= 1 (a bool or a float is refused: it multiplies a count)."""
    if isinstance(dp_size, bool) or not isinstance(dp_size, numbers.Integral) or dp_size < 1:
        raise ValueError(f"dp_size must be an int >= 1; got {dp_size!r}")
    return int(dp_size)


def positive(name, value):
    """A host count or scale (batch_num_tokens, global_batch_size, loss_scale_factor) as a float: a real number
    or a one-element tensor, finite and > 0 (NaN, inf, 0 and negative values are refused, never divided by)."""
    if isinstance(value, torch.Tensor):
        ops._check_layout(name, value)                        # before .item() reads a meta or sparse tensor
    if isinstance(value, torch.Tensor | np.ndarray):
        if (value.size if isinstance(value, np.ndarray) else value.numel()) != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor; got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number or a one-element tensor; got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0; got {value}")
    return value


def host_factor(numerator, denominator, name):
    """RN32(numerator / denominator), divided in float64 on the host: the one rounding every platform shares.
    numerator >= 0 is the caller's own count; denominator is the user's argument name, checked by positive()."""
    denominator = positive(name, denominator)
    with np.errstate(over="ignore"):
        factor = np.float32(numerator / denominator)
    if not np.isfinite(factor):
        raise ValueError(f"{name} = {denominator} makes the scale factor {numerator} / {name} overflow float32")
    return float(factor)


def clip_bounds(low, high):
    """The ratio bounds ppo_policy_loss uses: RN32(1 - RN32(low)), RN32(1 + RN32(high)) (spec 17.1)."""
    one = np.float32(1.0)
    return float(one - np.float32(low)), float(one + np.float32(high))


def check_mask(name, mask):
    """The bool mask of a compat mask: bool as is; a real tensor (verl and OpenRLHF pass float and integer masks)
    only if every entry is 0 or 1, then entry != 0. NaN, 0.5, 2 or -1 are refused: a float mask is a membership,
    and the canonical ops (spec 15) take bool masks only, so no value other than 0 and 1 has a defined meaning."""
    tensor(name, mask)
    ops._check_layout(name, mask)
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{name} must be a bool or real tensor of 0 and 1; got {mask.dtype}")
    bad = ~((mask == 0) | (mask == 1))
    if bad.any():
        raise ValueError(f"{name} must hold only 0 and 1 (or be bool); got {mask[bad].reshape(-1)[0].item()}")
    return mask != 0
