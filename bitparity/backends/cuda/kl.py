"""kl_penalty: the KL estimators of d = ref_logp - logp (spec 16), as canonical.kl_penalty,
and their gradient (spec 26.9), as canonical.kl_penalty_backward."""

import torch
import triton
import triton.language as tl

from .canonical import HALF, k3, k3_derivative, nan_clamp, negate
from .layout import block_elements, launch


@triton.jit
def _estimator(d, KIND: tl.constexpr):
    # d: [BLOCK], the clamped log-ratio -> the estimator KIND of it, before the clamp of its value.
    if KIND == "k1":
        out = negate(d)
    elif KIND == "abs":
        out = tl.abs(d)
    elif KIND == "k2":
        out = (d * d) * HALF
    else:
        out = k3(d)
    return out


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
    out = _estimator(d, KIND)
    if clamp is not None:
        out = nan_clamp(out, -clamp, clamp)
    tl.store(out_ptr + offs, out, mask=ok)


@triton.jit
def kl_penalty_backward_kernel(logp_ptr, ref_ptr, g_ptr, out_ptr, n, clamp, log_ratio_clamp,
                               KIND: tl.constexpr, BLOCK: tl.constexpr):
    # logp, ref, g, out: [n]; out = the gradient w.r.t. ref_logp, as
    # canonical.kl_penalty_backward (logp's is its sign flip, taken in ops.py):
    #   k1: -g;  abs: g * sign(d) (0 at d = 0, NaN for NaN);  k2: g * d;  k3: g * k3'(d);
    # then +0.0 where a clamp holds the value constant: the estimator strictly
    # outside [-clamp, clamp], or d0 = ref - logp strictly outside
    # [-log_ratio_clamp, log_ratio_clamp].  A value on a bound, or NaN (every
    # comparison false), passes.  Unset clamps are None, as in the forward.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    d0 = tl.load(ref_ptr + offs, mask=ok, other=0.0) - tl.load(logp_ptr + offs, mask=ok, other=0.0)
    d = d0
    if log_ratio_clamp is not None:
        d = nan_clamp(d0, -log_ratio_clamp, log_ratio_clamp)
    g = tl.load(g_ptr + offs, mask=ok, other=0.0)
    if KIND == "k1":
        gd = negate(g)
    elif KIND == "abs":
        sign = tl.where(d > 0.0, 1.0, tl.where(d < 0.0, -1.0, 0.0))
        gd = g * tl.where(d != d, d, sign)
    elif KIND == "k2":
        gd = g * d
    else:
        gd = g * k3_derivative(d)
    if clamp is not None:
        out = _estimator(d, KIND)
        gd = tl.where((out < -clamp) | (out > clamp), 0.0, gd)
    if log_ratio_clamp is not None:
        gd = tl.where((d0 < -log_ratio_clamp) | (d0 > log_ratio_clamp), 0.0, gd)
    tl.store(out_ptr + offs, gd, mask=ok)


def _launch(kernel, tensors, clamp, log_ratio_clamp, kind):
    # tensors: the kernel's tensor arguments in order, the last the output.
    n = tensors[0].numel()
    block = block_elements(n)
    launch(kernel, triton.cdiv(n, block), *tensors, n, clamp, log_ratio_clamp, KIND=kind, BLOCK=block)
    return tensors[-1]


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    return _launch(kl_penalty_kernel, (logp, ref_logp, torch.empty_like(logp)), clamp, log_ratio_clamp, kind)


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    return _launch(kl_penalty_backward_kernel, (logp, ref_logp, g, torch.empty_like(logp)), clamp,
                   log_ratio_clamp, kind)
