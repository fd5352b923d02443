"""TRL's log-prob helpers (TRL 1.16.0: trl/trainer/utils.py) and, from TRL 1.10, the PPO advantage computation and
masked statistics (trl/experimental/ppo/ppo_trainer.py and trl/trainer/utils.py; TRL 1.13 removed PPO and these),
computed by bitparity's canonical ops. docs/conventions.md lists the differences (TRL's masked_var gives NaN for
one counted entry and raises for none; bitparity gives 0). A temperature is applied inside the canonical op
(spec 8.1), where TRL divides the logits first: one rounding fewer, so the values are TRL's within rounding, not
its bits. Masks may be bool or 0/1 tensors (any other value is refused); errors name TRL's arguments."""

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


def _row_mask(row_mask, index):
    """row_mask as bool, of index's shape (TRL: rows whose mask is 0 give 0)."""
    mask = check_mask("row_mask", row_mask)
    if mask.shape != index.shape:
        raise ValueError(f"row_mask must have index's shape {tuple(index.shape)}; got {tuple(mask.shape)}")
    return mask


def selective_log_softmax(logits, index, temperature=1.0, row_mask=None):
    """log_softmax(logits / temperature) gathered at index, of index's shape: logits.shape[:-1] (one token per
    row) or logits.shape[:-1] + (K,); 0.0 where row_mask (index's shape) is 0."""
    if tensor("index", index).dim() != tensor("logits", logits).dim():
        with caller_names(tokens="index"):
            out = ops.token_logprobs(logits, index, temperature)
    else:
        with caller_names(x="logits"):
            full = ops.log_softmax(logits, temperature=temperature)
        ops._check_index_tensor("index", index, "logits.shape[:-1] + (K,)", (*logits.shape[:-1], index.shape[-1]),
                                logits.device)
        if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < logits.shape[-1]:
            raise ValueError(f"index must lie in [0, {logits.shape[-1]}) (the vocabulary size); got "
                             f"{int(index.min()) if int(index.min()) < 0 else int(index.max())}")
        out = full.gather(-1, index)
    return out if row_mask is None else out.masked_fill(~_row_mask(row_mask, index), 0.0)


def entropy_from_logits(logits, chunk_size=128):
    """The entropy of softmax(logits) per row, of shape logits.shape[:-1]. chunk_size is TRL's memory knob (rows
    per chunk): an int >= 1 that changes no bit, every row being computed alone."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1; got {chunk_size!r}")
    return ops.entropy(logits)


def selective_log_softmax_and_entropy(logits, index, entropy_requires_grad=True, temperature=1.0, row_mask=None):
    """(log-probs at index, entropies) of softmax(logits / temperature), both of index's shape logits.shape[:-1];
    0.0 where row_mask is 0. entropy_requires_grad=False detaches the entropies (TRL computes them under
    no_grad)."""
    if not isinstance(entropy_requires_grad, bool):
        raise TypeError(f"entropy_requires_grad must be a bool; got {type(entropy_requires_grad).__name__}")
    if tensor("index", index).dim() != tensor("logits", logits).dim() - 1:
        raise ValueError(f"index must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])} (one token per "
                         f"row); got {tuple(index.shape)}")
    logprobs = selective_log_softmax(logits, index, temperature, row_mask)
    with caller_names(x="logits"):
        entropy = ops.entropy(logits, temperature=temperature)
    if not entropy_requires_grad:
        entropy = entropy.detach()
    return logprobs, entropy if row_mask is None else entropy.masked_fill(~_row_mask(row_mask, index), 0.0)
