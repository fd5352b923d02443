"""sum: the canonical masked row sum (spec 3), as canonical.sum."""

import torch
import triton
import triton.language as tl

from .canonical import masked_row_sum, program_rows
from .layout import block_rows, launch, row_layout


@triton.jit
def sum_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments,
               HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows].  One program: BLOCK_R rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    total, _ = masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, HAS_MASK, BLOCK_R, W, GP)
    tl.store(out_ptr + rows, total, mask=rows_ok)


def sum(x, mask):  # noqa: A001 - the op's public name
    n_rows, n_cols = x.shape
    out = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(sum_kernel, triton.cdiv(n_rows, rows),
           x, x if mask is None else mask, out, n_rows, n_cols, n_segments,
           HAS_MASK=mask is not None, BLOCK_R=rows, W=width, GP=slots)
    return out
