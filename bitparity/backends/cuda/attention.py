"""attention (spec 24.4): softmax(q k^T * scale, masked) v per group, as canonical.attention.

A row is one query of one group, and a program takes a tile of BLOCK_G groups
by BLOCK_Q queries (layout.product_rows rows in all), so the one-token decode
steps of many groups share a program.  Per row, over the keys in chunks of W lanes
(row_layout(Tk), the softmax's and the key sums' structure):
  1. the scores w_j = dot(q_i, k_j) * scale by canonical.dot_sums over D, -inf
     where key j does not count (j >= kv_lengths[g], or past the query when
     causal: key j counts iff j < limit_i);
  2. the softmax statistics of spec 8.2 over w, in softmax.py's order
     (its ``softmax_lanes`` and ``softmax_totals``);
  3. out_d = canonical sum over j of select(counts, p_j * v_jd, -0.0),
     p_j = exp(w_j - shift) * recip, lanes along the keys.
The scores are recomputed in each pass rather than stored: one chunk of keys
when Tk <= LANES.  Keys that do not count are never loaded, so garbage or NaN
in unused cache slots is never combined with a number.

On a GPU (layout.product_rows) a program takes one or a few queries; a chunk
of LANES keys by D = 128 dims is then more products than a program holds in
registers, and a GPU-tuned version would compute a chunk's scores in sub-tiles
of keys through shared memory.  A tensor-core tier would replace the two
dot_sums (scores and the weighted key sums) and cannot keep spec 3's order.
"""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import NEG_INF, SEGMENT, dot_sums, log2, nan_max, neg_zeros, put, tree_max, tree_sum
from .layout import launch, next_pow2, product_rows, row_layout
from .softmax import softmax_lanes, softmax_totals


@triton.jit
def _scores(q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, keys, dim, d_segments, scale,
            DW: tl.constexpr, DGP: tl.constexpr):
    # q_start, kv_start, rows_ok, limit: [BLOCK_R]; keys: [W] int64 ->
    # (w, counts), each [BLOCK_R, W]: w = dot(q, k_j) * scale where key j
    # counts (j < limit), -inf elsewhere (canonical._scaled with the mask).
    counts = rows_ok[:, None] & (keys[None, :] < limit[:, None])
    s = dot_sums(q_ptr, q_start[:, None], rows_ok[:, None],
                 k_ptr, kv_start[:, None] + keys[None, :] * dim, counts, dim, d_segments, DW, DGP)
    return tl.where(counts, s * scale, NEG_INF), counts


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, out_ptr, n_groups, n_queries, n_keys, dim,
                     n_segments, d_segments, scale, CAUSAL: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_Q: tl.constexpr, W: tl.constexpr, GP: tl.constexpr, DW: tl.constexpr,
                     DGP: tl.constexpr, DV: tl.constexpr):
    # q, out: [G, Tq, D]; k, v: [G, Tk, D]; kv_lengths: [G] int64.  Program
    # (a, b): the BLOCK_R = BLOCK_G * BLOCK_Q rows of queries block b of
    # groups block a (powers of two: shifts and masks, no integer division,
    # which the GPU would make with its approximate reciprocal).  W, GP: lanes
    # and segment slots over the Tk keys; DW, DGP: over the D dims of a score;
    # DV: dims of out per pass.
    BLOCK_R: tl.constexpr = BLOCK_G * BLOCK_Q
    tile = tl.arange(0, BLOCK_R)                                        # [BLOCK_R]
    group = tl.program_id(0) * BLOCK_G + (tile >> log2(BLOCK_Q))
    query = tl.program_id(1) * BLOCK_Q + (tile & (BLOCK_Q - 1))
    rows_ok = (group < n_groups) & (query < n_queries)
    q_start = (group.to(tl.int64) * n_queries + query) * dim            # also out's row start
    kv_start = group.to(tl.int64) * n_keys * dim
    # Key j counts iff j < limit: j < kv_lengths[g] and, when causal,
    # j <= i + (Tk - Tq) (the query's position, bottom-right aligned).
    limit = tl.load(lengths_ptr + group, mask=rows_ok, other=1)
    if CAUSAL:
        limit = tl.minimum(limit, (query + (n_keys - n_queries) + 1).to(tl.int64))
    lanes = tl.arange(0, W).to(tl.int64)                                # [W]
    slots = tl.arange(0, GP)                                            # [GP]

    # Softmax statistics over the keys (spec 8.2), segment by segment.
    seg_maxes = tl.full((BLOCK_R, GP), NEG_INF, tl.float32)             # [BLOCK_R, GP]
    seg_counts = neg_zeros((BLOCK_R, GP))                               # [BLOCK_R, GP]
    seg_rests = neg_zeros((BLOCK_R, GP))                                # [BLOCK_R, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_keys)
        # Pass 1: m_g (+0.0 makes a zero maximum +0.0).
        lane_max = tl.full((BLOCK_R, W), NEG_INF, tl.float32)           # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            w, _ = _scores(q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, start + lanes, dim, d_segments,
                           scale, DW, DGP)
            lane_max = nan_max(lane_max, w)
        seg_max = tree_max(lane_max) + 0.0                              # [BLOCK_R]
        seg_shift = tl.where(seg_max == NEG_INF, 0.0, seg_max)
        # Pass 2: n_g and t_g, lane by lane, then the halving tree.
        lane_count = neg_zeros((BLOCK_R, W))                            # [BLOCK_R, W]
        lane_rest = neg_zeros((BLOCK_R, W))                             # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            w, _ = _scores(q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, start + lanes, dim, d_segments,
                           scale, DW, DGP)
            lane_count, lane_rest = softmax_lanes(w, seg_shift, lane_count, lane_rest)
        seg_maxes = put(seg_maxes, slots, g, seg_max)
        seg_counts = put(seg_counts, slots, g, tree_sum(lane_count))
        seg_rests = put(seg_rests, slots, g, tree_sum(lane_rest))
    shift, _, _, recip = softmax_totals(seg_maxes, seg_counts, seg_rests, n_segments)    # [BLOCK_R] each

    # out[r, d] = canonical sum over the keys of select(counts, p_j * v_jd, -0.0),
    # DV dims at a time: lane j of dim d adds key j, j + W, ... in order.
    neg_zero = neg_zeros(())
    for d_start in range(0, dim, DV):
        dims = d_start + tl.arange(0, DV)                               # [DV]
        dims_ok = dims < dim
        partials = neg_zeros((BLOCK_R * DV, GP))                        # [BLOCK_R * DV, GP]
        for g in range(n_segments):
            seg_start = g * SEGMENT
            seg_end = tl.minimum(seg_start + SEGMENT, n_keys)
            acc = neg_zeros((BLOCK_R, DV, W))                           # [BLOCK_R, DV, W]
            for start in range(seg_start, seg_end, W):
                keys = start + lanes
                w, counts = _scores(q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, keys, dim, d_segments,
                                    scale, DW, DGP)
                p = canonical.exp(w - shift[:, None]) * recip[:, None]  # [BLOCK_R, W]
                taken = counts[:, None, :] & dims_ok[None, :, None]     # [BLOCK_R, DV, W]
                v_offs = kv_start[:, None, None] + keys[None, None, :] * dim + dims[None, :, None]
                v = tl.load(v_ptr + v_offs, mask=taken, other=0.0)      # [BLOCK_R, DV, W]
                acc = acc + tl.where(taken, p[:, None, :] * v, neg_zero)
            partials = put(partials, slots, g, tree_sum(tl.reshape(acc, (BLOCK_R * DV, W))))
        out = tl.reshape(tree_sum(partials), (BLOCK_R, DV))             # [BLOCK_R, DV]
        tl.store(out_ptr + q_start[:, None] + dims[None, :], out, mask=rows_ok[:, None] & dims_ok[None, :])


def attention(q, k, v, kv_lengths, causal, scale):
    n_groups, n_queries, dim = q.shape
    n_keys = k.shape[1]
    out = torch.empty_like(q)
    width, n_segments, slots = row_layout(n_keys)
    d_width, d_segments, d_slots = row_layout(dim)
    rows = product_rows(n_groups * n_queries, width * max(d_width, next_pow2(dim)))
    block_q = min(next_pow2(n_queries), rows)
    block_g = min(next_pow2(n_groups), rows // block_q)
    launch(attention_kernel, (triton.cdiv(n_groups, block_g), triton.cdiv(n_queries, block_q)),
           q, k, v, kv_lengths, out, n_groups, n_queries, n_keys, dim, n_segments, d_segments, float(scale),
           CAUSAL=bool(causal), BLOCK_G=block_g, BLOCK_Q=block_q, W=width, GP=slots,
           DW=d_width, DGP=d_slots, DV=next_pow2(dim))
    return out
