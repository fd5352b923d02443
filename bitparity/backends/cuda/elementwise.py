"""Element-wise ops on 1-D tensors: exp and log (spec 5, 6) and silu_mul (spec 24.5)."""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import negate, reciprocal
from .layout import block_elements, launch


@triton.jit
def exp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # x, out: [n].  One program: BLOCK elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, canonical.exp(x), mask=ok)


@triton.jit
def log_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # x, out: [n].  One program: BLOCK elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=1.0)
    tl.store(out_ptr + offs, canonical.log(x), mask=ok)


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # gate, up, out: [n].  One program: BLOCK elements.
    #   e = exp(-|g|), r = reciprocal(1 + e) (1 + e in [1, 2]: spec 7's domain),
    #   sigmoid = r for g >= 0, else e * r;  out = (g * sigmoid) * u.
    # -|g| is a sign flip of |g| (negate), as numpy's negative: no 0 - x.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    g = tl.load(gate_ptr + offs, mask=ok, other=0.0)
    u = tl.load(up_ptr + offs, mask=ok, other=0.0)
    e = canonical.exp(negate(tl.abs(g)))
    r = reciprocal(1.0 + e)
    sigmoid = tl.where(g >= 0.0, r, e * r)
    tl.store(out_ptr + offs, (g * sigmoid) * u, mask=ok)


def _launch(kernel, x, *more):
    out = torch.empty_like(x)
    n = x.numel()
    block = block_elements(n)
    launch(kernel, triton.cdiv(n, block), x, *more, out, n, BLOCK=block)
    return out


def exp(x):
    return _launch(exp_kernel, x)


def log(x):
    return _launch(log_kernel, x)


def silu_mul(gate, up):
    return _launch(silu_mul_kernel, gate, up)
