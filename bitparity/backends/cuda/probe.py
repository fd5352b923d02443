"""Single Triton operations for `bitparity probe --backend cuda` (bitparity/compare/probe.py).

These kernels are not part of the canonical path: they run one platform
operation each (+, *, /, div_rn, sqrt, sqrt_rn, exp, log, a*b+c) so the probe
can test what the platform's arithmetic does.  a*b+c is launched twice: with
Triton's default options (on a GPU these contract it into fma.rn.f32) and with
the options every bitparity kernel uses (layout.LAUNCH_OPTIONS).
"""

import numpy as np
import torch
import triton
import triton.language as tl

from .. import device_type
from . import NAME
from .layout import LAUNCH_OPTIONS, block_elements


@triton.jit
def binary_kernel(a_ptr, b_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    # a, b, out: [n].  One program: BLOCK elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    a = tl.load(a_ptr + offs, mask=ok, other=1.0)
    b = tl.load(b_ptr + offs, mask=ok, other=1.0)
    if OP == "add":
        r = a + b
    elif OP == "mul":
        r = a * b
    elif OP == "div":
        r = a / b
    else:
        r = tl.math.div_rn(a, b)
    tl.store(out_ptr + offs, r, mask=ok)


@triton.jit
def unary_kernel(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    # x, out: [n].  One program: BLOCK elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=1.0)
    if OP == "sqrt":
        r = tl.sqrt(x)
    elif OP == "sqrt_rn":
        r = tl.sqrt_rn(x)
    elif OP == "exp":
        r = tl.exp(x)
    else:
        r = tl.log(x)
    tl.store(out_ptr + offs, r, mask=ok)


@triton.jit
def muladd_kernel(a_ptr, b_ptr, c_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # a, b, c, out: [n].  One program: BLOCK elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    a = tl.load(a_ptr + offs, mask=ok, other=1.0)
    b = tl.load(b_ptr + offs, mask=ok, other=1.0)
    c = tl.load(c_ptr + offs, mask=ok, other=1.0)
    tl.store(out_ptr + offs, a * b + c, mask=ok)


def _run(kernel, arrays, options, **constexprs):
    """Launch kernel over float32 numpy arrays of one length; the result as a numpy array."""
    inputs = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device_type(NAME)) for a in arrays]
    out = torch.empty_like(inputs[0])
    n = out.numel()
    block = block_elements(n)
    with np.errstate(all="ignore"):
        kernel[(triton.cdiv(n, block),)](*inputs, out, n, **constexprs, BLOCK=block, **options)
    return out.cpu().numpy()


def binary(op, a, b):
    """op in ("add", "mul", "div", "div_rn"), with bitparity's launch options."""
    return _run(binary_kernel, (a, b), LAUNCH_OPTIONS, OP=op)


def unary(op, x):
    """op in ("sqrt", "sqrt_rn", "exp", "log"), with bitparity's launch options."""
    return _run(unary_kernel, (x,), LAUNCH_OPTIONS, OP=op)


def muladd(a, b, c, default_options):
    """a * b + c, compiled with Triton's default options or with bitparity's."""
    return _run(muladd_kernel, (a, b, c), {} if default_options else LAUNCH_OPTIONS)
