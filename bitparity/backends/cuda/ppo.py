"""ppo_policy_loss: verl's clipped surrogate and its aggregations (spec 17), as canonical.ppo_policy_loss.

One elementwise kernel writes every token's loss and clipped flag (1.0 or
0.0); the aggregations are then canonical sums and masked means of those
(masked.masked_mean, reduce.sum), each row or the whole [B * T] tensor as
one row following the reduction structure of its own length.
"""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import nan_clamp, nan_max, nan_min, negate
from .layout import block_elements, launch
from .masked import masked_mean
from .reduce import sum as canonical_sum


@triton.jit
def ppo_token_kernel(logp_ptr, old_ptr, adv_ptr, loss_ptr, clipped_ptr, n,
                     ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK: tl.constexpr):
    # logp, old, adv, loss, clipped: [n].  One program: BLOCK elements, as
    # canonical.ppo_token_losses.  An unset dual_clip or ratio_clamp is None,
    # a compile-time constant, so that step is not in the kernel at all.
    # ratio_clamp is positive (ops.py checks), so -ratio_clamp, which Triton
    # computes as 0 - ratio_clamp, is its exact negation.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    d = tl.load(logp_ptr + offs, mask=ok, other=0.0) - tl.load(old_ptr + offs, mask=ok, other=0.0)
    if ratio_clamp is not None:
        d = nan_clamp(d, -ratio_clamp, ratio_clamp)
    ratio = canonical.exp(d)
    adv = tl.load(adv_ptr + offs, mask=ok, other=0.0)
    neg_adv = negate(adv)
    loss1 = neg_adv * ratio
    loss2 = neg_adv * nan_clamp(ratio, ratio_low, ratio_high)
    # ratio >= +0.0 and the clipped ratio > 0, so loss1 and loss2 never are
    # zeros of opposite signs: the maximum has one answer on every platform.
    loss = nan_max(loss1, loss2)
    if dual_clip is not None:
        loss = tl.where(adv < 0.0, nan_min(neg_adv * dual_clip, loss), loss)
    tl.store(loss_ptr + offs, loss, mask=ok)
    tl.store(clipped_ptr + offs, tl.where(loss2 > loss1, 1.0, 0.0), mask=ok)


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    loss = torch.empty_like(logp)
    clipped = torch.empty_like(logp)
    n = logp.numel()
    block = block_elements(n)
    launch(ppo_token_kernel, triton.cdiv(n, block), logp, old_logp, advantages, loss, clipped, n,
           ratio_low, ratio_high, dual_clip, ratio_clamp, BLOCK=block)
    if agg == "token-mean":
        total = masked_mean(loss.reshape(1, -1), mask.reshape(1, -1))
    elif agg == "seq-mean-token-sum":
        total = masked_mean(canonical_sum(loss, mask).reshape(1, -1), None)
    else:
        total = masked_mean(masked_mean(loss, mask).reshape(1, -1), None)
    frac = masked_mean(clipped.reshape(1, -1), mask.reshape(1, -1))
    return total.reshape(()), frac.reshape(())
