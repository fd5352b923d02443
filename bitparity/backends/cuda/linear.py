"""linear (spec 24.1): y = x @ weight.T (+ bias), each output a canonical dot product, as canonical.linear;
and weight_grad (spec 29.2): the weight's gradient, a row fold of products, as canonical.weight_grad.

A program computes a BLOCK_M x BLOCK_N tile of outputs (layout.dot_tile):
the products of its rows and outputs lie in one [BLOCK_M, BLOCK_N, W]
tensor, W lanes along K, which canonical.dot_sums accumulates chunk by chunk
and folds by the halving tree (spec 3).  Every output is a function of its
own row and weight row only, so the tile changes speed, never a bit.  On a
GPU the tile is about 8 x 8 outputs of 64 lanes (layout.GPU_PRODUCTS); a
tensor-core tier would replace dot_sums here, and could not keep spec 3's
order, since mma accumulates in the hardware's order.

weight_grad: dW[n, k] = the row fold (spec 29.1) over the rows m of
g[m, n] * x[m, k], each product rounded once.  A program computes a
BLOCK_N x BLOCK_K tile of dW (layout.weight_grad_tile) the way a GEMM walks
its reduction axis: a block of B rows at a time, their products one
[B, BLOCK_N, BLOCK_K] tensor folded by fold.py's adjacent tree, the block
partials by fold.py's stack.  The [M, N, K] products are never stored.
(linear's dx is linear(g, W^T) and its bias's gradient weight_grad with
x = 1: no kernel of their own.)
"""

import torch
import triton
import triton.language as tl

from .canonical import dot_sums, neg_zeros
from .fold import fold, row_blocks
from .layout import dot_tile, launch, next_pow2, row_layout, weight_grad_tile


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


@triton.jit
def _products_block(block_args, rows):
    # block_args = (x_ptr, g_ptr, outs, outs_ok, ins, ins_ok, n_out, n_in), outs, outs_ok
    # [BLOCK_N], ins, ins_ok [BLOCK_K]; rows [B] -> [B, BLOCK_N * BLOCK_K]: the leaves
    # g[row, n] * x[row, k], each rounded once, -0.0 at the empty slots (0 * 0 would be +0.0).
    x_ptr, g_ptr, outs, outs_ok, ins, ins_ok, n_out, n_in = block_args
    present = rows >= 0                                                 # [B]
    g = tl.load(g_ptr + rows[:, None] * n_out + outs[None, :], mask=present[:, None] & outs_ok[None, :],
                other=0.0)                                              # [B, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * n_in + ins[None, :], mask=present[:, None] & ins_ok[None, :],
                other=0.0)                                              # [B, BLOCK_K]
    products = tl.where(present[:, None, None], g[:, :, None] * x[:, None, :], neg_zeros(()))
    return tl.reshape(products, (rows.shape[0], outs.shape[0] * ins.shape[0]))


@triton.jit
def weight_grad_kernel(x_ptr, g_ptr, table_ptr, indices_ptr, out_ptr, n_blocks, n_out, n_in,
                       B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LP: tl.constexpr):
    # x: [M, n_in], g: [M, n_out]; table: [n_blocks, B] rows (-1: none), indices: [n_blocks]
    # (fold.row_blocks over one segment); out: [n_out, n_in].  Program (i, j): outputs of
    # block i, inputs of block j, folded over every block of rows.
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)           # [BLOCK_N]
    ins = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)            # [BLOCK_K]
    outs_ok = outs < n_out
    ins_ok = ins < n_in
    dw = fold(_products_block, (x_ptr, g_ptr, outs, outs_ok, ins, ins_ok, n_out, n_in), table_ptr, indices_ptr,
              0, n_blocks, B, BLOCK_N * BLOCK_K, LP)                    # [BLOCK_N * BLOCK_K]
    offs = outs.to(tl.int64)[:, None] * n_in + ins[None, :]             # [BLOCK_N, BLOCK_K]
    tl.store(out_ptr + offs, tl.reshape(dw, (BLOCK_N, BLOCK_K)), mask=outs_ok[:, None] & ins_ok[None, :])


def weight_grad(x, g, positions, rows):
    n_in, n_out = x.shape[1], g.shape[1]
    out = torch.empty((n_out, n_in), dtype=torch.float32, device=x.device)
    block, block_n, block_k = weight_grad_tile(rows, n_out, n_in)
    table, indices, _, levels = row_blocks(torch.zeros_like(positions), positions, rows, block)
    launch(weight_grad_kernel, (triton.cdiv(n_out, block_n), triton.cdiv(n_in, block_k)),
           x, g, table, indices, out, indices.numel(), n_out, n_in,
           B=block, BLOCK_N=block_n, BLOCK_K=block_k, LP=next_pow2(levels))
    return out
