"""attention (spec 24.4): softmax(q k^T * scale, masked) v per group, as canonical.attention;
and its backward (spec 29.6), as canonical.attention_backward.

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

The backward (spec 29.6) runs in two kernels, as flash-attention's does, with
each sum in spec 3's order over its own axis and no atomics:
  1. per query row (the forward's tiles): the softmax statistics again (the
     forward's bits), G_i = canonical sum over the keys of
     select(counts, dp_ij * p_ij, -0.0) with dp_ij = dot(g_i, v_j), and
     dq_id = canonical sum over the keys of select(counts, ds_ij * k_jd, -0.0),
     ds_ij = (p_ij * (dp_ij - G_i)) * scale; shift, recip and G of every query
     are stored, [G, Tq] each;
  2. per key row (tiles of keys, layout.attention_tile with the queries as
     lanes): p_ij and ds_ij again from the stored statistics, then
     dk_jd = canonical sum over the queries of select(counts, ds_ij * q_id, -0.0)
     and dv_jd = the same of p_ij * g_id.  A key that no query counts sums
     nothing: -0.0.
Pairs that do not count are never loaded as numbers, as in the forward.
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


@triton.jit
def _gradient_terms(score_args, grad_args, keys, shift, recip):
    # score_args as _scores; grad_args = (g_ptr, v_ptr); keys: [W]; shift, recip: [BLOCK_R]
    # -> (counts, p, dp), each [BLOCK_R, W]: whether key j counts, p_j = exp(w_j - shift) * recip
    # (the forward's probabilities) and dp_j = dot(g_i, v_j), -0.0 where key j does not count.
    _, _, q_start, kv_start, rows_ok, limit, dim, d_segments, _, d_lanes, d_slots = score_args
    g_ptr, v_ptr = grad_args
    counts = _key_counts(rows_ok, limit, keys)
    p = canonical.exp(_scores(score_args, keys) - shift[:, None]) * recip[:, None]
    v_starts = kv_start[:, None] + keys.to(tl.int64)[None, :] * dim     # [BLOCK_R, W]
    dp = dot_sums(g_ptr, q_start[:, None], rows_ok[:, None], v_ptr, v_starts, counts, dim, d_segments, d_lanes, d_slots)
    return counts, p, dp


@triton.jit
def attention_backward_query_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, g_ptr, dq_ptr, shift_ptr, recip_ptr,
                                    big_g_ptr, n_groups, n_queries, n_keys, dim, n_segments, d_segments, scale,
                                    CAUSAL: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_Q: tl.constexpr,
                                    W: tl.constexpr, GP: tl.constexpr, DW: tl.constexpr, DGP: tl.constexpr,
                                    DV: tl.constexpr):
    # q, g, dq: [G, Tq, D]; k, v: [G, Tk, D]; kv_lengths: [G] int64; shift, recip, big_g: [G, Tq].
    # Rows, tiles and the keys' lanes as attention_kernel.
    BLOCK_R: tl.constexpr = BLOCK_G * BLOCK_Q
    tile = tl.arange(0, BLOCK_R)                                        # [BLOCK_R]
    group = tl.program_id(1) * BLOCK_G + (tile >> log2(BLOCK_Q))
    query = tl.program_id(0) * BLOCK_Q + (tile & (BLOCK_Q - 1))
    rows_ok = (group < n_groups) & (query < n_queries)
    row = group.to(tl.int64) * n_queries + query
    q_start = row * dim                                                 # also g's and dq's row start
    kv_start = group.to(tl.int64) * n_keys * dim
    limit = tl.load(lengths_ptr + group, mask=rows_ok, other=1)
    if CAUSAL:
        limit = tl.minimum(limit, (query + (n_keys - n_queries) + 1).to(tl.int64))
    score_args = (q_ptr, k_ptr, q_start, kv_start, rows_ok, limit, dim, d_segments, scale,
                  tl.arange(0, DW), tl.arange(0, DGP))
    grad_args = (g_ptr, v_ptr)
    shift, _, _, recip = softmax_stats(_scores, score_args, n_keys, n_segments, BLOCK_R, W, GP)

    # G = canonical sum over the keys of select(counts, dp * p, -0.0) (spec 26.4's G).
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    g_partials = neg_zeros((BLOCK_R, GP))                               # [BLOCK_R, GP]
    for seg in range(n_segments):
        seg_start = seg * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_keys)
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            counts, p, dp = _gradient_terms(score_args, grad_args, start + lanes, shift, recip)
            acc = acc + tl.where(counts, dp * p, neg_zero)
        g_partials = put(g_partials, slots, seg, tree_sum(acc))
    big_g = tree_sum(g_partials)                                        # [BLOCK_R]
    tl.store(shift_ptr + row, shift, mask=rows_ok)
    tl.store(recip_ptr + row, recip, mask=rows_ok)
    tl.store(big_g_ptr + row, big_g, mask=rows_ok)

    # dq[r, d] = canonical sum over the keys of select(counts, ds_j * k_jd, -0.0),
    # ds_j = (p_j * (dp_j - G)) * scale, DV dims at a time, lanes along the keys.
    for d_start in range(0, dim, DV):
        dims = d_start + tl.arange(0, DV)                               # [DV]
        dims_ok = dims < dim
        partials = neg_zeros((BLOCK_R * DV, GP))                        # [BLOCK_R * DV, GP]
        for seg in range(n_segments):
            seg_start = seg * SEGMENT
            seg_end = tl.minimum(seg_start + SEGMENT, n_keys)
            acc = neg_zeros((BLOCK_R, DV, W))                           # [BLOCK_R, DV, W]
            for start in range(seg_start, seg_end, W):
                keys = start + lanes                                    # [W]
                counts, p, dp = _gradient_terms(score_args, grad_args, keys, shift, recip)
                ds = (p * (dp - big_g[:, None])) * scale                # [BLOCK_R, W]
                taken = counts[:, None, :] & dims_ok[None, :, None]     # [BLOCK_R, DV, W]
                k_offs = kv_start[:, None, None] + keys.to(tl.int64)[None, None, :] * dim + dims[None, :, None]
                k = tl.load(k_ptr + k_offs, mask=taken, other=0.0)      # [BLOCK_R, DV, W]
                acc = acc + tl.where(taken, ds[:, None, :] * k, neg_zero)
            partials = put(partials, slots, seg, tree_sum(tl.reshape(acc, (BLOCK_R * DV, W))))
        dq = tl.reshape(tree_sum(partials), (BLOCK_R, DV))              # [BLOCK_R, DV]
        tl.store(dq_ptr + q_start[:, None] + dims[None, :], dq, mask=rows_ok[:, None] & dims_ok[None, :])


@triton.jit
def attention_backward_key_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, g_ptr, shift_ptr, recip_ptr, big_g_ptr,
                                  dk_ptr, dv_ptr, n_groups, n_queries, n_keys, dim, n_segments, d_segments, scale,
                                  CAUSAL: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
                                  W: tl.constexpr, GP: tl.constexpr, DW: tl.constexpr, DGP: tl.constexpr,
                                  DV: tl.constexpr):
    # q, g: [G, Tq, D]; k, v, dk, dv: [G, Tk, D]; kv_lengths: [G] int64; shift, recip, big_g: [G, Tq]
    # (from attention_backward_query_kernel).  Program (a, b): the BLOCK_R = BLOCK_G * BLOCK_K
    # key rows of keys block a of groups block b (shifts and masks, as attention_kernel).  W, GP:
    # lanes and segment slots over the Tq queries; DW, DGP: over the D dims of a score; DV: dims
    # of dk and dv per pass.
    BLOCK_R: tl.constexpr = BLOCK_G * BLOCK_K
    tile = tl.arange(0, BLOCK_R)                                        # [BLOCK_R]
    group = tl.program_id(1) * BLOCK_G + (tile >> log2(BLOCK_K))
    key = tl.program_id(0) * BLOCK_K + (tile & (BLOCK_K - 1))
    rows_ok = (group < n_groups) & (key < n_keys)
    kv_start = (group.to(tl.int64) * n_keys + key) * dim                # also dk's and dv's row start
    q_base = group.to(tl.int64) * n_queries                             # the group's first query row
    # Query i counts for key j iff j < kv_lengths[g] and, when causal, i >= j - (Tk - Tq).
    live = rows_ok & (key < tl.load(lengths_ptr + group, mask=rows_ok, other=0))
    first = tl.full((BLOCK_R,), 0, tl.int32)
    if CAUSAL:
        first = key - (n_keys - n_queries)
    d_lanes = tl.arange(0, DW)
    d_slots = tl.arange(0, DGP)
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    for d_start in range(0, dim, DV):
        dims = d_start + tl.arange(0, DV)                               # [DV]
        dims_ok = dims < dim
        dk_partials = neg_zeros((BLOCK_R * DV, GP))                     # [BLOCK_R * DV, GP]
        dv_partials = neg_zeros((BLOCK_R * DV, GP))
        for seg in range(n_segments):
            seg_start = seg * SEGMENT
            seg_end = tl.minimum(seg_start + SEGMENT, n_queries)
            dk_acc = neg_zeros((BLOCK_R, DV, W))                        # [BLOCK_R, DV, W]
            dv_acc = neg_zeros((BLOCK_R, DV, W))
            for start in range(seg_start, seg_end, W):
                queries = start + lanes                                 # [W]
                counts = live[:, None] & (queries[None, :] >= first[:, None]) & (queries < n_queries)[None, :]
                rows = q_base[:, None] + queries[None, :]               # [BLOCK_R, W]
                # The forward's w, p and the backward's dp, ds of each counted pair (i, j).
                w = dot_sums(k_ptr, kv_start[:, None], rows_ok[:, None], q_ptr, rows * dim, counts,
                             dim, d_segments, d_lanes, d_slots) * scale
                shift = tl.load(shift_ptr + rows, mask=counts, other=0.0)
                recip = tl.load(recip_ptr + rows, mask=counts, other=0.0)
                big_g = tl.load(big_g_ptr + rows, mask=counts, other=0.0)
                p = canonical.exp(w - shift) * recip
                dp = dot_sums(v_ptr, kv_start[:, None], rows_ok[:, None], g_ptr, rows * dim, counts,
                              dim, d_segments, d_lanes, d_slots)
                ds = (p * (dp - big_g)) * scale                         # [BLOCK_R, W]
                taken = counts[:, None, :] & dims_ok[None, :, None]     # [BLOCK_R, DV, W]
                offs = rows[:, None, :] * dim + dims[None, :, None]     # [BLOCK_R, DV, W]
                q = tl.load(q_ptr + offs, mask=taken, other=0.0)
                g = tl.load(g_ptr + offs, mask=taken, other=0.0)
                dk_acc = dk_acc + tl.where(taken, ds[:, None, :] * q, neg_zero)
                dv_acc = dv_acc + tl.where(taken, p[:, None, :] * g, neg_zero)
            dk_partials = put(dk_partials, slots, seg, tree_sum(tl.reshape(dk_acc, (BLOCK_R * DV, W))))
            dv_partials = put(dv_partials, slots, seg, tree_sum(tl.reshape(dv_acc, (BLOCK_R * DV, W))))
        offs = kv_start[:, None] + dims[None, :]                        # [BLOCK_R, DV]
        done = rows_ok[:, None] & dims_ok[None, :]
        tl.store(dk_ptr + offs, tl.reshape(tree_sum(dk_partials), (BLOCK_R, DV)), mask=done)
        tl.store(dv_ptr + offs, tl.reshape(tree_sum(dv_partials), (BLOCK_R, DV)), mask=done)


def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    n_groups, n_queries, dim = q.shape
    n_keys = k.shape[1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    shift, recip, big_g = (torch.empty((n_groups, n_queries), dtype=torch.float32, device=q.device)
                           for _ in range(3))
    d_width, d_segments, d_slots = row_layout(dim)
    width, n_segments, slots = row_layout(n_keys)
    block_g, block_q, dims = attention_tile(n_groups, n_queries, width, dim)
    launch(attention_backward_query_kernel, (triton.cdiv(n_queries, block_q), triton.cdiv(n_groups, block_g)),
           q, k, v, kv_lengths, g, dq, shift, recip, big_g, n_groups, n_queries, n_keys, dim, n_segments,
           d_segments, float(scale), CAUSAL=bool(causal), BLOCK_G=block_g, BLOCK_Q=block_q, W=width, GP=slots,
           DW=d_width, DGP=d_slots, DV=dims)
    width, n_segments, slots = row_layout(n_queries)
    block_g, block_k, dims = attention_tile(n_groups, n_keys, width, dim)
    launch(attention_backward_key_kernel, (triton.cdiv(n_keys, block_k), triton.cdiv(n_groups, block_g)),
           q, k, v, kv_lengths, g, shift, recip, big_g, dk, dv, n_groups, n_queries, n_keys, dim, n_segments,
           d_segments, float(scale), CAUSAL=bool(causal), BLOCK_G=block_g, BLOCK_K=block_k, W=width, GP=slots,
           DW=d_width, DGP=d_slots, DV=dims)
    return dq, dk, dv
