"""exp and log of a 1-D tensor: the portable functions of spec 5 and 6."""

import torch
import triton
import triton.language as tl

from . import canonical
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


def _launch(kernel, x):
    out = torch.empty_like(x)
    n = x.numel()
    block = block_elements(n)
    launch(kernel, triton.cdiv(n, block), x, out, n, BLOCK=block)
    return out


def exp(x):
    return _launch(exp_kernel, x)


def log(x):
    return _launch(log_kernel, x)
