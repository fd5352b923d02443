"""kl_penalty: the KL estimators of d = ref_logp - logp (spec 16), as canonical.kl_penalty."""

import torch
import triton
import triton.language as tl

from .canonical import HALF, k3, nan_clamp, negate
from .layout import block_elements, launch


@triton.jit
def kl_penalty_kernel(logp_ptr, ref_ptr, out_ptr, n, clamp, log_ratio_clamp,
                      KIND: tl.constexpr, BLOCK: tl.constexpr):
    # logp, ref, out: [n].  One program: BLOCK elements.  An unset clamp is
    # None, a compile-time constant, so its clamp is not in the kernel at all.
    # A clamp bound c is positive (ops.py checks), so -c, which Triton
    # computes as 0 - c, is its exact negation.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    d = tl.load(ref_ptr + offs, mask=ok, other=0.0) - tl.load(logp_ptr + offs, mask=ok, other=0.0)
    if log_ratio_clamp is not None:
        d = nan_clamp(d, -log_ratio_clamp, log_ratio_clamp)
    if KIND == "k1":
        out = negate(d)
    elif KIND == "abs":
        out = tl.abs(d)
    elif KIND == "k2":
        out = (d * d) * HALF
    else:
        out = k3(d)
    if clamp is not None:
        out = nan_clamp(out, -clamp, clamp)
    tl.store(out_ptr + offs, out, mask=ok)


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    out = torch.empty_like(logp)
    n = logp.numel()
    block = block_elements(n)
    launch(kl_penalty_kernel, triton.cdiv(n, block), logp, ref_logp, out, n, clamp, log_ratio_clamp,
           KIND=kind, BLOCK=block)
    return out
