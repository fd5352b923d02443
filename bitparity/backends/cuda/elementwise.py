"""Element-wise ops on 1-D tensors: exp and log (spec 5, 6), silu_mul (spec 24.5) and its backward (spec 29.5)."""

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
def _sigmoid(gate):
    # gate: [BLOCK] -> sigmoid(gate), as canonical._sigmoid: e = exp(-|gate|),
    # r = reciprocal(1 + e) (1 + e in [1, 2]: spec 7's domain), r for gate >= 0, else e * r.
    # -|gate| is a sign flip of |gate| (negate), as numpy's negative: no 0 - x.
    e = canonical.exp(negate(tl.abs(gate)))
    r = reciprocal(1.0 + e)
    return tl.where(gate >= 0.0, r, e * r)


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # gate, up, out: [n].  One program: BLOCK elements.  out = (g * sigmoid(g)) * u.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    g = tl.load(gate_ptr + offs, mask=ok, other=0.0)
    u = tl.load(up_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, (g * _sigmoid(g)) * u, mask=ok)


@triton.jit
def silu_mul_backward_kernel(gate_ptr, up_ptr, g_ptr, d_gate_ptr, d_up_ptr, n, BLOCK: tl.constexpr):
    # gate, up, g, d_gate, d_up: [n].  One program: BLOCK elements.  With the forward's sig:
    #   d_up = g * (gate * sig),  d_gate = (g * up) * (sig * (1 + gate * (1 - sig))).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    gate = tl.load(gate_ptr + offs, mask=ok, other=0.0)
    up = tl.load(up_ptr + offs, mask=ok, other=0.0)
    g = tl.load(g_ptr + offs, mask=ok, other=0.0)
    sig = _sigmoid(gate)
    d_silu = sig * (1.0 + gate * (1.0 - sig))
    tl.store(d_gate_ptr + offs, (g * up) * d_silu, mask=ok)
    tl.store(d_up_ptr + offs, g * (gate * sig), mask=ok)


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


def silu_mul_backward(gate, up, g):
    d_gate, d_up = torch.empty_like(gate), torch.empty_like(gate)
    n = gate.numel()
    block = block_elements(n)
    launch(silu_mul_backward_kernel, triton.cdiv(n, block), gate, up, g, d_gate, d_up, n, BLOCK=block)
    return d_gate, d_up
