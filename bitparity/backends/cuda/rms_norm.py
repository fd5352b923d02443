"""rms_norm (spec 24.2): (x * rsqrt(mean(x * x) + eps)) * weight per row, as canonical.rms_norm;
and its backward (spec 29.3), as canonical.rms_norm_backward, from the same r."""

import torch
import triton
import triton.language as tl

from .canonical import SEGMENT, dot_sums, neg_zeros, program_rows, put, reciprocal, rsqrt, tree_sum
from .layout import block_rows, launch, row_layout


@triton.jit
def _rms_stats(x_ptr, row_start, rows_ok, n_cols, n_segments, eps, BLOCK_R: tl.constexpr, W: tl.constexpr,
               GP: tl.constexpr):
    # row_start, rows_ok: [BLOCK_R] -> (r, 1/D), each [BLOCK_R, 1], as canonical._rms_stats:
    # ms = canonical_sum(x_d * x_d) * reciprocal(D), the row's dot with itself; r = rsqrt(ms + eps).
    squares = dot_sums(x_ptr, row_start[:, None], rows_ok[:, None], x_ptr, row_start[:, None], rows_ok[:, None],
                       n_cols, n_segments, tl.arange(0, W), tl.arange(0, GP))     # [BLOCK_R, 1]
    length = tl.full((BLOCK_R, 1), n_cols, tl.int32).to(tl.float32)     # exact below 2**24
    inverse_length = reciprocal(length)
    return rsqrt(squares * inverse_length + eps), inverse_length


@triton.jit
def rms_norm_kernel(x_ptr, weight_ptr, out_ptr, n_rows, n_cols, n_segments, eps,
                    BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, out: [n_rows, n_cols], weight: [n_cols].
    # One program: BLOCK_R rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    r, _ = _rms_stats(x_ptr, row_start, rows_ok, n_cols, n_segments, eps, BLOCK_R, W, GP)    # [BLOCK_R, 1]
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + offs, mask=inside, other=0.0)
        weight = tl.load(weight_ptr + cols, mask=cols < n_cols, other=0.0)[None, :]
        tl.store(out_ptr + offs, (x * r) * weight, mask=inside)


@triton.jit
def rms_norm_backward_kernel(x_ptr, weight_ptr, g_ptr, dx_ptr, terms_ptr, n_rows, n_cols, n_segments, eps,
                             BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, g, dx, terms: [n_rows, n_cols], weight: [n_cols].  One program: BLOCK_R rows.
    # With the forward's r and n_d = x_d * r, u_d = g_d * weight_d:
    #   a = canonical_sum(u_d * n_d) * reciprocal(D),  dx_d = (u_d - n_d * a) * r,  terms_d = g_d * n_d.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    r, inverse_length = _rms_stats(x_ptr, row_start, rows_ok, n_cols, n_segments, eps, BLOCK_R, W, GP)
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    # Lane j adds u * n of columns j, j + W, ... of its segment in order, from
    # -0.0 (spec 3); columns past the row are -0.0, never a product of padding.
    partials = neg_zeros((BLOCK_R, GP))                                 # [BLOCK_R, GP]
    for seg in range(n_segments):
        seg_start = seg * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes
            offs = row_start[:, None] + cols[None, :]                   # [BLOCK_R, W]
            inside = rows_ok[:, None] & (cols < n_cols)[None, :]
            n = tl.load(x_ptr + offs, mask=inside, other=0.0) * r
            u = tl.load(g_ptr + offs, mask=inside, other=0.0) * tl.load(weight_ptr + cols, mask=cols < n_cols,
                                                                         other=0.0)[None, :]
            acc = acc + tl.where(inside, u * n, neg_zeros(()))
        partials = put(partials, slots, seg, tree_sum(acc))
    a = tree_sum(partials)[:, None] * inverse_length                    # [BLOCK_R, 1]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        n = tl.load(x_ptr + offs, mask=inside, other=0.0) * r
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        u = g * tl.load(weight_ptr + cols, mask=cols < n_cols, other=0.0)[None, :]
        tl.store(dx_ptr + offs, (u - n * a) * r, mask=inside)
        tl.store(terms_ptr + offs, g * n, mask=inside)


def rms_norm(x, weight, eps):
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(rms_norm_kernel, triton.cdiv(n_rows, rows), x, weight, out, n_rows, n_cols, n_segments,
           float(eps), BLOCK_R=rows, W=width, GP=slots)
    return out


def rms_norm_backward(x, weight, eps, g):
    n_rows, n_cols = x.shape
    dx, terms = torch.empty_like(x), torch.empty_like(x)
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(rms_norm_backward_kernel, triton.cdiv(n_rows, rows), x, weight, g, dx, terms, n_rows, n_cols,
           n_segments, float(eps), BLOCK_R=rows, W=width, GP=slots)
    return dx, terms
