"""TRL's PPO advantage computation and masked statistics (TRL 1.10.0.dev0: trl/experimental/ppo/ppo_trainer.py
and trl/trainer/utils.py), computed by bitparity's canonical ops. docs/conventions.md lists the differences
(TRL's masked_var gives NaN for one counted entry and raises for none; bitparity gives 0). Masks may be bool or
0/1 tensors (any other value is refused); errors name TRL's arguments."""

import torch

from .. import ops
from ._common import caller_names, check_mask, host_factor, tensor


def compute_advantages(rewards, values, padding_mask, padding_mask_p1, gamma, lam):
    """(advantages, returns) as TRL's PPO trainer computes them inline: rewards and values zeroed where
    padding_mask_p1 (one position past the response end stays), the unmasked reverse GAE loop, returns =
    advantages + values, then the advantages whitened over ~padding_mask and zeroed where padding_mask."""
    p1, padding = check_mask("padding_mask_p1", padding_mask_p1), check_mask("padding_mask", padding_mask)
    with caller_names(mask="padding_mask_p1", x="rewards"):
        advantages, returns = ops.gae(rewards, values, ~p1, gamma, lam, mask_mode="zero")
    with caller_names(mask="padding_mask", x="rewards"):
        ops._check_mask(padding, rewards)
    return ops.masked_whiten(advantages, ~padding), returns


def masked_mean(values, mask, axis=None):
    """sum(values * mask) / mask.sum(), over everything or along axis (0 for an empty mask, where TRL gives NaN)."""
    with caller_names(x="values", dim="axis"):
        return ops.masked_mean(values, check_mask("mask", mask), axis)


def masked_var(values, mask, unbiased=True):
    """TRL's order: the mean of (values - mean)^2 over mask, times n / (n - 1) when unbiased."""
    mask = check_mask("mask", mask)
    if not isinstance(unbiased, bool):
        raise TypeError(f"unbiased must be a bool; got {type(unbiased).__name__}")
    with caller_names(x="values"):
        mean = ops.masked_mean(values, mask)
    centered = values - mean
    variance = ops.masked_mean(centered * centered, mask)
    n = int(mask.sum())
    if n == 0:
        raise ValueError("mask has no True entry: the variance is undefined (TRL raises too)")
    return variance * host_factor(n, n - 1, "the count minus one") if unbiased and n > 1 else variance


def masked_whiten(values, mask, shift_mean=True):
    """(values - mean) * rsqrt(unbiased var + 1e-8) over mask; 0 outside it (TRL's trainer zero-fills there)."""
    with caller_names(x="values"):
        return ops.masked_whiten(values, check_mask("mask", mask), shift_mean=shift_mean)


def selective_log_softmax(logits, index):
    """log_softmax(logits) gathered at index, of shape logits.shape[:-1] or logits.shape[:-1] + (K,)."""
    if tensor("index", index).dim() != tensor("logits", logits).dim():
        with caller_names(tokens="index"):
            return ops.token_logprobs(logits, index)
    with caller_names(x="logits"):
        out = ops.log_softmax(logits)
    ops._check_index_tensor("index", index, "logits.shape[:-1] + (K,)", (*logits.shape[:-1], index.shape[-1]),
                            logits.device)
    if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < logits.shape[-1]:
        raise ValueError(f"index must lie in [0, {logits.shape[-1]}) (the vocabulary size); got "
                         f"{int(index.min()) if int(index.min()) < 0 else int(index.max())}")
    return out.gather(-1, index)

