"""verl's advantage, loss and KL functions (verl 0.10.0.dev, verl/trainer/ppo/core_algos.py and
verl/utils/torch_functional.py), computed by bitparity's canonical ops. Masks may be bool or 0/1 tensors,
as verl passes them (any other value is refused). Errors name verl's arguments. docs/conventions.md lists the
differences (empty masks; positions outside the mask).
"""

import torch

from .. import ops
from ._common import caller_names, check_mask, clip_bounds, dp_size_checked, host_factor, positive, tensor

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_NAMES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """(advantages, returns): verl's masked GAE (masked positions carry the next value and advantage), returns
    from the raw advantages, then the advantages whitened over response_mask (unbiased variance, eps 1e-8)."""
    mask = check_mask("response_mask", response_mask)
    with caller_names(rewards="token_level_rewards", mask="response_mask", x="token_level_rewards"):
        advantages, returns = ops.gae(token_level_rewards, values, mask, gamma, lam, mask_mode="carry")
    return ops.masked_whiten(advantages, mask), returns


def masked_mean(values, mask, axis=None):
    """sum(values * mask) / (mask.sum() + 1e-8), over everything or along axis; 0 for an empty mask."""
    with caller_names(x="values", dim="axis"):
        return ops.masked_mean(values, check_mask("mask", mask), axis)


def masked_whiten(values, mask, shift_mean=True):
    """(values - mean) * rsqrt(unbiased var + 1e-8) over mask."""
    with caller_names(x="values"):
        return ops.masked_whiten(values, check_mask("mask", mask), shift_mean=shift_mean)


def logprobs_from_logits(logits, labels, inplace_backward=True):  # noqa: ARG001 - verl's signature
    """log_softmax(logits) at labels."""
    with caller_names(tokens="labels"):
        return ops.token_logprobs(logits, labels)


def entropy_from_logits(logits):
    """The entropy of softmax(logits) per row."""
    return ops.entropy(logits)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """verl's loss aggregation, every mode. Sequence modes average over the non-empty sequences (or divide by
    global_batch_size when given); token modes divide by batch_num_tokens when given; dp_size multiplies."""
    if loss_agg_mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(AGG_MODES)}; got {loss_agg_mode!r}")
    dp_size = dp_size_checked(dp_size)
    for name, value in (("batch_num_tokens", batch_num_tokens), ("global_batch_size", global_batch_size),
                        ("loss_scale_factor", loss_scale_factor)):
        if value is not None:                                  # checked even where the mode does not use it
            positive(name, value)
    ops._check_float_tensor("loss_mat", loss_mat, 1)
    mask = check_mask("loss_mask", loss_mask)
    with caller_names(x="loss_mat", mask="loss_mask"):
        ops._check_mask(mask, loss_mat)
    if loss_agg_mode.startswith("token-"):
        if loss_agg_mode == "token-mean" and batch_num_tokens is None:
            _local_only(dp_size, "batch_num_tokens")
            return ops.masked_mean(loss_mat, mask)
        total = ops.sum(loss_mat.reshape(1, -1), mask.reshape(1, -1))[0]
        scale = dp_size if loss_agg_mode == "token-sum" else host_factor(dp_size, batch_num_tokens, "batch_num_tokens")
        return total * scale
    per_sequence = (ops.sum(loss_mat, mask) if loss_agg_mode != "seq-mean-token-mean"
                    else ops.masked_mean(loss_mat, mask, -1))
    non_empty = mask.any(dim=-1)
    if global_batch_size is None:
        _local_only(dp_size, "global_batch_size")
        loss = ops.masked_mean(per_sequence, non_empty)
    else:
        loss = ops.sum(per_sequence, non_empty) * host_factor(dp_size, global_batch_size, "global_batch_size")
    if loss_agg_mode == "seq-mean-token-sum-norm":
        factor = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        loss = loss * host_factor(1, factor, "loss_scale_factor")
    return loss


