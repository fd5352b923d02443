"""gae: generalised advantage estimation by the reverse recurrence (spec 14), as canonical.gae.

canonical.gae carries two values from t + 1 to t: next_v, the value the
step discounts, and last, the advantage.  next_v is a selection, never the
result of arithmetic (the bootstrap, or v at the next counted position in
carry mode, or v[t + 1] zeroed when not counted in zero mode), so every
delta[t] = (r[t] + g * next_v) - v[t] can be computed before the loop, a
tile at a time.  Only last is a true recurrence.  Three kernels:

1. ``gae_delta_kernel``: delta for every position, staged in adv; in carry
   mode also the step's weight w, staged in ret.
2. ``gae_scan_kernel``: the reverse loop, last = delta[t] + w[t] * last from
   last = +0.0, written over delta.  In zero mode w = gl.  In carry mode a
   counted step has w = gl and a masked one delta = -0.0, w = 1.0:
   -0.0 + 1.0 * last == last for every last (a NaN stays a NaN, its
   payload unspecified: spec 9), which is canonical's
   "last = select(m, cand, last)" without a mask in the loop.
3. ``gae_finish_kernel``: returns last + v; in zero mode also the selects
   that make masked positions 0.

Every counted position, and every position in zero mode, sees exactly
canonical's float32 operations in canonical's order.  Rows are independent,
so how rows and columns are tiled is free.  The loop does a handful of
operations per step, which is what the interpreter pays for (about 0.1 ms
each step, whatever the number of rows).
"""

import torch
import triton
import triton.language as tl

from .canonical import log2, neg_zeros, program_rows
from .layout import block_elements, launch, scan_rows, scan_tile


@triton.jit
def _suffix_min(x):
    # x: [R, C] integers, C a power of two -> y[:, j] = min(x[:, j:]), by
    # doubling: y[j] = min(y[j], y[j + s]) for s = 1, 2, ..., C/2 (integer
    # minima are order-free).
    C: tl.constexpr = x.shape[1]
    j = tl.arange(0, C)
    for level in tl.static_range(log2(C)):
        ahead = j + (1 << level)                                        # [C]
        index = tl.broadcast_to(tl.minimum(ahead, C - 1)[None, :], x.shape)
        x = tl.where((ahead < C)[None, :], tl.minimum(x, tl.gather(x, index, axis=1)), x)
    return x


@triton.jit
def gae_delta_kernel(r_ptr, v_ptr, m_ptr, boot_ptr, delta_ptr, weight_ptr, n_rows, n_cols, gamma, gamma_lambda,
                     CARRY: tl.constexpr, BLOCK_R: tl.constexpr, TC: tl.constexpr):
    # r, v, m, delta, weight: [n_rows, n_cols]; boot: [n_rows].  One program:
    # BLOCK_R rows, in tiles of TC columns from the right.
    #   carry: delta = select(m, (r + g * next_v) - v, -0.0), weight = select(m, gl, 1.0),
    #          next_v = v at the first counted column after t, or boot;
    #   zero:  delta = (r' + g * next_v) - v', next_v = v'[t + 1], or boot at t = n_cols - 1,
    #          where r' = select(m, r, 0.0) and v' = select(m, v, 0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    boot = tl.load(boot_ptr + rows, mask=rows_ok, other=0.0)           # [BLOCK_R]
    neg_zero = neg_zeros(())
    j = tl.arange(0, TC)                                                # [TC]
    # carry: v at the first counted column right of the current tile, or boot.
    next_v = boot                                                       # [BLOCK_R]
    n_tiles = (n_cols + TC - 1) // TC
    for i in range(n_tiles):
        start = (n_tiles - 1 - i) * TC
        cols = start + j                                                # [TC]
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, TC]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        r = tl.load(r_ptr + offs, mask=inside, other=0.0)
        v = tl.load(v_ptr + offs, mask=inside, other=0.0)
        m = tl.load(m_ptr + offs, mask=inside, other=False)
        if CARRY:
            # at_or_after[j]: the first counted column >= j in this tile, TC if
            # none; shifted by one, the first counted column after j.  v there,
            # or next_v when it lies past the tile.
            at_or_after = _suffix_min(tl.where(m, j[None, :], TC))      # [BLOCK_R, TC]
            index = tl.broadcast_to(tl.minimum(j + 1, TC - 1)[None, :], (BLOCK_R, TC))
            after = tl.where((j + 1 < TC)[None, :], tl.gather(at_or_after, index, axis=1), TC)
            has_next = after < TC
            after_v = tl.load(v_ptr + row_start[:, None] + start + after, mask=inside & has_next, other=0.0)
            after_v = tl.where(has_next, after_v, next_v[:, None])
            delta = (r + gamma * after_v) - v
            tl.store(delta_ptr + offs, tl.where(m, delta, neg_zero), mask=inside)
            tl.store(weight_ptr + offs, tl.where(m, gamma_lambda, 1.0), mask=inside)
            first = tl.reshape(tl.gather(at_or_after, tl.full((BLOCK_R, 1), 0, tl.int32), axis=1), (BLOCK_R,))
            first_v = tl.load(v_ptr + row_start + start + first, mask=rows_ok & (first < TC), other=0.0)
            next_v = tl.where(first < TC, first_v, next_v)
        else:
            has_next = (cols + 1 < n_cols)[None, :]                     # [1, TC]
            v1 = tl.load(v_ptr + offs + 1, mask=inside & has_next, other=0.0)
            m1 = tl.load(m_ptr + offs + 1, mask=inside & has_next, other=False)
            after_v = tl.where(has_next, tl.where(m1, v1, 0.0), boot[:, None])
            delta = (tl.where(m, r, 0.0) + gamma * after_v) - tl.where(m, v, 0.0)
            tl.store(delta_ptr + offs, delta, mask=inside)


