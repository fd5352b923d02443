"""masked_mean and masked_whiten (spec 15.1, 15.3), as the same-named functions of canonical.py.

Both start from canonical.masked_row_sum: the canonical sum of the counted
entries and their exact count, n, rounded once to float32.  The mean is
sum * R + 0.0 with R = 1/n (spec 7), or 0 for an empty row.
"""

import torch
import triton
import triton.language as tl

from .canonical import count_reciprocal, masked_row_sum, program_rows, reciprocal, rsqrt
from .layout import block_rows, launch, row_layout


@triton.jit
def masked_mean_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments,
                       HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows] = sum * R + 0.0.  One program: BLOCK_R rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    total, count = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, HAS_MASK, BLOCK_R, W, GP)
    tl.store(out_ptr + rows, total * count_reciprocal(count.to(tl.float32)) + 0.0, mask=rows_ok)


@triton.jit
def masked_whiten_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments, eps,
                         SHIFT_MEAN: tl.constexpr, UNBIASED: tl.constexpr,
                         BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols], each row whitened alone (ops passes one row):
    #   mean = masked mean; ss = canonical sum of select(m, d * d, -0.0), d = x - mean;
    #   var  = ss * reciprocal(max(n - 1, 1)) (unbiased) or ss * reciprocal(max(n, 1));
    #   out  = select(m, d * rsqrt(var + eps) [+ mean when not SHIFT_MEAN], 0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    total, count = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP)
    mean = total * count_reciprocal(count.to(tl.float32)) + 0.0        # [BLOCK_R]
    ss, _ = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, True, BLOCK_R, W, GP,
                           center=mean)
    if UNBIASED:
        divisor = tl.maximum(count - 1, 1)
    else:
        divisor = tl.maximum(count, 1)
    # The divisor is an exact integer >= 1 before its one rounding to float32.
    inv = rsqrt(ss * reciprocal(divisor.to(tl.float32)) + eps)         # [BLOCK_R]
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


def _launch(kernel, x, mask, out, *scalars, **constexprs):
    n_rows, n_cols = x.shape
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(kernel, triton.cdiv(n_rows, rows), x, x if mask is None else mask, out, n_rows, n_cols, n_segments,
           *scalars, BLOCK_R=rows, W=width, GP=slots, **constexprs)
    return out


def masked_mean(x, mask):
    """x: [R, N], mask: [R, N] bool, or None when every entry counts (ppo's means over sequences) -> [R]."""
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return _launch(masked_mean_kernel, x, mask, out, HAS_MASK=mask is not None)


def masked_whiten(x, mask, shift_mean, unbiased, eps):
    return _launch(masked_whiten_kernel, x, mask, torch.empty_like(x), float(eps),
                   SHIFT_MEAN=bool(shift_mean), UNBIASED=bool(unbiased))
