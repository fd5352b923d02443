"""ppo_policy_loss: verl's clipped surrogate and its aggregations (spec 17), as canonical.ppo_policy_loss,
and its gradient w.r.t. logp (spec 26.10), as canonical.ppo_policy_loss_backward.

One elementwise kernel writes every token's loss and clipped flag (1.0 or
0.0); the aggregations are then canonical sums and masked means of those
(masked.masked_mean, reduce.sum), each row or the whole [B * T] tensor as
one row following the reduction structure of its own length.

The sequence modes average over the non-empty sequences, a masked mean with
mask e_b = (n_b > 0); seq-mean-token-sum-norm then scales by reciprocal(T).

The backward runs the aggregation backwards first: the weight of each token,
d(loss)/d(token loss), comes from masked.masked_mean_backward (and, for the
sum over a sequence, its backward select(m, g, +0.0)); one elementwise kernel
then recomputes the token's surrogates and passes weight * loss1 where no
clip (the ratio clip, the dual clip, the log-ratio clamp) holds the loss constant.
"""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import nan_clamp, nan_max, nan_min, negate
from .layout import block_elements, launch
from .masked import masked_mean, masked_mean_backward
from .reduce import sum as canonical_sum


@triton.jit
def _surrogates(logp_ptr, old_ptr, adv_ptr, offs, ok, ratio_low, ratio_high, ratio_clamp):
    # offs, ok: [BLOCK] -> (d0, adv, neg_adv, loss1, loss2), each [BLOCK], as
    # canonical.ppo_token_losses: d0 = logp - old_logp, clamped to
    # [-ratio_clamp, ratio_clamp] when that is set (not None), ratio = exp(d),
    # neg_adv = -adv (a sign flip), loss1 = neg_adv * ratio and loss2 =
    # neg_adv * (ratio clamped to [ratio_low, ratio_high]).  ratio_clamp is
    # positive (ops.py checks), so -ratio_clamp, which Triton computes as
    # 0 - ratio_clamp, is its exact negation.
    d0 = tl.load(logp_ptr + offs, mask=ok, other=0.0) - tl.load(old_ptr + offs, mask=ok, other=0.0)
    d = d0
    if ratio_clamp is not None:
        d = nan_clamp(d0, -ratio_clamp, ratio_clamp)
    ratio = canonical.exp(d)
    adv = tl.load(adv_ptr + offs, mask=ok, other=0.0)
    neg_adv = negate(adv)
    return d0, adv, neg_adv, neg_adv * ratio, neg_adv * nan_clamp(ratio, ratio_low, ratio_high)


@triton.jit
def ppo_token_kernel(logp_ptr, old_ptr, adv_ptr, loss_ptr, clipped_ptr, n,
                     ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK: tl.constexpr):
    # logp, old, adv, loss, clipped: [n].  One program: BLOCK elements, as
    # canonical.ppo_token_losses.  An unset dual_clip or ratio_clamp is None,
    # a compile-time constant, so that step is not in the kernel at all.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    _, adv, neg_adv, loss1, loss2 = _surrogates(logp_ptr, old_ptr, adv_ptr, offs, ok,
                                                ratio_low, ratio_high, ratio_clamp)
    # ratio >= +0.0 and the clipped ratio > 0, so loss1 and loss2 never are
    # zeros of opposite signs: the maximum has one answer on every platform.
    loss = nan_max(loss1, loss2)
    if dual_clip is not None:
        loss = tl.where(adv < 0.0, nan_min(neg_adv * dual_clip, loss), loss)
    tl.store(loss_ptr + offs, loss, mask=ok)
    tl.store(clipped_ptr + offs, tl.where(loss2 > loss1, 1.0, 0.0), mask=ok)


