"""rotary (spec 24.3): the rotate-half rotation of each row by its own cos and sin, as canonical.rotary."""

import torch
import triton
import triton.language as tl

from ... import spec
from .canonical import program_rows
from .layout import block_rows, launch, next_pow2


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, half,
                  BLOCK_R: tl.constexpr, W: tl.constexpr):
    # x, out: [n_rows, 2 * half]; cos, sin: [n_rows, half].  One program: BLOCK_R rows,
    # W columns of each half at a time:
    #   out[i] = x[i] * cos[i] - x[i + h] * sin[i],  out[i + h] = x[i + h] * cos[i] + x[i] * sin[i].
    rows, rows_ok, row_start = program_rows(n_rows, 2 * half, BLOCK_R)
    table_start = rows.to(tl.int64) * half
    lanes = tl.arange(0, W)
    for start in range(0, half, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < half)[None, :]
        first = row_start[:, None] + cols[None, :]                      # [BLOCK_R, W]
        tables = table_start[:, None] + cols[None, :]                   # [BLOCK_R, W]
        x1 = tl.load(x_ptr + first, mask=inside, other=0.0)
        x2 = tl.load(x_ptr + first + half, mask=inside, other=0.0)
        cos = tl.load(cos_ptr + tables, mask=inside, other=0.0)
        sin = tl.load(sin_ptr + tables, mask=inside, other=0.0)
        tl.store(out_ptr + first, x1 * cos - x2 * sin, mask=inside)
        tl.store(out_ptr + first + half, x2 * cos + x1 * sin, mask=inside)


def rotary(x, cos, sin):
    n_rows, half = cos.shape
    out = torch.empty_like(x)
    width = min(next_pow2(half), spec.LANES)
    rows = block_rows(n_rows, width)
    launch(rotary_kernel, triton.cdiv(n_rows, rows), x, cos, sin, out, n_rows, half, BLOCK_R=rows, W=width)
    return out
