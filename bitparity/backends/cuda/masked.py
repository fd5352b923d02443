"""masked_mean and masked_whiten (spec 15.1, 15.3) and their backward (spec 26.7, 26.8),
as the same-named functions of canonical.py.

All start from canonical.masked_row_sum: the canonical sum of the counted
entries and their exact count, n, rounded once to float32.  The mean is
sum * R + 0.0 with R = 1/n (spec 7), or 0 for an empty row.  The backward
kernels recompute the forward's R, mean, variance and rsqrt the same way,
which gives the forward's bits.
"""

import torch
import triton
import triton.language as tl

from .canonical import count_reciprocal, masked_row_sum, nan_max, program_rows, reciprocal, rsqrt, tree_sum
from .layout import block_rows, launch, row_layout


@triton.jit
def floored(var, eps, CLAMP: tl.constexpr):
    # var + eps ("add", verl/TRL), or max(var, eps) with NaN propagated ("clamp", OpenRLHF), as
    # canonical._floored.  eps is a positive normal float32 value (ops.py checks), so the maximum is
    # never a tie between +0.0 and -0.0.
    if CLAMP:
        return nan_max(var, eps)
    return var + eps


@triton.jit
def whiten_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, eps,
                 UNBIASED: tl.constexpr, CLAMP: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr,
                 GP: tl.constexpr):
    # -> (r, mean, rk, var, inv), each [BLOCK_R], spec 15.3's statistics, which masked_whiten and its
    # backward both use: r = R(n); mean = masked mean; ss = canonical sum of select(m, d * d, -0.0),
    # d = x - mean; rk = reciprocal(max(n - 1, 1)) (unbiased) or reciprocal(max(n, 1)), the divisor an
    # exact integer >= 1 before its one rounding; var = ss * rk; inv = rsqrt(floored(var, eps, CLAMP)).
    total, count = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP)
    r = count_reciprocal(count.to(tl.float32))
    mean = total * r + 0.0
    ss, _ = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP,
                           center=mean)
    if UNBIASED:
        divisor = tl.maximum(count - 1, 1)
    else:
        divisor = tl.maximum(count, 1)
    rk = reciprocal(divisor.to(tl.float32))
    var = ss * rk
    return r, mean, rk, var, rsqrt(floored(var, eps, CLAMP))


@triton.jit
def masked_mean_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments,
                       HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows] = sum * R + 0.0.  One program: BLOCK_R rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    total, count = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, HAS_MASK, BLOCK_R, W, GP)
    tl.store(out_ptr + rows, total * count_reciprocal(count.to(tl.float32)) + 0.0, mask=rows_ok)


@triton.jit
def masked_whiten_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments, eps,
                         SHIFT_MEAN: tl.constexpr, UNBIASED: tl.constexpr, CLAMP: tl.constexpr,
                         BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols], each row whitened alone (ops passes one row), with
    # whiten_stats' mean and inv: out = select(m, (x - mean) * inv [+ mean when not SHIFT_MEAN], 0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    _, mean, _, _, inv = whiten_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, eps,
                                      UNBIASED, CLAMP, BLOCK_R, W, GP)                # [BLOCK_R] each
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        counted = tl.load(mask_ptr + offs, mask=inside, other=False)
        out = (tl.load(x_ptr + offs, mask=inside, other=0.0) - mean[:, None]) * inv[:, None]
        if not SHIFT_MEAN:
            out = out + mean[:, None]
        tl.store(out_ptr + offs, tl.where(counted, out, 0.0), mask=inside)


