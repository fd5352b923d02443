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

from . import autograd as _autograd
from .backends import resolve as _resolve

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_layout(name, t):
    """A dense tensor with data: sparse, mkldnn and nested tensors, and the meta device, are refused here,
    before anything reads a value (.item(), .min())."""
    if t.layout != torch.strided or t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor; got layout {t.layout}"
                        + (" (nested)" if t.is_nested else ""))
    if t.device.type == "meta":
        raise ValueError(f"{name} must hold data; got a tensor on the meta device")


def _check_on(name, t, owner, device):
    """A tensor that goes with another is on its device; checked before anything else about it, so a tensor on
    another device (meta included) is named as such. owner is possessive: "x's", "logits'"."""
    if isinstance(t, torch.Tensor) and t.device != device:
        raise ValueError(f"{name} must be on {owner} device, {device}; got {t.device}")


def _check_float_tensor(name, x, min_dim):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    _check_layout(name, x)
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
    _check_on("mask", mask, "x's", x.device)
    _check_layout("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = counts); got {mask.dtype}")
    if mask.shape != x.shape:
        raise ValueError(f"mask must have the shape of x, {tuple(x.shape)}; got {tuple(mask.shape)}")
    return mask.reshape(-1, x.shape[-1]).contiguous()


def inverse_temperature(temperature):
    """scale = RN32(1 / RN32(temperature)): one IEEE-correct float32 division on the host (spec 8.1)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number; got {type(temperature).__name__}")
    scale, _ = _checked_scales(np.array([float(temperature)]), allow_zero=False)
    return float(scale[0])


def _rows(x):
    return x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()


def _dense(t):
    """The one layout every backend reads: lazy negation and conjugation applied (a view's raw memory holds
    the other sign), dense row-major, and each element at an address aligned to its size (torch.frombuffer
    can give float32 data at an odd address, which the Ascend layout refuses)."""
    if not isinstance(t, torch.Tensor):
        return t
    t = t.resolve_conj().resolve_neg().contiguous()
    return t.clone() if t.data_ptr() % t.element_size() else t


def _call(op, backend, x, *args):
    """The backend's op on dense inputs, differentiable where spec 26 defines a backward (autograd.py)."""
    return _autograd.call(op, _resolve(backend, x.device), tuple(_dense(a) for a in (x, *args)))


def sum(x, mask=None, *, backend=None):  # noqa: A001 - mirrors torch.sum
    """Canonical sum over the last dimension (spec 3): x [..., N] float32, bfloat16 or float16 (upcast exactly),
    mask optional bool of x's shape (True = counts) -> float32 [...].

    Masked entries count as -0.0, the additive identity: a fully masked row gives -0.0; +inf with -inf gives
    NaN. Same bits on numpy, cpu, cuda and ascend; native runs torch's op. Differentiable in x (spec 26.11)."""
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    return _call("sum", backend, _rows(x), rows_mask).reshape(x.shape[:-1])


def _softmax_family(op, x, mask, temperature, backend):
    """The backend's op with one scale per row (f32 [R]; a scalar temperature fills every row): the backend
    applies w = x * scale_r as it reads x (spec 8.1), so no scaled copy of the logits is made."""
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    scale, _ = _row_scales(temperature, x, allow_zero=False)
    return _call(op, backend, _rows(x), rows_mask, scale)


def logsumexp(x, mask=None, temperature=1.0, *, backend=None):
    """log(sum(exp(x / temperature))) over the last dimension (spec 8): x [..., N] -> float32 [...].

    In this op and the rest of the softmax family: x is float32, bfloat16 or float16 (upcast exactly) and the
    result float32; mask, optional, is bool of x's shape (True = counts); temperature is a scalar or a tensor
    of shape x.shape[:-1] (one per row), finite and > 0. Special values (spec 9): a fully masked or all -inf
    row gives logsumexp -inf, log_softmax -inf, softmax 0, entropy +0; an unmasked NaN or +inf makes every
    output of its row NaN; a masked one changes nothing. Same bits on numpy, cpu, cuda and ascend; native runs
    torch's ops. The family is differentiable in x (spec 26); temperature and mask are not."""
    return _softmax_family("logsumexp", x, mask, temperature, backend).reshape(x.shape[:-1])


def log_softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked log-softmax over the last dimension (spec 8.3): x [..., N] -> float32 [..., N]; masked entries and
    fully masked rows give -inf. Arguments, special values and backends as logsumexp's. Differentiable in x."""
    return _softmax_family("log_softmax", x, mask, temperature, backend).reshape(x.shape)


def softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked softmax over the last dimension (spec 8.3): x [..., N] -> float32 [..., N]; masked entries and
    fully masked rows give 0. Arguments, special values and backends as logsumexp's. Differentiable in x."""
    return _softmax_family("softmax", x, mask, temperature, backend).reshape(x.shape)


def entropy(logits, mask=None, temperature=1.0, *, backend=None):
    """Entropy of softmax(logits / temperature) per row, as sum p * (log S - (w - max)) (spec 8.4):
    logits [..., N] -> float32 [...]; +0.0 for a fully masked row. Arguments, special values and backends as
    logsumexp's. Differentiable in logits."""
    _check_float_tensor("logits", logits, 1)            # by its own name; _softmax_family checks it as x
    return _softmax_family("entropy", logits, mask, temperature, backend).reshape(logits.shape[:-1])