@triton.jit
def ppo_backward_kernel(logp_ptr, old_ptr, adv_ptr, mask_ptr, weight_ptr, out_ptr, n,
                        ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK: tl.constexpr):
    # logp, old, adv, mask, weight, out: [n]; out = the gradient w.r.t. logp
    # (spec 26.10): select(passes, weight * loss1, +0.0), loss1 being also
    # d(loss1)/d(logp).  A token passes when it counts and no clip holds its
    # loss constant: not loss2 > loss1 (the clip; a tie passes loss1), not the
    # dual clip's na * c < max(loss1, loss2) where adv < 0, not d0 strictly
    # outside the ratio clamp.  Written as negated tests, so NaN passes.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    d0, adv, neg_adv, loss1, loss2 = _surrogates(logp_ptr, old_ptr, adv_ptr, offs, ok,
                                                 ratio_low, ratio_high, ratio_clamp)
    passes = tl.load(mask_ptr + offs, mask=ok, other=False) & ~(loss2 > loss1)
    if dual_clip is not None:
        passes = passes & ~((adv < 0.0) & (neg_adv * dual_clip < nan_max(loss1, loss2)))
    if ratio_clamp is not None:
        passes = passes & ~((d0 < -ratio_clamp) | (d0 > ratio_clamp))
    weight = tl.load(weight_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, tl.where(passes, weight * loss1, 0.0), mask=ok)


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    loss = torch.empty_like(logp)
    clipped = torch.empty_like(logp)
    n = logp.numel()
    block = block_elements(n)
    launch(ppo_token_kernel, triton.cdiv(n, block), logp, old_logp, advantages, loss, clipped, n,
           ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK=block)
    if agg == "token-mean":
        total = masked_mean(loss.reshape(1, -1), mask.reshape(1, -1))
    else:
        # The sequence modes average over the non-empty sequences (spec 17.2): a masked mean over the
        # B per-sequence values with mask e_b = (n_b > 0).
        if agg == "seq-mean-token-mean":
            per_sequence = masked_mean(loss, mask)
        else:
            per_sequence = canonical_sum(loss, mask)
        total = masked_mean(per_sequence.reshape(1, -1), _non_empty(mask))
        if agg == "seq-mean-token-sum-norm":
            total = _per_token(total, mask.shape[1])
    frac = masked_mean(clipped.reshape(1, -1), mask.reshape(1, -1))
    return total.reshape(()), frac.reshape(())


def _non_empty(mask):
    """[B, T] bool -> [1, B] bool: e_b = (n_b > 0), the sequences the sequence modes average over."""
    return mask.any(dim=1).reshape(1, -1).contiguous()


def _per_token(x, n_tokens):
    """x: f32 [1] -> f32 [1]: x * reciprocal(float(T)), T = n_tokens >= 1, by masked_mean_backward over a row
    of T counted entries (g * R(T), R(T) = reciprocal(T) for T >= 1; every entry is the same)."""
    every_token = torch.ones((1, n_tokens), dtype=torch.bool, device=x.device)
    return masked_mean_backward(every_token, x)[:, 0].contiguous()


def _token_weights(mask, agg, g):
    """[B, T] bool, g f32 [1] -> f32 [B, T]: each counted token's w_b (spec 26.10), by the backward of
    the forward's aggregation; what is at the other tokens does not matter (the kernel selects them out)."""
    if agg == "token-mean":
        return masked_mean_backward(mask.reshape(1, -1), g).reshape(mask.shape)        # g * R(n)
    if agg == "seq-mean-token-sum-norm":
        g = _per_token(g, mask.shape[1])                                             # g * reciprocal(T)
    per_sequence = masked_mean_backward(_non_empty(mask), g).reshape(-1)              # g * R(E)
    if agg == "seq-mean-token-mean":
        return masked_mean_backward(mask, per_sequence)                              # (g * R(E)) * R(n_b)
    return torch.where(mask, per_sequence[:, None], 0.0)          # the sum's backward (spec 26.11): data movement


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp,
                             agg, g):
    out = torch.empty_like(logp)
    n = logp.numel()
    block = block_elements(n)
    launch(ppo_backward_kernel, triton.cdiv(n, block), logp, old_logp, advantages, mask,
           _token_weights(mask, agg, g), out, n, ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK=block)
    return out
