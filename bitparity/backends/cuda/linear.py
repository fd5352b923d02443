"""linear (spec 24.1): y = x @ weight.T (+ bias), each output a canonical dot product, as canonical.linear.

A program computes a BLOCK_M x BLOCK_N tile of outputs (layout.dot_tile):
the products of its rows and outputs lie in one [BLOCK_M, BLOCK_N, W]
tensor, W lanes along K, which canonical.dot_sums accumulates chunk by chunk
and folds by the halving tree (spec 3).  Every output is a function of its
own row and weight row only, so the tile changes speed, never a bit.  On a
GPU the tile is about 8 x 8 outputs of 64 lanes (layout.GPU_PRODUCTS); a
tensor-core tier would replace dot_sums here, and could not keep spec 3's
order, since mma accumulates in the hardware's order.
"""

import torch
import triton
import triton.language as tl

from .canonical import dot_sums
from .layout import dot_tile, launch, row_layout


@triton.jit
def linear_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, n_rows, n_out, n_in, n_segments,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  W: tl.constexpr, GP: tl.constexpr):
    # x: [n_rows, n_in], weight: [n_out, n_in], bias: [n_out]; out: [n_rows, n_out].
    # Program (i, j): rows of block i, outputs of block j.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)           # [BLOCK_M]
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)           # [BLOCK_N]
    rows_ok = rows < n_rows
    outs_ok = outs < n_out
    # y[m, n] = dot(x[m, :], weight[n, :]), then one add of bias[n]; no + 0.0.
    y = dot_sums(x_ptr, rows.to(tl.int64)[:, None] * n_in, rows_ok[:, None],
                 w_ptr, outs.to(tl.int64)[None, :] * n_in, outs_ok[None, :],
                 n_in, n_segments, tl.arange(0, W), tl.arange(0, GP))   # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + outs, mask=outs_ok, other=0.0)[None, :]
    offs = rows.to(tl.int64)[:, None] * n_out + outs[None, :]          # [BLOCK_M, BLOCK_N]
    tl.store(out_ptr + offs, y, mask=rows_ok[:, None] & outs_ok[None, :])


def linear(x, weight, bias):
    n_rows, n_in = x.shape
    n_out = weight.shape[0]
    out = torch.empty((n_rows, n_out), dtype=torch.float32, device=x.device)
    width, n_segments, slots = row_layout(n_in)
    block_m, block_n = dot_tile(n_rows, n_out, width)
    launch(linear_kernel, (triton.cdiv(n_rows, block_m), triton.cdiv(n_out, block_n)),
           x, weight, weight if bias is None else bias, out, n_rows, n_out, n_in, n_segments,
           HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, W=width, GP=slots)
    return out