def _check_index_tensor(name, t, shape_name, shape, device, owner="logits'"):
    """An int64 tensor of the given shape on the given device (owner's, in the possessive)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of dtype int64; got {type(t).__name__}")
    _check_on(name, t, owner, device)
    _check_layout(name, t)
    if t.dtype != torch.int64:
        raise TypeError(f"{name} must have dtype torch.int64; got {t.dtype}")
    if t.shape != shape:
        raise ValueError(f"{name} must have shape {shape_name} = {tuple(shape)}; got {tuple(t.shape)}")
    return t.contiguous()


def token_logprobs(logits, tokens, temperature=1.0, *, backend=None):
    """log_softmax(logits / temperature) at each chosen token, bit for bit (spec 8.3): logits [..., V] float32,
    bfloat16 or float16, tokens int64 [...] in [0, V) -> float32 [...].

    temperature is a scalar or a tensor of shape tokens.shape (one per row), finite and > 0. A row whose
    logits are all -inf gives -inf; a NaN or +inf logit gives NaN (spec 9). Same bits on numpy, cpu, cuda and
    ascend; native runs torch's ops. Differentiable in logits (spec 26.6); tokens and temperature are not."""
    _check_float_tensor("logits", logits, 1)
    _check_index_tensor("tokens", tokens, "logits.shape[:-1]", logits.shape[:-1], logits.device)
    vocab = logits.shape[-1]
    flat = tokens.reshape(-1).contiguous()
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"tokens must lie in [0, {vocab}) (the vocabulary size); got {bad}")
    scale, _ = _row_scales(temperature, logits, allow_zero=False)
    return _call("token_logprobs", backend, _rows(logits), flat, scale).reshape(tokens.shape)


def _elementwise(op, x, backend):
    _check_float_tensor("x", x, 0)
    flat = x.reshape(-1).to(torch.float32).contiguous()
    return _call(op, backend, flat).reshape(x.shape)


def exp(x, *, backend=None):
    """The portable float32 exp of docs/spec.md (spec 5, max error below 1 ulp), element-wise: x of any shape,
    float32, bfloat16 or float16 -> float32 of x's shape. exp(+-0) = 1; +inf and x > 88.7228317 (0x42B17217)
    give +inf; -inf and x <= -103.972084 (0xC2CFF1B5) give +0; NaN gives NaN. Same bits on numpy, cpu, cuda and
    ascend; native runs torch.exp. Differentiable in x."""
    return _elementwise("exp", x, backend)


def log(x, *, backend=None):
    """The portable float32 log of docs/spec.md (spec 6, max error below 1 ulp), element-wise: x of any shape,
    float32, bfloat16 or float16 -> float32 of x's shape. log(+-0) = -inf; x < 0 and -inf give NaN; log(+inf)
    = +inf; log(1) = +0; subnormal inputs are exact; NaN gives NaN. Same bits on numpy, cpu, cuda and ascend;
    native runs torch.log. Not differentiable:
    spec 26 defines no general reciprocal for 1/x (use log_softmax or token_logprobs for log-probabilities)."""
    return _elementwise("log", x, backend)


# -- RL operators -------------------------------------------------------------------

KL_KINDS = ("k1", "k2", "k3", "abs")
PPO_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
EPS_MODES = ("add", "clamp")
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


def _normal_float32(name, value):
    """A finite real > 0 that is still a normal float32 once rounded (eps, clamp bounds): min/max then
    never see a tie between +0.0 and -0.0 (spec 16), and var + eps is normal (spec 15.3, 24.2)."""
    value = _real(name, value, low=0.0, low_open=True)
    with np.errstate(over="ignore"):
        normal = np.finfo(np.float32).tiny <= np.float32(value) < np.inf
    if not normal:
        raise ValueError(f"{name} must round to a normal float32 (1.18e-38 to 3.4e38); got {value}")
    return value


def _positive_bound(name, value):
    """An optional clamp bound: None, or _normal_float32."""
    return None if value is None else _normal_float32(name, value)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_same_shape(name, t, like_name, like):
    _check_on(name, t, f"{like_name}'s", like.device)
    _check_float_tensor(name, t, like.dim())
    if t.shape != like.shape:
        raise ValueError(f"{name} must have the shape of {like_name}, {tuple(like.shape)}; got {tuple(t.shape)}")


def _required_mask(mask, x):
    if mask is None:
        raise TypeError("mask must be a torch.Tensor of dtype bool (True = counts); got None")
    return _check_mask(mask, x)


def _flat(x):
    return x.reshape(1, -1).to(torch.float32).contiguous()