def _local_only(dp_size, what):
    if dp_size != 1:
        raise ValueError(f"{what} must be given when dp_size > 1 (verl raises too); got dp_size={dp_size}")


def kl_penalty(logprob, ref_logprob, kl_penalty):  # noqa: A002 - verl's argument name
    """verl's KL estimators of d = logprob - ref_logprob: kl/k1 = d, abs, mse/k2 = d^2 / 2, low_var_kl/k3 with
    the log-ratio clamped to +-20 and the result to +-10. A trailing "+" gives the value of the estimator
    with the gradient of k2 (verl's straight-through form)."""
    name = kl_penalty
    straight_through = isinstance(name, str) and name.endswith("+")
    base = name[:-1] if straight_through else name
    if base not in KL_NAMES:
        raise NotImplementedError(f"kl_penalty must be one of {', '.join(KL_NAMES)} (optionally with '+'); "
                                  f"got {name!r}")
    kind = KL_NAMES[base]
    clamps = {"log_ratio_clamp": 20.0, "clamp": 10.0} if kind == "k3" else {}
    with caller_names(logp="logprob", ref_logp="ref_logprob"):
        value = ops.kl_penalty(logprob, ref_logprob, kind, **clamps)
    if not straight_through or kind == "k2":
        return value
    k2 = ops.kl_penalty(logprob, ref_logprob, "k2")
    return k2 - k2.detach() + value.detach()


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=None, cliprange_low=None,
                        cliprange_high=None, clip_ratio_c=3.0, loss_agg_mode="token-mean"):
    """verl's vanilla PPO loss -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower): the log-ratio clamped to
    +-20, clip [1 - cliprange_low, 1 + cliprange_high] (each defaulting to cliprange, then 0.2), dual clip
    clip_ratio_c on negative advantages, aggregated by agg_loss's mode (local counts). pg_loss is differentiable
    in log_prob; the other three are metrics and carry no gradient."""
    mask = check_mask("response_mask", response_mask)
    # Each bound's name is the argument it came from (cliprange_low, else cliprange, else the default).
    low_name, low = next((n, c) for n, c in (("cliprange_low", cliprange_low), ("cliprange", cliprange),
                                             ("cliprange_low", 0.2)) if c is not None)
    high_name, high = next((n, c) for n, c in (("cliprange_high", cliprange_high), ("cliprange", cliprange),
                                               ("cliprange_high", 0.2)) if c is not None)
    if loss_agg_mode == "token-sum":
        raise ValueError("loss_agg_mode 'token-sum' needs agg_loss; compute_policy_loss takes the averaging modes")
    with caller_names(logp="log_prob", old_logp="old_log_prob", mask="response_mask", x="log_prob", clip_low=low_name,
                      clip_high=high_name, dual_clip="clip_ratio_c", agg="loss_agg_mode"):
        pg_loss, pg_clipfrac = ops.ppo_policy_loss(log_prob, tensor("old_log_prob", old_log_prob).detach(),
                                                   tensor("advantages", advantages).detach(), mask,
                                                   clip_low=low, clip_high=high, dual_clip=clip_ratio_c,
                                                   ratio_clamp=20.0, agg=loss_agg_mode)
    with torch.no_grad():
        # -clamp(log_prob - old, +-20): k1 of d = log_prob - old_log_prob, clamped, is old - log_prob.
        neg_log_ratio = ops.kl_penalty(old_log_prob, log_prob, "k1", log_ratio_clamp=20.0)
        ppo_kl = ops.masked_mean(neg_log_ratio, mask)
        ratio = ops.exp(-neg_log_ratio)
        neg_adv = -advantages
        clipped = torch.maximum(neg_adv * ratio, neg_adv * ratio.clamp(*clip_bounds(low, high)))
        # No dual clip (clip_ratio_c=None): nothing is clipped from below.
        lower = ((clipped > neg_adv * clip_ratio_c) if clip_ratio_c is not None else torch.zeros_like(mask)) & (
            advantages < 0)
        pg_clipfrac_lower = ops.masked_mean(lower.float(), mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower
