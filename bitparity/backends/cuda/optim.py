"""adamw_step and sgd_step (spec 29.12): one optimizer step, element-wise, as canonical.adamw_step and
canonical.sgd_step.

The host values (bias corrections, RN32 of the hyper-parameters) arrive as
float32 values; each kernel does the device part in the spec's order, one
rounding per operation.  An optional term (AdamW's decay, SGD's weight decay
and momentum) that is off is None, a compile-time constant, so it is not in
the kernel at all.  The results are new tensors: w, m, v (and buf) are read,
never written in place.
"""

import torch
import triton
import triton.language as tl

from ... import spec
from .canonical import POS_INF, recip, sqrt32
from .layout import block_elements, launch

TWO_M64: tl.constexpr = tl.constexpr(spec.f32(spec.TWO_M64_BITS))
TWO_P64: tl.constexpr = tl.constexpr(spec.f32(spec.TWO_P64_BITS))


@triton.jit
def scaled_square_term(g, c2):
    # c2 * (g * g) as if g * g had an unbounded exponent (spec 29.12): where g * g
    # overflows (|g| >= 2**64), ((c2 * (h * h)) * 2**64) * 2**64 with h = g * 2**-64,
    # the same roundings scaled by exact powers of two.
    gg = g * g
    h = g * TWO_M64
    scaled = ((c2 * (h * h)) * TWO_P64) * TWO_P64
    return tl.where(gg == POS_INF, scaled, c2 * gg)


@triton.jit
def adamw_kernel(w_ptr, g_ptr, m_ptr, v_ptr, w_out_ptr, m_out_ptr, v_out_ptr, n,
                 decay, b1, c1, b2, c2, ibc2, eps, step, BLOCK: tl.constexpr):
    # w, g, m, v and the outputs: [n].  One program: BLOCK elements.
    #   w = w * decay;  m = (b1 * m) + (c1 * g);  v = (b2 * v) + (c2 * (g * g)) (scaled_square_term);
    #   den = (sqrt32(v) * ibc2) + eps;  w = w - (m * recip(den)) * step.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    g = tl.load(g_ptr + offs, mask=ok, other=0.0)
    if decay is not None:
        w = w * decay
    m = b1 * tl.load(m_ptr + offs, mask=ok, other=0.0) + c1 * g
    v = b2 * tl.load(v_ptr + offs, mask=ok, other=0.0) + scaled_square_term(g, c2)
    den = (sqrt32(v) * ibc2) + eps
    tl.store(w_out_ptr + offs, w - (m * recip(den)) * step, mask=ok)
    tl.store(m_out_ptr + offs, m, mask=ok)
    tl.store(v_out_ptr + offs, v, mask=ok)


@triton.jit
def sgd_kernel(w_ptr, g_ptr, buf_ptr, w_out_ptr, buf_out_ptr, n, lr, momentum, one_minus_dampening, weight_decay,
               FIRST: tl.constexpr, NESTEROV: tl.constexpr, BLOCK: tl.constexpr):
    # w, g, buf and the outputs: [n].  One program: BLOCK elements.
    #   g = g + weight_decay * w;
    #   buf = g on the FIRST step, else momentum * buf + one_minus_dampening * g;
    #   g = g + momentum * buf (NESTEROV) or buf;  w = w - lr * g.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    g = tl.load(g_ptr + offs, mask=ok, other=0.0)
    if weight_decay is not None:
        g = g + weight_decay * w
    if momentum is not None:
        if FIRST:
            buf = g
        else:
            buf = momentum * tl.load(buf_ptr + offs, mask=ok, other=0.0) + one_minus_dampening * g
        tl.store(buf_out_ptr + offs, buf, mask=ok)
        if NESTEROV:
            g = g + momentum * buf
        else:
            g = buf
    tl.store(w_out_ptr + offs, w - lr * g, mask=ok)


def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
    outs = torch.empty_like(w), torch.empty_like(w), torch.empty_like(w)
    n = w.numel()
    block = block_elements(n)
    launch(adamw_kernel, triton.cdiv(n, block), w, g, m, v, *outs, n, None if decay is None else float(decay),
           float(b1), float(c1), float(b2), float(c2), float(ibc2), float(eps), float(step), BLOCK=block)
    return outs


def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
    w_out = torch.empty_like(w)
    buf_out = None if momentum == 0 else torch.empty_like(w)
    n = w.numel()
    block = block_elements(n)
    launch(sgd_kernel, triton.cdiv(n, block), w, g, w if buf is None else buf, w_out,
           w_out if buf_out is None else buf_out, n, float(lr), None if momentum == 0 else float(momentum),
           float(one_minus_dampening), None if weight_decay == 0 else float(weight_decay),
           FIRST=buf is None, NESTEROV=bool(nesterov), BLOCK=block)
    return w_out, buf_out