@triton.jit
def gae_scan_kernel(delta_ptr, weight_ptr, n_rows, n_cols, gamma_lambda,
                    CARRY: tl.constexpr, BLOCK_R: tl.constexpr):
    # delta, weight: [n_rows, n_cols].  One program: BLOCK_R rows, each a
    # loop from t = n_cols - 1 down to 0: last = delta[t] + w * last, written
    # over delta[t]; w = weight[t] (carry) or gamma_lambda (zero).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    offs = row_start + (n_cols - 1)                                     # [BLOCK_R]
    delta_ptrs = delta_ptr + offs
    weight_ptrs = weight_ptr + offs
    last = tl.full((BLOCK_R,), 0.0, tl.float32)
    # Whole tensors, not scalars: the interpreter would broadcast a scalar
    # again at every step (the GPU code is the same either way).
    step = tl.full((BLOCK_R,), -1, tl.int64)
    gl = tl.full((BLOCK_R,), gamma_lambda, tl.float32)
    for _ in range(n_cols):
        # Rows past n_rows load nothing and store nothing (no `other`: the
        # interpreter pays for filling it, and those lanes are never stored).
        if CARRY:
            w = tl.load(weight_ptrs, mask=rows_ok)
            weight_ptrs += step
        else:
            w = gl
        last = tl.load(delta_ptrs, mask=rows_ok) + w * last
        tl.store(delta_ptrs, last, mask=rows_ok)
        delta_ptrs += step


@triton.jit
def gae_finish_kernel(adv_ptr, v_ptr, m_ptr, ret_ptr, n, CARRY: tl.constexpr, BLOCK: tl.constexpr):
    # adv (holding last), v, m, ret: [n] (the [n_rows, n_cols] tensors, flat).  One program: BLOCK elements.
    #   carry: ret = last + v;  zero: adv = select(m, last, 0.0), ret = select(m, last + v, 0.0).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # [BLOCK]
    ok = offs < n
    last = tl.load(adv_ptr + offs, mask=ok, other=0.0)
    v = tl.load(v_ptr + offs, mask=ok, other=0.0)
    if CARRY:
        tl.store(ret_ptr + offs, last + v, mask=ok)
    else:
        m = tl.load(m_ptr + offs, mask=ok, other=False)
        tl.store(adv_ptr + offs, tl.where(m, last, 0.0), mask=ok)
        tl.store(ret_ptr + offs, tl.where(m, last + v, 0.0), mask=ok)


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    n_rows, n_cols = rewards.shape
    carry = mask_mode == "carry"
    adv = torch.empty_like(rewards)
    ret = torch.empty_like(rewards)
    rows, cols = scan_tile(n_rows, n_cols)
    launch(gae_delta_kernel, triton.cdiv(n_rows, rows), rewards, values, mask, bootstrap, adv, ret,
           n_rows, n_cols, float(gamma), float(gamma_lambda), CARRY=carry, BLOCK_R=rows, TC=cols)
    rows = scan_rows(n_rows)
    launch(gae_scan_kernel, triton.cdiv(n_rows, rows), adv, ret, n_rows, n_cols, float(gamma_lambda),
           CARRY=carry, BLOCK_R=rows)
    n = rewards.numel()
    block = block_elements(n)
    launch(gae_finish_kernel, triton.cdiv(n, block), adv, values, mask, ret, n, CARRY=carry, BLOCK=block)
    return adv, ret