@triton.jit
def masked_mean_backward_kernel(mask_ptr, g_ptr, out_ptr, n_rows, n_cols,
                                BLOCK_R: tl.constexpr, W: tl.constexpr):
    # mask, out: [n_rows, n_cols], g: [n_rows]; out = select(m, g * R, +0.0)
    # with the forward's R = 1/n, 0 for an empty row (spec 26.7).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    lanes = tl.arange(0, W)
    # n, exactly: lane counts folded by a tree (integer sums are exact in any order).
    lane_counts = tl.full((BLOCK_R, W), 0, tl.int32)                    # [BLOCK_R, W]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        lane_counts += tl.load(mask_ptr + offs, mask=inside, other=False).to(tl.int32)
    g = tl.load(g_ptr + rows, mask=rows_ok, other=0.0)                  # [BLOCK_R]
    weight = (g * count_reciprocal(tree_sum(lane_counts).to(tl.float32)))[:, None]     # [BLOCK_R, 1]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        counted = tl.load(mask_ptr + offs, mask=inside, other=False)
        tl.store(out_ptr + offs, tl.where(counted, weight, 0.0), mask=inside)


@triton.jit
def masked_whiten_backward_kernel(x_ptr, mask_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments, eps,
                                  SHIFT_MEAN: tl.constexpr, UNBIASED: tl.constexpr, CLAMP: tl.constexpr,
                                  BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, g, out: [n_rows, n_cols] (spec 26.8), with whiten_stats' r, mean, rk, var and inv:
    #   gbar = masked mean of g;  gd = canonical sum of select(m, g * d, -0.0)
    #   z    = d * inv;  c = (gd * rk) * inv, or +0.0 where CLAMP holds var at eps (var < eps)
    #   out  = select(m, ((g - gbar) - z * c) * inv [+ gbar when not SHIFT_MEAN], +0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    r, mean, rk, var, inv = whiten_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, eps,
                                         UNBIASED, CLAMP, BLOCK_R, W, GP)            # [BLOCK_R] each
    # The gradient's two row sums: g's masked mean (the same count) and g . d.
    g_total, _ = masked_row_sum(g_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP)
    g_bar = (g_total * r + 0.0)[:, None]                                # [BLOCK_R, 1]
    gd, _ = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP,
                           center=mean, factor_ptr=g_ptr)
    c = (gd * rk) * inv                                                 # [BLOCK_R]
    if CLAMP:
        c = tl.where(var < eps, 0.0, c)                                 # var held constant at eps
    c = c[:, None]                                                      # [BLOCK_R, 1]
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        counted = tl.load(mask_ptr + offs, mask=inside, other=False)
        z = (tl.load(x_ptr + offs, mask=inside, other=0.0) - mean[:, None]) * inv[:, None]
        out = ((tl.load(g_ptr + offs, mask=inside, other=0.0) - g_bar) - z * c) * inv[:, None]
        if not SHIFT_MEAN:
            out = out + g_bar
        tl.store(out_ptr + offs, tl.where(counted, out, 0.0), mask=inside)


def _launch(kernel, tensors, *scalars, **constexprs):
    # tensors: the kernel's tensor arguments in order, the first [n_rows, n_cols], the last the output.
    n_rows, n_cols = tensors[0].shape
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(kernel, triton.cdiv(n_rows, rows), *tensors, n_rows, n_cols, n_segments,
           *scalars, BLOCK_R=rows, W=width, GP=slots, **constexprs)
    return tensors[-1]


def masked_mean(x, mask):
    """x: [R, N], mask: [R, N] bool, or None when every entry counts (ppo's means over sequences) -> [R]."""
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return _launch(masked_mean_kernel, (x, x if mask is None else mask, out), HAS_MASK=mask is not None)


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    return _launch(masked_whiten_kernel, (x, mask, torch.empty_like(x)), float(eps),
                   SHIFT_MEAN=bool(shift_mean), UNBIASED=bool(unbiased), CLAMP=eps_mode == "clamp")


def masked_mean_backward(mask, g):
    """mask: [R, N] bool, g: [R] -> [R, N]."""
    n_rows, n_cols = mask.shape
    out = torch.empty(mask.shape, dtype=torch.float32, device=mask.device)
    width, _, _ = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(masked_mean_backward_kernel, triton.cdiv(n_rows, rows), mask, g, out, n_rows, n_cols,
           BLOCK_R=rows, W=width)
    return out


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    return _launch(masked_whiten_backward_kernel, (x, mask, g, torch.empty_like(x)), float(eps),
                   SHIFT_MEAN=bool(shift_mean), UNBIASED=bool(unbiased), CLAMP=eps_mode == "clamp")
