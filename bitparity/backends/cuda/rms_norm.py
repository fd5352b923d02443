"""rms_norm (spec 24.2): (x * rsqrt(mean(x * x) + eps)) * weight per row, as canonical.rms_norm."""

import torch
import triton
import triton.language as tl

from .canonical import dot_sums, program_rows, reciprocal, rsqrt
from .layout import block_rows, launch, row_layout


@triton.jit
def rms_norm_kernel(x_ptr, weight_ptr, out_ptr, n_rows, n_cols, n_segments, eps,
                    BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, out: [n_rows, n_cols], weight: [n_cols].
    # One program: BLOCK_R rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    # ms = canonical_sum(x_d * x_d) * reciprocal(D): the row's dot with itself.
    lanes = tl.arange(0, W)
    squares = dot_sums(x_ptr, row_start[:, None], rows_ok[:, None], x_ptr, row_start[:, None], rows_ok[:, None],
                       n_cols, n_segments, lanes, tl.arange(0, GP))     # [BLOCK_R, 1]
    length = tl.full((BLOCK_R, 1), n_cols, tl.int32).to(tl.float32)     # exact below 2**24
    r = rsqrt(squares * reciprocal(length) + eps)                       # [BLOCK_R, 1]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + offs, mask=inside, other=0.0)
        weight = tl.load(weight_ptr + cols, mask=cols < n_cols, other=0.0)[None, :]
        tl.store(out_ptr + offs, (x * r) * weight, mask=inside)


def rms_norm(x, weight, eps):
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(rms_norm_kernel, triton.cdiv(n_rows, rows), x, weight, out, n_rows, n_cols, n_segments,
           float(eps), BLOCK_R=rows, W=width, GP=slots)
    return out
