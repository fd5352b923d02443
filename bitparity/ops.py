"""The operator API: signatures, input validation and dispatch.

Every check on user input happens here, once, so that backends and kernels
can assume valid input.  Leading dimensions are flattened to rows before a
backend is called and restored after; bf16 and fp16 inputs are upcast to
float32, which is exact.  Results are always float32.
"""

import math
import numbers

import numpy as np
import torch

from .backends import resolve as _resolve

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_float_tensor(name, x, min_dim):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16; got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s); got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty; got shape {tuple(x.shape)}")


def _check_mask(mask, x):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of dtype bool or None; got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = counts); got {mask.dtype}")
    if mask.shape != x.shape:
        raise ValueError(f"mask must have the shape of x, {tuple(x.shape)}; got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"mask must be on x's device, {x.device}; got {mask.device}")
    return mask.reshape(-1, x.shape[-1]).contiguous()


def inverse_temperature(temperature):
    """scale = RN32(1 / RN32(temperature)): one IEEE-correct float32 division on the host (spec 8.1)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number; got {type(temperature).__name__}")
    temperature = float(temperature)
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be finite and > 0; got {temperature}")
    t32 = np.float32(temperature)
    with np.errstate(over="ignore", divide="ignore"):
        scale = np.float32(1.0) / t32
    if t32 < np.finfo(np.float32).tiny or not np.isfinite(scale):
        raise ValueError(f"temperature must lie in float32's normal range so that 1/temperature is finite; "
                         f"got {temperature}")
    return float(scale)


def _rows(x):
    return x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()


def _call(op, backend, x, *args):
    module = _resolve(backend, x.device)
    return getattr(module, op)(x, *args)


def sum(x, mask=None, *, backend=None):  # noqa: A001 - mirrors torch.sum
    """Canonical sum over the last dimension; masked entries count as -0.0, the additive identity."""
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    return _call("sum", backend, _rows(x), rows_mask).reshape(x.shape[:-1])


def _softmax_family(op, x, mask, temperature, backend):
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    scale = inverse_temperature(temperature)
    return _call(op, backend, _rows(x), rows_mask, scale)


def logsumexp(x, mask=None, temperature=1.0, *, backend=None):
    """log(sum(exp(x / temperature))) over the last dimension; -inf for a fully masked row."""
    return _softmax_family("logsumexp", x, mask, temperature, backend).reshape(x.shape[:-1])


def log_softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked log-softmax over the last dimension: masked entries and fully masked rows give -inf."""
    return _softmax_family("log_softmax", x, mask, temperature, backend).reshape(x.shape)


def softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked softmax over the last dimension: masked entries and fully masked rows give 0."""
    return _softmax_family("softmax", x, mask, temperature, backend).reshape(x.shape)


def entropy(logits, mask=None, temperature=1.0, *, backend=None):
    """Entropy of softmax(logits / temperature) per row, as sum p * (log S - (w - max)); 0 for a fully masked row."""
    return _softmax_family("entropy", logits, mask, temperature, backend).reshape(logits.shape[:-1])


def token_logprobs(logits, tokens, temperature=1.0, *, backend=None):
    """log_softmax(logits / temperature) at each chosen token: logits [..., V], tokens int64 [...] -> [...]."""
    _check_float_tensor("logits", logits, 1)
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor of dtype int64; got {type(tokens).__name__}")
    if tokens.dtype != torch.int64:
        raise TypeError(f"tokens must have dtype torch.int64; got {tokens.dtype}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}; "
                         f"got {tuple(tokens.shape)}")
    if tokens.device != logits.device:
        raise ValueError(f"tokens must be on logits' device, {logits.device}; got {tokens.device}")
    vocab = logits.shape[-1]
    flat = tokens.reshape(-1).contiguous()
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"tokens must lie in [0, {vocab}) (the vocabulary size); got {bad}")
    scale = inverse_temperature(temperature)
    return _call("token_logprobs", backend, _rows(logits), flat, scale).reshape(tokens.shape)


def _elementwise(op, x, backend):
    _check_float_tensor("x", x, 0)
    flat = x.reshape(-1).to(torch.float32).contiguous()
    return _call(op, backend, flat).reshape(x.shape)


def exp(x, *, backend=None):
    """The portable float32 exp of docs/spec.md (max error below 1 ulp), element-wise."""
    return _elementwise("exp", x, backend)


def log(x, *, backend=None):
    """The portable float32 log of docs/spec.md (max error below 1 ulp), element-wise."""
    return _elementwise("log", x, backend)


# -- RL operators -------------------------------------------------------------------

KL_KINDS = ("k1", "k2", "k3", "abs")
PPO_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
GAE_MASK_MODES = ("carry", "zero")


def _real(name, value, *, low=None, high=None, low_open=False, allow_none=False):
    """value as a float after checking it is a finite real in the given range (None passes if allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    value = float(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or too_low or (high is not None and value > high):
        lo = "-inf" if low is None else f"{low}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {'inf)' if high is None else f'{high}]'}"
        raise ValueError(f"{name} must be finite and in {interval}; got {value}")
    return value


def _f32(value):
    """value rounded once to float32, as a Python float: the constant every backend uses."""
    return None if value is None else float(np.float32(value))


def _positive_bound(name, value):
    """A clamp bound: finite, > 0 and still a normal float32 once rounded, so min/max never
    see a tie between +0.0 and -0.0 (spec 16)."""
    value = _real(name, value, low=0.0, low_open=True, allow_none=True)
    if value is not None and not np.finfo(np.float32).tiny <= np.float32(value) < np.inf:
        raise ValueError(f"{name} must round to a normal float32 (1.18e-38 to 3.4e38); got {value}")
    return value


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_same_shape(name, t, like_name, like):
    _check_float_tensor(name, t, like.dim())
    if t.shape != like.shape:
        raise ValueError(f"{name} must have the shape of {like_name}, {tuple(like.shape)}; got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like_name}'s device, {like.device}; got {t.device}")


def _required_mask(mask, x):
    if mask is None:
        raise TypeError("mask must be a torch.Tensor of dtype bool (True = counts); got None")
    return _check_mask(mask, x)


def _flat(x):
    return x.reshape(1, -1).to(torch.float32).contiguous()


def masked_mean(x, mask, dim=None, *, backend=None):
    """Mean of x over entries where mask is True: over everything (dim=None, a 0-d result) or along dim.

    An all-masked reduction gives +0.0 (verl divides by count + 1e-8, which gives 0 too).
    """
    _check_float_tensor("x", x, 1)
    _required_mask(mask, x)
    if dim is None:
        return _call("masked_mean", backend, _flat(x), mask.reshape(1, -1).contiguous()).reshape(())
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be None or an int in [{-x.dim()}, {x.dim()}); got {dim!r}")
    moved, moved_mask = x.movedim(dim, -1), mask.movedim(dim, -1)
    out = _call("masked_mean", backend, _rows(moved), moved_mask.reshape(-1, moved.shape[-1]).contiguous())
    return out.reshape(moved.shape[:-1])


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, backend=None):
    """(x - mean) * rsqrt(var + eps) over all entries where mask is True (verl/TRL's masked_whiten).

    unbiased=True divides the sum of squares by count - 1 (TRL, verl), False by count (OpenRLHF);
    shift_mean=False adds the mean back. Entries where mask is False come out as 0.0, so an
    all-masked input gives all zeros.
    """
    _check_float_tensor("x", x, 1)
    _required_mask(mask, x)
    for name, flag in (("shift_mean", shift_mean), ("unbiased", unbiased)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    eps = _real("eps", eps, low=0.0, low_open=True)
    if np.float32(eps) < np.finfo(np.float32).tiny:
        raise ValueError(f"eps must be at least float32's smallest normal, 1.18e-38, so var + eps is normal; got {eps}")
    out = _call("masked_whiten", backend, _flat(x), mask.reshape(1, -1).contiguous(), shift_mean, unbiased, _f32(eps))
    return out.reshape(x.shape)


def kl_penalty(logp, ref_logp, kind, *, clamp=None, log_ratio_clamp=None, backend=None):
    """KL estimators of d = ref_logp - logp, element-wise (verl's convention): k1 = -d, abs = |d|,
    k2 = d^2 / 2, k3 = e^d - d - 1 (computed without cancellation for small |d|).

    log_ratio_clamp clamps d to [-c, c] first; clamp clamps the result to [-c, c]. verl's
    low_var_kl is kind="k3", log_ratio_clamp=20, clamp=10.
    """
    _check_float_tensor("logp", logp, 0)
    _check_same_shape("ref_logp", ref_logp, "logp", logp)
    _check_choice("kind", kind, KL_KINDS)
    clamp = _positive_bound("clamp", clamp)
    log_ratio_clamp = _positive_bound("log_ratio_clamp", log_ratio_clamp)
    flat = [t.reshape(-1).to(torch.float32).contiguous() for t in (logp, ref_logp)]
    out = _call("kl_penalty", backend, *flat, kind, _f32(clamp), _f32(log_ratio_clamp))
    return out.reshape(logp.shape)


def gae(rewards, values, mask=None, gamma=1.0, lam=1.0, *, bootstrap=None, mask_mode="carry", backend=None):
    """Generalised advantage estimation by the reverse recurrence: [B, T] -> (advantages, returns).

    mask_mode="carry" (verl): masked positions are skipped; they pass the next value and advantage
    through and report the carried advantage. mask_mode="zero" (TRL, OpenRLHF): rewards and values
    are zeroed where masked, the recurrence runs through every position, and masked outputs are 0.
    bootstrap [B] is the value after the last position (default 0). Returns are advantages + values.
    """
    _check_float_tensor("rewards", rewards, 2)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [B, T]; got {tuple(rewards.shape)}")
    _check_same_shape("values", values, "rewards", rewards)
    if mask is None:
        mask = torch.ones(rewards.shape, dtype=torch.bool, device=rewards.device)
    rows_mask = _check_mask(mask, rewards)
    gamma = _real("gamma", gamma, low=0.0, high=1.0)
    lam = _real("lam", lam, low=0.0, high=1.0)
    _check_choice("mask_mode", mask_mode, GAE_MASK_MODES)
    if bootstrap is None:
        bootstrap = torch.zeros(rewards.shape[0], device=rewards.device)
    else:
        _check_float_tensor("bootstrap", bootstrap, 1)
        if bootstrap.shape != rewards.shape[:1]:
            raise ValueError(f"bootstrap must have shape [B] = {tuple(rewards.shape[:1])}; got {tuple(bootstrap.shape)}")
        if bootstrap.device != rewards.device:
            raise ValueError(f"bootstrap must be on rewards' device, {rewards.device}; got {bootstrap.device}")
    gamma32, lam32 = np.float32(gamma), np.float32(lam)
    return _call("gae", backend, _rows(rewards), _rows(values), rows_mask, bootstrap.to(torch.float32).contiguous(),
                 float(gamma32), float(gamma32 * lam32), mask_mode)


def ppo_policy_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                    ratio_clamp=20.0, agg="token-mean", backend=None):
    """verl's clipped PPO surrogate: [B, T] inputs -> (loss, clip fraction), both 0-d.

    The log-ratio is clamped to [-ratio_clamp, ratio_clamp] before exp; the ratio is clipped to
    [1 - clip_low, 1 + clip_high]; dual_clip c (> 1) bounds the loss of negative advantages by
    -c * advantage. agg is verl's loss_agg_mode. The clip fraction counts valid tokens where the
    clipped loss exceeds the unclipped one.
    """
    _check_float_tensor("logp", logp, 2)
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T]; got {tuple(logp.shape)}")
    _check_same_shape("old_logp", old_logp, "logp", logp)
    _check_same_shape("advantages", advantages, "logp", logp)
    rows_mask = _required_mask(mask, logp)
    clip_low = _real("clip_low", clip_low, low=0.0, high=1.0)
    if np.float32(clip_low) >= 1.0:
        raise ValueError(f"clip_low must be in [0, 1) after rounding to float32 (the ratio floor "
                         f"1 - clip_low must stay > 0); got {clip_low}")
    clip_high = _real("clip_high", clip_high, low=0.0)
    dual_clip = _real("dual_clip", dual_clip, low=1.0, low_open=True, allow_none=True)
    ratio_clamp = _positive_bound("ratio_clamp", ratio_clamp)
    _check_choice("agg", agg, PPO_AGGS)
    one = np.float32(1.0)
    low, high = float(one - np.float32(clip_low)), float(one + np.float32(clip_high))
    loss, frac = _call("ppo_policy_loss", backend, _rows(logp), _rows(old_logp), _rows(advantages), rows_mask,
                       low, high, _f32(dual_clip), _f32(ratio_clamp), agg)
    return loss.reshape(()), frac.reshape(())