def masked_mean(x, mask, dim=None, *, backend=None):
    """Mean of x over entries where mask is True (spec 15.1): over everything (dim=None, a 0-d result) or along
    dim (x's shape without dim): x float32, bfloat16 or float16, mask bool of x's shape -> float32.

    An all-masked reduction gives +0.0 (verl divides by count + 1e-8, which gives 0 too). Same bits on numpy,
    cpu, cuda and ascend; native runs torch's ops. Differentiable in x.
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


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, eps_mode="add", backend=None):
    """(x - mean) * rsqrt(var + eps) over all entries where mask is True (verl/TRL's masked_whiten, spec 15.3):
    x float32, bfloat16 or float16, mask bool of x's shape -> float32 of x's shape.

    unbiased=True divides the sum of squares by count - 1 (TRL, verl), False by count (OpenRLHF);
    eps_mode="clamp" takes rsqrt(max(var, eps)) instead (OpenRLHF); shift_mean=False adds the mean back.
    Entries where mask is False come out as 0.0, so an all-masked input gives all zeros; a single counted
    entry whitens to 0. eps rounds to a normal float32. Same bits on numpy, cpu, cuda and ascend; native runs
    torch's ops. Differentiable in x.
    """
    _check_float_tensor("x", x, 1)
    _required_mask(mask, x)
    for name, flag in (("shift_mean", shift_mean), ("unbiased", unbiased)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    eps = _normal_float32("eps", eps)
    _check_choice("eps_mode", eps_mode, EPS_MODES)
    out = _call("masked_whiten", backend, _flat(x), mask.reshape(1, -1).contiguous(), shift_mean, unbiased, _f32(eps),
                eps_mode)
    return out.reshape(x.shape)


def kl_penalty(logp, ref_logp, kind, *, clamp=None, log_ratio_clamp=None, backend=None):
    """KL estimators of d = ref_logp - logp, element-wise (verl's convention, spec 16): k1 = -d, abs = |d|,
    k2 = d^2 / 2, k3 = e^d - d - 1 (computed without cancellation for small |d|). logp and ref_logp of one
    shape, float32, bfloat16 or float16 -> float32 of that shape.

    log_ratio_clamp clamps d to [-c, c] first; clamp clamps the result to [-c, c]; both propagate NaN, and
    k3 of d = +inf is +inf. verl's low_var_kl is kind="k3", log_ratio_clamp=20, clamp=10. Same bits on numpy,
    cpu, cuda and ascend; native runs torch's ops. Differentiable in logp and ref_logp (spec 26.9).
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
    """Generalised advantage estimation by the reverse recurrence (spec 14): rewards and values [B, T] float32,
    bfloat16 or float16, mask bool [B, T] (default all True) -> (advantages, returns), float32 [B, T] each.

    mask_mode="carry" (verl): masked positions are skipped; they pass the next value and advantage
    through and report the carried advantage. mask_mode="zero" (TRL, OpenRLHF): rewards and values
    are zeroed where masked, the recurrence runs through every position, and masked outputs are 0.
    bootstrap [B] is the value after the last position (default 0). Returns are advantages + values.
    gamma and lam lie in [0, 1]. A NaN or inf at a masked position never reaches a counted one (selects, not
    multiplies by the mask). Same bits on numpy, cpu, cuda and ascend; native runs torch's ops.
    Not differentiable (advantages are targets): pass rewards and values detached.
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
        _check_on("bootstrap", bootstrap, "rewards'", rewards.device)
        _check_float_tensor("bootstrap", bootstrap, 1)
        if bootstrap.shape != rewards.shape[:1]:
            raise ValueError(f"bootstrap must have shape [B] = {tuple(rewards.shape[:1])}; got {tuple(bootstrap.shape)}")
    gamma32, lam32 = np.float32(gamma), np.float32(lam)
    return _call("gae", backend, _rows(rewards), _rows(values), rows_mask, bootstrap.to(torch.float32).contiguous(),
                 float(gamma32), float(gamma32 * lam32), mask_mode)


def ppo_policy_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                    ratio_clamp=20.0, agg="token-mean", backend=None):
    """verl's clipped PPO surrogate (spec 17): logp, old_logp, advantages [B, T] float32, bfloat16 or float16,
    mask bool [B, T] -> (loss, clip fraction), both 0-d float32.

    The log-ratio is clamped to [-ratio_clamp, ratio_clamp] before exp; the ratio is clipped to
    [1 - clip_low, 1 + clip_high]; dual_clip c (> 1) bounds the loss of negative advantages by
    -c * advantage. agg is verl's loss_agg_mode; the seq-mean modes average over the non-empty sequences.
    The clip fraction counts valid tokens where the clipped loss exceeds the unclipped one. An all-masked
    batch gives +0.0 for both; NaN propagates. Same bits on numpy, cpu, cuda and ascend; native runs torch's
    ops. The loss is
    differentiable in logp (spec 26.10); old_logp and advantages are constants, the clip fraction has no gradient.
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


ROLLOUT_LEVELS = ("token", "sequence", "geometric")
ROLLOUT_MODES = ("truncate", "mask")


def rollout_correction(old_logp, rollout_logp, mask, *, level="token", mode="truncate", threshold=2.0,
                       threshold_low=None, log_ratio_clamp=None, backend=None):
    """Importance weights for tokens the rollout engine sampled (spec 27): [B, T] log-probabilities of the
    trainer (old_logp) and of the rollout, float32, bfloat16 or float16, mask bool [B, T] -> (weights f32 [B, T],
    keep bool [B, T]).

    The ratio pi_train / pi_rollout is exp(old_logp - rollout_logp) per token (level="token"), exp of the
    sequence's masked sum of log-ratios ("sequence") or of their masked mean ("geometric"), the latter two
    the same for every token of a sequence. mode="truncate" (TIS) weighs each counted token by
    min(max(ratio, threshold_low), threshold) and keeps it; mode="mask" (MIS, IcePop, rejection) keeps a
    token, or a whole sequence, iff threshold_low <= ratio <= threshold and weighs it by the ratio, else 0.
    threshold_low None is no lower bound; log_ratio_clamp clamps the log-ratio first (verl: 20). Tokens
    outside mask get weight 0 and keep False; an empty sequence has ratio 1. rollout_logp = -inf gives ratio
    +inf (truncated to threshold, or dropped), old_logp = -inf ratio 0; a NaN log-probability gives a NaN weight
    under truncate and is dropped under mask. Same bits on numpy, cpu, cuda and ascend (their exp, sum and
    masked_mean); native runs torch's. Not differentiable: every peer treats the weights as constants.
    """
    _check_float_tensor("old_logp", old_logp, 2)
    if old_logp.dim() != 2:
        raise ValueError(f"old_logp must have shape [B, T]; got {tuple(old_logp.shape)}")
    _check_same_shape("rollout_logp", rollout_logp, "old_logp", old_logp)
    rows_mask = _required_mask(mask, old_logp)
    _check_choice("level", level, ROLLOUT_LEVELS)
    _check_choice("mode", mode, ROLLOUT_MODES)
    high = _f32(_normal_float32("threshold", threshold))
    low = _f32(_positive_bound("threshold_low", threshold_low))
    if low is not None and low > high:
        raise ValueError(f"threshold_low must be <= threshold = {high}; got {low}")
    clamp = _f32(_positive_bound("log_ratio_clamp", log_ratio_clamp))
    _autograd.refuse_grad("rollout_correction", old_logp=old_logp, rollout_logp=rollout_logp)
    old, rollout = _rows(old_logp), _rows(rollout_logp)
    log_ratio = old - rollout                                             # one rounding
    if clamp is not None:
        log_ratio = log_ratio.clamp(-clamp, clamp)                        # NaN-propagating
    if level == "token":
        ratio = _call("exp", backend, log_ratio.reshape(-1)).reshape(old.shape)
    else:
        per_sequence = _call("sum" if level == "sequence" else "masked_mean", backend, log_ratio, rows_mask)
        ratio = _call("exp", backend, per_sequence)[:, None].expand(old.shape)
    if mode == "truncate":
        weights = ratio if low is None else torch.maximum(ratio, torch.tensor(low, device=ratio.device))
        weights = torch.minimum(weights, torch.tensor(high, device=ratio.device))
        keep = rows_mask
    else:
        inside = (ratio <= high) & (True if low is None else ratio >= low)
        keep = rows_mask & inside
        weights = torch.where(keep, ratio, 0.0)
    weights = torch.where(rows_mask, weights, 0.0)
    return weights.reshape(old_logp.shape), keep.reshape(old_logp.shape)


# -- Selection, sampling and beam search (spec 19-23) ----------------------------------

LOGPROB_KINDS = ("processed", "scaled", "raw")


def _row_values(name, value, x, integer):
    """A scalar or a per-row tensor of shape x.shape[:-1] -> float64 (or int64) numpy [rows], type-checked."""
    rows = x.numel() // x.shape[-1]
    if isinstance(value, torch.Tensor):
        _check_on(name, value, "logits'", x.device)
        _check_layout(name, value)
        kind = "an integer" if integer else "a floating-point"
        if value.dtype == torch.bool or value.is_floating_point() == integer or value.is_complex():
            raise TypeError(f"{name} must be {kind} tensor; got dtype {value.dtype}")
        if value.shape != x.shape[:-1]:
            raise ValueError(f"{name} must be a scalar or a tensor of shape {tuple(x.shape[:-1])} (one per row); "
                             f"got shape {tuple(value.shape)}")
        if value.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{name} is not differentiable (spec 26.1); got a tensor that requires grad: "
                             f"pass {name}.detach()")
        # Converted by torch first: numpy has no bfloat16, and every other dtype widens exactly.
        return value.detach().resolve_neg().reshape(-1).to(torch.int64 if integer else torch.float64).cpu().numpy()
    wanted = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise TypeError(f"{name} must be {'an integer' if integer else 'a real number'} or a tensor; "
                        f"got {type(value).__name__}")
    if integer and not -2 ** 63 <= value < 2 ** 63:
        raise ValueError(f"{name} must fit in int64; got {value}")
    return np.full(rows, value, dtype=np.int64 if integer else np.float64)


def _reject(name, values, ok, expected):
    if not np.all(ok):
        raise ValueError(f"{name} must be {expected}; got {values[~ok][0]}")


def _checked_scales(t, allow_zero):
    """float64 temperatures [R] -> (scale f32 [R], greedy bool [R]) as numpy arrays, each checked:
    scale = RN32(1 / RN32(T)) (spec 8.1); with allow_zero, T = 0 marks a greedy row, scale 1.0 (spec 22)."""
    greedy = (t == 0) if allow_zero else np.zeros(t.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        _reject("temperature", t, np.isfinite(t) & ((t > 0) | greedy),
                "finite and >= 0 (0 = greedy)" if allow_zero else "finite and > 0")
    with np.errstate(over="ignore", divide="ignore"):
        t32 = np.where(greedy, 1.0, t).astype(np.float32)
        scale = np.float32(1.0) / t32
    _reject("temperature", t, (t32 >= np.finfo(np.float32).tiny) & (t32 < np.inf) & np.isfinite(scale),
            "in float32's normal range so that 1/temperature is finite")
    return scale, greedy


def _row_scales(temperature, x, allow_zero):
    """(scale f32 [R], greedy bool [R]) on x's device for a scalar or per-row temperature (_checked_scales)."""
    scale, greedy = _checked_scales(_row_values("temperature", temperature, x, integer=False), allow_zero)
    return torch.from_numpy(scale).to(x.device), torch.from_numpy(greedy).to(x.device)


def _filter_params(x, top_k, top_p, min_p):
    """Per-row top_k int64, top_p f32, min_p f32 on x's device, checked as spec 21 requires."""
    k = _row_values("top_k", top_k, x, integer=True)
    _reject("top_k", k, k >= 0, "an integer >= 0 (0 = off)")
    p = _row_values("top_p", top_p, x, integer=False)
    with np.errstate(invalid="ignore", over="ignore"):
        p32 = p.astype(np.float32)
        _reject("top_p", p, (p > 0) & (p <= 1) & (p32 >= np.finfo(np.float32).tiny),
                "in (0, 1] and round to a normal float32 (>= 1.18e-38)")
        m = _row_values("min_p", min_p, x, integer=False)
        _reject("min_p", m, (m >= 0) & (m <= 1), "in [0, 1]")
    return tuple(torch.from_numpy(a).to(x.device) for a in (k, p32, m.astype(np.float32)))


def _positive_int(name, value, high=None, why=""):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < 1 or (high is not None and value > high):
        raise ValueError(f"{name} must be in [1, {high if high is not None else 'inf'}]{why}; got {value}")
    return int(value)


def topk(x, k, *, backend=None):
    """The k largest values of each row and their int64 indices, by value descending then index ascending
    (spec 21: -0.0 == +0.0, -inf below every number, NaN below -inf): x [..., N] float32, bfloat16 or float16,
    1 <= k <= N -> (values float32 [..., k], indices int64 [..., k]). Values keep their bits (-0.0 stays -0.0).
    Same on numpy, cpu, cuda and ascend; native runs torch.topk, whose order of ties and NaN may differ.
    The values are differentiable in x (their gradient placed at the indices); the indices are not."""
    _check_float_tensor("x", x, 1)
    k = _positive_int("k", k, x.shape[-1], " (the row length)")
    values, indices = _call("topk", backend, _rows(x), k)
    shape = (*x.shape[:-1], k)
    return values.reshape(shape), indices.reshape(shape)


def filter_logits(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, backend=None):
    """vLLM v1's filters in its order (spec 21): w = logits * RN32(1 / RN32(temperature)), then min-p,
    top-k (ties with the k-th value stay), top-p (keep t iff the kept mass ranked above t is < p times
    the kept mass); removed tokens are -inf. A row holding NaN or +inf comes out all NaN.
    logits [..., V] float32, bfloat16 or float16 -> float32 [..., V].

    Each parameter is a scalar or a tensor of shape logits.shape[:-1]: temperature finite and > 0, top_k an
    integer >= 0, top_p in (0, 1], min_p in [0, 1]; top_k = 0, top_p = 1 and min_p = 0 switch a filter off.
    Same bits on numpy, cpu, cuda and ascend; native runs torch's ops. Not differentiable (a selection).
    """
    _check_float_tensor("logits", logits, 1)
    scale, _ = _row_scales(temperature, logits, allow_zero=False)
    out = _call("filter_logits", backend, _rows(logits), scale, *_filter_params(logits, top_k, top_p, min_p))
    return out.reshape(logits.shape)


def sample(logits, seeds, positions, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logprobs="processed",
           backend=None):
    """One token per row by the exponential race over filter_logits(...) with Philox noise of
    (seed, position, token index) only (spec 19-22): logits [B, V] float32, bfloat16 or float16, seeds and
    positions int64 [B] (positions >= 0) -> (tokens int64 [B], logprobs f32 [B]). temperature, top_k, top_p
    and min_p are scalars or tensors [B], as filter_logits takes them.

    temperature 0 (a scalar, or per row) is greedy: the lowest-index maximum, with no filters. A row with
    no distribution (a NaN or +inf logit, or every logit -inf) gives token -1. logprobs names the
    distribution whose log-probability is returned (spec 22.1): "processed" (what was sampled from,
    after temperature and filters), "scaled" (temperature only, what RL trainers recompute) or "raw"
    (the model's logits, vLLM's default); greedy rows get the raw one under every name; -1 rows get NaN
    (a NaN or +inf logit) or -inf. Same bits on numpy, cpu, cuda and ascend; native is vLLM's method with
    torch's random numbers. Not differentiable: recompute log-probabilities with token_logprobs.
    """
    _check_float_tensor("logits", logits, 2)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [B, V]; got {tuple(logits.shape)}")
    batch = logits.shape[:1]
    seeds = _check_index_tensor("seeds", seeds, "[B]", batch, logits.device)
    positions = _check_index_tensor("positions", positions, "[B]", batch, logits.device)
    if bool((positions < 0).any()):
        raise ValueError(f"positions must be >= 0; got {int(positions.min())}")
    _check_choice("logprobs", logprobs, LOGPROB_KINDS)
    scale, greedy = _row_scales(temperature, logits, allow_zero=True)
    filters = _filter_params(logits, top_k, top_p, min_p)
    x = _rows(logits)
    tokens = _call("sample", backend, x, scale, *filters, greedy, seeds, positions)
    # spec 22.1: each kind is token_logprobs of one distribution; greedy rows have scale 1.0 and no
    # filters, so all three kinds are the raw log-probability there.
    if logprobs == "processed":
        dist = _call("filter_logits", backend, x, scale, *filters)            # a new tensor: written in place
        if bool(greedy.any()):                    # not a full-size torch.where, which runs on torch's threads
            dist[greedy] = x[greedy]
    else:
        dist = x
    # "scaled" hands token_logprobs the row scales, applied as it reads x: no scaled copy of the logits.
    dist_scale = scale if logprobs == "scaled" else torch.ones_like(scale)
    out = _call("token_logprobs", backend, dist, tokens.clamp(min=0), dist_scale)
    none = tokens < 0
    if bool(none.any()):
        # No token: NaN where the scaled logits hold a NaN or +inf, else -inf (every logit -inf).
        w = x[none] * scale[none, None]
        out[none] = torch.where(((w != w) | (w == float("inf"))).any(dim=1), float("nan"), float("-inf"))
    return tokens, out


def length_factor(length, length_penalty):
    """RN32(length ** -length_penalty): the power in float64, rounded once to float32 (spec 23)."""
    with np.errstate(over="ignore"):
        return np.power(np.asarray(length, dtype=np.float64), -length_penalty).astype(np.float32)


def _length_factors(lengths, length_penalty, beam_scores):
    """RN32(lengths ** -length_penalty), computed in float64 on the host and rounded once (spec 23)."""
    length_penalty = _real("length_penalty", length_penalty)
    if lengths is None:
        if length_penalty != 1.0:
            raise ValueError("length_penalty needs lengths (the length each beam's candidates have); "
                             f"got length_penalty={length_penalty} and lengths=None")
        return None
    _check_index_tensor("lengths", lengths, "beam_scores.shape", beam_scores.shape, beam_scores.device,
                        "beam_scores'")
    n = lengths.resolve_neg().cpu().numpy()                 # numpy refuses a lazily negated view
    _reject("lengths", n, n >= 1, ">= 1")
    factor = length_factor(n, length_penalty)
    _reject("length_penalty", np.full(factor.shape, length_penalty),
            (factor >= np.finfo(np.float32).tiny) & np.isfinite(factor),
            "such that lengths ** -length_penalty is a normal float32")
    return torch.from_numpy(factor).to(beam_scores.device)


def beam_search_step(beam_scores, logits, beam_width, *, length_penalty=1.0, lengths=None, backend=None):
    """One beam-search step (spec 23): beam_scores [W] and logits [W, V] for one request, or [B, W] and
    [B, W, V] for a batch -> (scores, parent beams int64, tokens int64), each [beam_width] or [B, beam_width].

    cand = beam_scores + log_softmax(logits) (one add); the beam_width best candidates of each request
    over its W * V are ranked by cand (or by cand * RN32(lengths ** -length_penalty) when lengths, the
    length of each beam's candidates, is given), ties to the lowest flat index w * V + v. The scores
    returned are cand, the running sums of log-probabilities. Requests are independent, bit for bit.

    beam_scores and logits float32, bfloat16 or float16 (scores out float32); lengths int64 >= 1 of
    beam_scores' shape; 1 <= beam_width <= V. A -inf logit gives a -inf candidate; NaN ranks below -inf
    (spec 21). Same bits on numpy, cpu, cuda and ascend; native runs torch's ops. Not differentiable (a
    selection): recompute log-probabilities with token_logprobs.
    """
    _check_float_tensor("logits", logits, 2)
    _autograd.refuse_grad("beam_search_step", logits=logits, beam_scores=beam_scores)
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must have shape [W, V] or [B, W, V]; got {tuple(logits.shape)}")
    _check_beam_scores(beam_scores, logits)
    width, vocab = logits.shape[-2:]
    beam_width = _positive_int("beam_width", beam_width, vocab, " (the vocabulary size V)")
    factor = _length_factors(lengths, length_penalty, beam_scores)
    rows = _rows(logits)
    lp = _call("log_softmax", backend, rows, None, torch.ones(rows.shape[0], dtype=torch.float32,
                                                              device=rows.device)).reshape(-1, width, vocab)
    cand = beam_scores.reshape(-1, width).to(torch.float32)[:, :, None] + lp
    key = cand if factor is None else cand * factor.reshape(-1, width)[:, :, None]
    values, flat = _call("topk", backend, key.reshape(-1, width * vocab).contiguous(), beam_width)
    scores = values if factor is None else cand.reshape(-1, width * vocab).gather(1, flat)
    shape = (*logits.shape[:-2], beam_width)
    return scores.reshape(shape), (flat // vocab).reshape(shape), (flat % vocab).reshape(shape)


def _check_beam_scores(beam_scores, logits):
    _check_on("beam_scores", beam_scores, "logits'", logits.device)
    _check_float_tensor("beam_scores", beam_scores, 1)
    if beam_scores.shape != logits.shape[:-1]:
        raise ValueError(f"beam_scores must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}; "
                         f"got {tuple(beam_scores.shape)}")


# -- Model building blocks (spec 24) and their backward (spec 29) -----------------------


def _check_param(name, t, shape, like_name, like):
    """A float tensor of an exact shape on like's device (a weight, bias or table)."""
    _check_on(name, t, f"{like_name}'s", like.device)
    _check_float_tensor(name, t, len(shape))
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}; got {tuple(t.shape)}")
    return t.to(torch.float32).contiguous()


def linear(x, weight, bias=None, *, backend=None):
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] (spec 24.1, 2.0.0): each row of x and of weight
    quantised to integers against its largest exponent (x's rows to 39 bits, the weight's to 29), their exact
    integer product rounded once to float32, then the bias (one add). The same bits for any number of rows, any
    tiling and any exact integer method. An exact zero is +0.0; a row holding NaN or inf gives its pairs' IEEE
    value (NaN or inf).

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in x, weight and bias (spec 29.2: dx the same product; weight and bias exact over blocks of
    32 rows, then the row fold of 29.1 across blocks)."""
    _check_float_tensor("x", x, 1)
    _check_on("weight", weight, "x's", x.device)
    _check_float_tensor("weight", weight, 2)
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape [N, K] with K = x.shape[-1] = {x.shape[-1]}; "
                         f"got {tuple(weight.shape)}")
    weight = _check_param("weight", weight, weight.shape, "x", x)
    if bias is not None:
        bias = _check_param("bias", bias, weight.shape[:1], "x", x)
    return _call("linear", backend, _rows(x), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


def rms_norm(x, weight, eps=1e-6, *, backend=None):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension (spec 24.2: canonical sum of squares,
    times the reciprocal of D, spec 15.2's rsqrt), as Qwen3's RMSNorm: x [..., D], weight [D] -> [..., D].
    A NaN gives a NaN row; an infinite entry (or squares that overflow) gives NaN there and +-0 elsewhere, as
    torch's float32 RMSNorm does. eps rounds to a normal float32.

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in x and weight (spec 29.3)."""
    _check_float_tensor("x", x, 1)
    weight = _check_param("weight", weight, x.shape[-1:], "x", x)
    eps = _normal_float32("eps", eps)
    return _call("rms_norm", backend, _rows(x), weight, _f32(eps)).reshape(x.shape)


def rotary(x, cos, sin, *, backend=None):
    """Rotary embedding, rotate-half convention (HF, Qwen3): with x = [x1, x2] halves of the last
    dimension D, out = [x1*cos - x2*sin, x2*cos + x1*sin] (spec 24.3). cos and sin [..., D/2] broadcast
    to x.shape[:-1] + (D/2,); rotary_tables makes them. x [..., D] -> [..., D].

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in x (spec 29.4); cos and sin are constants."""
    _check_float_tensor("x", x, 1)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even (two halves); got {x.shape[-1]}")
    half = (*x.shape[:-1], x.shape[-1] // 2)
    tables = []
    for name, t in (("cos", cos), ("sin", sin)):
        _check_on(name, t, "x's", x.device)
        _check_float_tensor(name, t, 1)
        try:
            t = torch.broadcast_to(t, half)
        except RuntimeError:
            raise ValueError(f"{name} must broadcast to x.shape[:-1] + (D/2,) = {half}; "
                             f"got {tuple(t.shape)}") from None
        tables.append(_rows(t))
    return _call("rotary", backend, _rows(x), *tables).reshape(x.shape)


def rotary_tables(length, dim, base=10000.0):
    """(cos, sin), float32 [length, dim/2]: position p and frequency i give cos and sin of
    p * base**(-2i/dim), computed in float64 on the host and rounded once (spec 24.3)."""
    length = _positive_int("length", length)
    dim = _positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"dim must be even; got {dim}")
    base = _real("base", base, low=1.0, low_open=True)
    inv_freq = np.power(base, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    return torch.from_numpy(np.cos(angles).astype(np.float32)), torch.from_numpy(np.sin(angles).astype(np.float32))


def attention_scale(head_dim):
    """RN32(1/sqrt(D)) (spec 24.4): binary64 sqrt and division are correctly rounded everywhere, then one rounding."""
    return float(np.float32(1.0 / math.sqrt(head_dim)))


def attention(q, k, v, *, causal=True, kv_lengths=None, backend=None):
    """Scaled dot-product attention in the canonical order (spec 24.4): q [B, H, Tq, D], k and v [B, H, Tk, D]
    -> [B, H, Tq, D], scale RN32(1/sqrt(D)).

    Key j counts for query i of batch row b iff j < kv_lengths[b] (default Tk) and, when causal,
    j <= i + (Tk - Tq): queries are the last Tq positions (flash-attention's bottom-right alignment), so a
    one-token decode against a KV cache padded past its length gives the bits of the full-sequence prefill.
    Keys that do not count are never read as numbers (garbage or NaN there changes nothing). kv_lengths is
    int64 [B] in [1, Tk].

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in q, k and v (spec 29.6); kv_lengths is not."""
    _check_float_tensor("q", q, 4)
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, H, Tq, D]; got {tuple(q.shape)}")
    batch, heads, tq, d = q.shape
    _check_on("k", k, "q's", q.device)
    _check_float_tensor("k", k, 4)
    if k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[3] != d:
        raise ValueError(f"k must have shape [B, H, Tk, D] = [{batch}, {heads}, Tk, {d}]; got {tuple(k.shape)}")
    _check_same_shape("v", v, "k", k)
    tk = k.shape[2]
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if causal and tq > tk:
        raise ValueError(f"causal attention needs Tq <= Tk (queries are the last Tq positions); got Tq={tq}, Tk={tk}")
    if kv_lengths is None:
        kv_lengths = torch.full((batch,), tk, dtype=torch.int64, device=q.device)
    kv_lengths = _check_index_tensor("kv_lengths", kv_lengths, "[B]", q.shape[:1], q.device, "q's")
    low, high = int(kv_lengths.min()), int(kv_lengths.max())
    if low < 1 or high > tk:
        raise ValueError(f"kv_lengths must lie in [1, Tk] = [1, {tk}]; got {low if low < 1 else high}")
    scale = attention_scale(d)
    rows = [t.reshape(batch * heads, t.shape[2], d).to(torch.float32).contiguous() for t in (q, k, v)]
    out = _call("attention", backend, *rows, kv_lengths.repeat_interleave(heads), causal, scale)
    return out.reshape(q.shape)


def silu_mul(gate, up, *, backend=None):
    """SwiGLU's silu(gate) * up, element-wise (spec 24.5): sigmoid from one portable exp and spec 7's
    reciprocal, whose argument 1 + exp(-|gate|) always lies in [1, 2]. gate and up of one shape -> that shape.
    NaN propagates; gate = -inf gives NaN (-inf * 0), as x * sigmoid(x) does.

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in gate and up (spec 29.5)."""
    _check_float_tensor("gate", gate, 0)
    _check_same_shape("up", up, "gate", gate)
    flat = [t.reshape(-1).to(torch.float32).contiguous() for t in (gate, up)]
    return _call("silu_mul", backend, *flat).reshape(gate.shape)


def moe(x, router_weight, gate_proj, up_proj, down_proj, top_k, *, norm_topk_prob=True, backend=None):
    """A Qwen3-MoE block (spec 24.6): x [M, D]; router_weight [E, D]; gate_proj and up_proj [E, I, D];
    down_proj [E, D, I] -> [M, D].

    router = linear(x, router_weight); the top_k experts by router logit (ties to the lowest expert
    index); their weights the softmax over those top_k logits (= Qwen3's softmax, top-k, renormalise);
    each chosen expert computes down(silu_mul(gate(x), up(x))); the outputs are combined per token as the
    canonical sum over the top_k slots, in rank order, of weight * output. No scatter, no atomics: a
    token's bits depend on that token only. 1 <= top_k <= E.

    norm_topk_prob=False is Qwen3-MoE's (HF transformers') routing without renormalisation: the same top_k
    experts by router logit, weighted by the softmax over all E router logits taken at those experts, not
    divided by their sum. The default True keeps the weights above.

    Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda
    and ascend; native runs torch's ops as HF transformers' Qwen3 modules do.
    Differentiable in x and all four weights (spec 29.7)."""
    _check_float_tensor("x", x, 2)
    if x.dim() != 2:
        raise ValueError(f"x must have shape [M, D]; got {tuple(x.shape)}")
    _check_on("router_weight", router_weight, "x's", x.device)
    _check_float_tensor("router_weight", router_weight, 2)
    experts = router_weight.shape[0]
    router_weight = _check_param("router_weight", router_weight, (experts, x.shape[1]), "x", x)
    _check_on("gate_proj", gate_proj, "x's", x.device)
    _check_float_tensor("gate_proj", gate_proj, 3)
    inter = gate_proj.shape[1]
    gate_proj = _check_param("gate_proj", gate_proj, (experts, inter, x.shape[1]), "x", x)
    up_proj = _check_param("up_proj", up_proj, (experts, inter, x.shape[1]), "x", x)
    down_proj = _check_param("down_proj", down_proj, (experts, x.shape[1], inter), "x", x)
    top_k = _positive_int("top_k", top_k, experts, " (the number of experts E)")
    if not isinstance(norm_topk_prob, bool):
        raise TypeError(f"norm_topk_prob must be a bool; got {type(norm_topk_prob).__name__}")
    dense = (_dense(t.to(torch.float32)) for t in (x, router_weight, gate_proj, up_proj, down_proj))
    return _autograd.moe(_resolve(backend, x.device), *dense, top_k, norm_topk_prob)


def embedding(tokens, weight, *, backend=None):
    """The token embedding: weight [V, D] rows gathered by tokens int64 [...] -> [..., D] (exact data movement).
    Differentiable in weight: row v's gradient is the row fold (spec 29.1, 29.8) of the gradients of the
    positions holding token v, in row-major order, -0.0 for tokens that do not occur; never torch's
    index_put/scatter-add, whose accumulation order is the device's. Float weight float32, bfloat16 or
    float16 (upcast exactly), result float32. Same bits on numpy, cpu, cuda and ascend."""
    _check_float_tensor("weight", weight, 2)
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape [V, D]; got {tuple(weight.shape)}")
    tokens = _check_index_tensor("tokens", tokens, "of any shape", tokens.shape if isinstance(tokens, torch.Tensor)
                                 else (), weight.device, "weight's")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= weight.shape[0]):
        raise ValueError(f"tokens must lie in [0, {weight.shape[0]}) (weight's rows); got "
                         f"{int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())}")
    flat = _autograd.embedding(_resolve(backend, weight.device), _dense(tokens).reshape(-1), _dense(weight))
    return flat.reshape(*tokens.shape, weight.shape[1])
