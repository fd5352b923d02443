"""attention (spec 24.4): softmax(q k^T * scale, masked) v per group, as canonical.attention.

A row is one query of one group, and a program takes a tile of BLOCK_G groups
by BLOCK_Q queries (layout.attention_tile), so the one-token decode steps of
many groups share a program.  Per row, over the keys in chunks of W lanes
(row_layout(Tk), the softmax's and the key sums' structure):
  1. the scores w_j = dot(q_i, k_j) * scale by canonical.dot_sums over D, -inf
     where key j does not count (j >= kv_lengths[g], or past the query when
     causal: key j counts iff j < limit_i);
  2. the softmax statistics of spec 8.2 over w: softmax.py's softmax_stats,
     with the scores as the chunks it loads;
  3. out_d = canonical sum over j of select(counts, p_j * v_jd, -0.0),
     p_j = exp(w_j - shift) * recip, lanes along the keys.
The scores are recomputed in each pass rather than stored: one chunk of keys
when Tk <= LANES.  Keys that do not count are never loaded, so garbage or NaN
in unused cache slots is never combined with a number.

On a GPU (layout.attention_tile) a program takes one query and as many output
dims per pass as fit beside its keys, recomputing the scores in each pass.  A
chunk of LANES keys by D = 128 dims is more than a program holds in registers
(the scores' products, and the output's lane accumulators, D per key lane):
a GPU-tuned version would stage p and the lane accumulators through shared
memory.  A tensor-core tier would replace the two
dot_sums (scores and the weighted key sums) and cannot keep spec 3's order.
"""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import NEG_INF, SEGMENT, dot_sums, log2, neg_zeros, put, tree_sum
from .layout import attention_tile, launch, row_layout
from .softmax import softmax_stats


@triton.jit
def _key_counts(rows_ok, limit, keys):
    # rows_ok, limit: [BLOCK_R]; keys: [W] -> [BLOCK_R, W]: key j counts for its row (j < limit).
    return rows_ok[:, None] & (keys[None, :] < limit[:, None])


@triton.jit
def _scores(score_args, keys):
    # score_args = (q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, dim, d_segments, scale, d_lanes, d_slots),
    # the tensors [BLOCK_R] but d_lanes = arange(DW), d_slots = arange(DGP);
    # keys: [W] -> w: [BLOCK_R, W], dot(q, k_j) * scale where key j counts and
    # -inf elsewhere (canonical._scaled with the mask).  Keys that do not count are not loaded.
    q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, dim, d_segments, scale, d_lanes, d_slots = score_args
    counts = _key_counts(rows_ok, limit, keys)
    s = dot_sums(q_ptr, q_start[:, None], rows_ok[:, None],
                 k_ptr, kv_start[:, None] + keys.to(tl.int64)[None, :] * dim, counts, dim, d_segments, d_lanes, d_slots)
    return tl.where(counts, s * scale, NEG_INF)


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, out_ptr, n_groups, n_queries, n_keys, dim,
                     n_segments, d_segments, scale, CAUSAL: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_Q: tl.constexpr, W: tl.constexpr, GP: tl.constexpr, DW: tl.constexpr,
                     DGP: tl.constexpr, DV: tl.constexpr):
    # q, out: [G, Tq, D]; k, v: [G, Tk, D]; kv_lengths: [G] int64.  Program
    # (a, b): the BLOCK_R = BLOCK_G * BLOCK_Q rows of queries block a of
    # groups block b.  Powers of two, so a row's group and query are a shift
    # and a mask: sm_90 builds integer division from MUFU.RCP, which the PTX
    # check rejects.  Queries go on axis 0, which takes 2**31 - 1 programs (a
    # long prefill); axis 1 takes 65535.  W, GP: lanes and segment slots over
    # the Tk keys; DW, DGP: over the D dims of a score; DV: dims of out per pass.
    BLOCK_R: tl.constexpr = BLOCK_G * BLOCK_Q
    tile = tl.arange(0, BLOCK_R)                                        # [BLOCK_R]
    group = tl.program_id(1) * BLOCK_G + (tile >> log2(BLOCK_Q))
    query = tl.program_id(0) * BLOCK_Q + (tile & (BLOCK_Q - 1))
    rows_ok = (group < n_groups) & (query < n_queries)
    q_start = (group.to(tl.int64) * n_queries + query) * dim            # also out's row start
    kv_start = group.to(tl.int64) * n_keys * dim
    # Key j counts iff j < limit: j < kv_lengths[g] and, when causal,
    # j <= i + (Tk - Tq) (the query's position, bottom-right aligned).
    limit = tl.load(lengths_ptr + group, mask=rows_ok, other=1)
    if CAUSAL:
        limit = tl.minimum(limit, (query + (n_keys - n_queries) + 1).to(tl.int64))
    # (A tuple keeps tensors, not constexprs: the dims' lanes and slots go in as aranges.)
    score_args = (q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, dim, d_segments, scale,
                  tl.arange(0, DW), tl.arange(0, DGP))

    # The softmax statistics over the keys (spec 8.2), in softmax.py's order.
    shift, _, _, recip = softmax_stats(_scores, score_args, n_keys, n_segments, BLOCK_R, W, GP)

    # out[r, d] = canonical sum over the keys of select(counts, p_j * v_jd, -0.0),
    # p_j = exp(w_j - shift) * recip, DV dims at a time: lane j of dim d adds
    # keys j, j + W, ... in order, from -0.0, then the halving tree.
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    for d_start in range(0, dim, DV):
        dims = d_start + tl.arange(0, DV)                               # [DV]
        dims_ok = dims < dim
        partials = neg_zeros((BLOCK_R * DV, GP))                        # [BLOCK_R * DV, GP]
        for g in range(n_segments):
            seg_start = g * SEGMENT
            seg_end = tl.minimum(seg_start + SEGMENT, n_keys)
            acc = neg_zeros((BLOCK_R, DV, W))                           # [BLOCK_R, DV, W]
            for start in range(seg_start, seg_end, W):
                keys = start + lanes                                    # [W]
                p = canonical.exp(_scores(score_args, keys) - shift[:, None]) * recip[:, None]    # [BLOCK_R, W]
                taken = _key_counts(rows_ok, limit, keys)[:, None, :] & dims_ok[None, :, None]   # [BLOCK_R, DV, W]
                v_offs = kv_start[:, None, None] + keys.to(tl.int64)[None, None, :] * dim + dims[None, :, None]
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
    block_g, block_q, dims = attention_tile(n_groups, n_queries, width, dim)
    launch(attention_kernel, (triton.cdiv(n_queries, block_q), triton.cdiv(n_groups, block_g)),
           q, k, v, kv_lengths, out, n_groups, n_queries, n_keys, dim, n_segments, d_segments, float(scale),
           CAUSAL=bool(causal), BLOCK_G=block_g, BLOCK_Q=block_q, W=width, GP=slots,
           DW=d_width, DGP=d_slots, DV=dims)
    return out
