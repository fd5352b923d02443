"""sum: the canonical masked row sum (spec 3), as canonical.sum."""

import torch
import triton
import triton.language as tl

from .canonical import SEGMENT, neg_zeros, put, tree_sum
from .layout import block_rows, launch, row_layout


@triton.jit
def sum_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, n_segments,
               HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows].  One program: BLOCK_R rows.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)          # [BLOCK_R]
    rows_ok = rows < n_rows
    row_start = rows.to(tl.int64) * n_cols                              # [BLOCK_R]
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    # One partial per segment, -0.0 in the slots past the last segment.
    # The segments run in sequence here; a split-row version would give each
    # segment its own program and fold the [n_rows, GP] partials afterwards,
    # with the same bits.
    neg_zero = neg_zeros(())
    partials = neg_zeros((BLOCK_R, GP))                                 # [BLOCK_R, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        # Lane j adds x[j], x[j + W], ... in order.  Starting from -0.0 and
        # skipping the all-padding chunks of the last segment are both exact:
        # v + (-0.0) == v for every v.
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes                                        # [W]
            offs = row_start[:, None] + cols[None, :]                   # [BLOCK_R, W]
            valid = rows_ok[:, None] & (cols < n_cols)[None, :]
            if HAS_MASK:
                valid = valid & tl.load(mask_ptr + offs, mask=valid, other=False)
            acc = acc + tl.where(valid, tl.load(x_ptr + offs, mask=valid, other=0.0), neg_zero)
        partials = put(partials, slots, g, tree_sum(acc))
    tl.store(out_ptr + rows, tree_sum(partials), mask=rows_ok)


def sum(x, mask):  # noqa: A001 - the op's public name
    n_rows, n_cols = x.shape
    out = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(sum_kernel, triton.cdiv(n_rows, rows),
           x, x if mask is None else mask, out, n_rows, n_cols, n_segments,
           HAS_MASK=mask is not None, BLOCK_R=rows, W=width, GP=slots)
    return out
