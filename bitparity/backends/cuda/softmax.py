"""The softmax family (spec 8): logsumexp, log_softmax, softmax, entropy, token_logprobs.

Every kernel first computes the row statistics by segments (``_softmax_stats``,
canonical._softmax_stats, spec 8.2): per segment the maximum m_g, then the
canonical sums n_g of the exponentials exp(w - m_g) that are exactly 1 and
t_g of the others; then the row shift, the partial trees count and rest,
their TwoSum total + err, recip = 1/total and log_total = log(total) + err * recip.
Each op then finishes with its own elementwise pass or canonical sum, in the
order of the same-named function in canonical.py.  Every kernel reads one
scale per row, scale: f32[n_rows] (spec 8.1: w = x * scale[r]), as sampling.py
does.  ``softmax_stats`` takes the function that loads a chunk of the rows as
an argument, so attention (attention.py) computes the same statistics over the
scores it computes chunk by chunk.

The backward kernels (spec 26) sit after the forward ones.  Where they need
a row statistic they recompute it with the same ``_softmax_stats`` from the
same inputs, which gives the forward's bits; where the forward's output
carries what they need (log_softmax, softmax, entropy) they read it.
"""

import torch
import triton
import triton.language as tl

from . import canonical
from .canonical import (NEG_INF, SEGMENT, masked_row_sum, nan_max, neg_zeros, program_rows, put, tree_max,
                        tree_sum)
from .layout import block_rows, launch, row_layout


@triton.jit
def _load_scaled(x_ptr, mask_ptr, offs, inside, scale, HAS_MASK: tl.constexpr):
    # offs, inside: [BLOCK_R, W], scale: [BLOCK_R, 1] -> w = x * scale, and -inf where
    # masked out (canonical._scaled) or outside the row (the -inf padding of the segment view).
    w = tl.load(x_ptr + offs, mask=inside, other=0.0) * scale
    keep = inside
    if HAS_MASK:
        keep = keep & tl.load(mask_ptr + offs, mask=inside, other=False)
    return tl.where(keep, w, NEG_INF)


@triton.jit
def _log_probs(w, shift, total, log_total):
    # w: [BLOCK_R, W], the row statistics: [BLOCK_R] -> log_softmax of w, bit for
    # bit (canonical._log_probs): (w - shift) - log_total, -inf on the rows with no
    # finite maximum (total == 0).
    out = (w - shift[:, None]) - log_total[:, None]
    return tl.where((total == 0.0)[:, None], NEG_INF, out)


@triton.jit
def _counted(mask_ptr, offs, inside, v, HAS_MASK: tl.constexpr):
    # offs, inside, v: [BLOCK_R, W] -> select(m, v, +0.0): a gradient entry that
    # does not count is +0.0 (spec 26.1), whatever v is there.
    if HAS_MASK:
        v = tl.where(tl.load(mask_ptr + offs, mask=inside, other=False), v, 0.0)
    return v


@triton.jit
def _row_scales(scale_ptr, rows, rows_ok):
    # rows, rows_ok: [BLOCK_R] -> scale: [BLOCK_R, 1], each row's own (spec 8.1).
    return tl.load(scale_ptr + rows, mask=rows_ok, other=1.0)[:, None]


@triton.jit
def softmax_stats(load_chunk, chunk_args, n_cols, n_segments,
                  BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # -> (shift, total, log_total, recip), each [BLOCK_R], of BLOCK_R rows of
    # n_cols entries w, whose chunks load_chunk(chunk_args, cols) gives: cols
    # [W] -> w [BLOCK_R, W], -inf where masked out or past n_cols.
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    # m_g, n_g and t_g of segment g in slot g.  The segments run in sequence
    # here; a split-row version would give each segment its own program,
    # write these [n_rows, GP] partials and combine them afterwards, same bits.
    seg_maxes = tl.full((BLOCK_R, GP), NEG_INF, tl.float32)             # [BLOCK_R, GP]
    seg_counts = neg_zeros((BLOCK_R, GP))                               # [BLOCK_R, GP]
    seg_rests = neg_zeros((BLOCK_R, GP))                                # [BLOCK_R, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        # Pass 1: m_g, the NaN-propagating maximum (+0.0 makes a zero maximum +0.0).
        lane_max = tl.full((BLOCK_R, W), NEG_INF, tl.float32)           # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            lane_max = nan_max(lane_max, load_chunk(chunk_args, start + lanes))
        seg_max = tree_max(lane_max) + 0.0                              # [BLOCK_R]
        seg_shift = tl.where(seg_max == NEG_INF, 0.0, seg_max)
        # Pass 2: n_g and t_g, lane j adding the terms of w[j], w[j + W], ...
        # in order, then the halving tree.  Lanes start at -0.0 (spec 3,
        # step 2).  Zeros (masked, padding, underflow) enter both sums as
        # -0.0, the exact identity, so the all-padding chunks of the last
        # segment are skipped without changing a bit (spec 8.2).
        lane_count = neg_zeros((BLOCK_R, W))                            # [BLOCK_R, W]
        lane_rest = neg_zeros((BLOCK_R, W))                             # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            e = canonical.exp(load_chunk(chunk_args, start + lanes) - seg_shift[:, None])
            one = e == 1.0
            lane_count = lane_count + tl.where(one, 1.0, neg_zero)
            lane_rest = lane_rest + tl.where(one | (e == 0.0), neg_zero, e)
        seg_maxes = put(seg_maxes, slots, g, seg_max)
        seg_counts = put(seg_counts, slots, g, tree_sum(lane_count))
        seg_rests = put(seg_rests, slots, g, tree_sum(lane_rest))
    row_max = tree_max(seg_maxes) + 0.0                                 # [BLOCK_R]
    shift = tl.where(row_max == NEG_INF, 0.0, row_max)
    # Partial trees over the GP slots; the slots past the last segment are
    # -0.0, selected rather than computed (their terms would be NaN when shift is).
    used = (slots < n_segments)[None, :]                                # [1, GP]
    c = canonical.exp(seg_maxes - shift[:, None])                       # [BLOCK_R, GP]
    top = c == 1.0
    count = tree_sum(tl.where(used & top, seg_counts, neg_zero))
    rest = tree_sum(tl.where(used, tl.where(top, seg_rests, c * (seg_counts + seg_rests)), neg_zero))
    # TwoSum: total + err == count + rest exactly.
    total = count + rest
    bb = total - count
    err = (count - (total - bb)) + (rest - bb)
    recip = tl.where(total == 0.0, 0.0, canonical.reciprocal(total))    # 0 for an empty row
    return shift, total, canonical.log(total) + err * recip, recip


@triton.jit
def _load_chunk(chunk_args, cols):
    # chunk_args = (x_ptr, mask_ptr, row_start, rows_ok, n_cols, scale, HAS_MASK),
    # row_start, rows_ok: [BLOCK_R], scale: [BLOCK_R, 1]; cols: [W] -> w: [BLOCK_R, W], as _load_scaled.
    # HAS_MASK is read by index: unpacking a tuple makes its constexprs run-time values.
    x_ptr, mask_ptr, row_start, rows_ok, n_cols, scale, _ = chunk_args
    inside = rows_ok[:, None] & (cols < n_cols)[None, :]
    return _load_scaled(x_ptr, mask_ptr, row_start[:, None] + cols[None, :], inside, scale, chunk_args[6])


@triton.jit
def _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, scale,
                   HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # row_start, rows_ok: [BLOCK_R], scale: [BLOCK_R, 1] -> (shift, total, log_total,
    # recip), each [BLOCK_R], of the rows w = x * scale, -inf where masked out.
    return softmax_stats(_load_chunk, (x_ptr, mask_ptr, row_start, rows_ok, n_cols, scale, HAS_MASK),
                         n_cols, n_segments, BLOCK_R, W, GP)


@triton.jit
def logsumexp_kernel(x_ptr, mask_ptr, scale_ptr, out_ptr, n_rows, n_cols, n_segments,
                     HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows] = shift + log_total.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, _, log_total, _ = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, scale,
                                            HAS_MASK, BLOCK_R, W, GP)
    tl.store(out_ptr + rows, shift + log_total, mask=rows_ok)


@triton.jit
def log_softmax_kernel(x_ptr, mask_ptr, scale_ptr, out_ptr, n_rows, n_cols, n_segments,
                       HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols]; out = (w - shift) - log_total, -inf on empty rows.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, total, log_total, _ = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments,
                                                scale, HAS_MASK, BLOCK_R, W, GP)
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = _load_scaled(x_ptr, mask_ptr, offs, inside, scale, HAS_MASK)
        tl.store(out_ptr + offs, _log_probs(w, shift, total, log_total), mask=inside)


@triton.jit
def softmax_kernel(x_ptr, mask_ptr, scale_ptr, out_ptr, n_rows, n_cols, n_segments,
                   HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols]; out = exp(w - shift) * recip (recip is 0 on empty rows).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, _, _, recip = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, scale,
                                        HAS_MASK, BLOCK_R, W, GP)
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = _load_scaled(x_ptr, mask_ptr, offs, inside, scale, HAS_MASK)
        tl.store(out_ptr + offs, canonical.exp(w - shift[:, None]) * recip[:, None], mask=inside)


@triton.jit
def entropy_kernel(x_ptr, mask_ptr, scale_ptr, out_ptr, n_rows, n_cols, n_segments,
                   HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask: [n_rows, n_cols]; out: [n_rows] = canonical sum of
    # (e_i * recip) * (log_total - d_i), d_i = w_i - shift, e_i = exp(d_i),
    # with -0.0 where e_i == 0 (spec 8.4), then + 0.0.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, _, log_total, recip = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments,
                                                scale, HAS_MASK, BLOCK_R, W, GP)
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)
    slots = tl.arange(0, GP)
    # The canonical sum of the terms: the segments, lanes and trees of canonical.masked_row_sum.
    partials = neg_zeros((BLOCK_R, GP))                                 # [BLOCK_R, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes
            inside = rows_ok[:, None] & (cols < n_cols)[None, :]
            w = _load_scaled(x_ptr, mask_ptr, row_start[:, None] + cols[None, :], inside, scale, HAS_MASK)
            d = w - shift[:, None]
            e = canonical.exp(d)
            terms = (e * recip[:, None]) * (log_total[:, None] - d)
            # -0.0 where e == 0, and -0.0 padding outside the row whatever
            # the terms there would be (a NaN e keeps its NaN term).
            acc = acc + tl.where(inside & (e != 0.0), terms, neg_zero)
        partials = put(partials, slots, g, tree_sum(acc))
    tl.store(out_ptr + rows, tree_sum(partials) + 0.0, mask=rows_ok)


@triton.jit
def token_logprobs_kernel(x_ptr, tokens_ptr, scale_ptr, out_ptr, n_rows, n_cols, n_segments,
                          BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x: [n_rows, n_cols], tokens: [n_rows] int64; out: [n_rows] =
    # (w[token] - shift) - log_total, -inf on empty rows: log_softmax's bits at the token.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = tl.load(scale_ptr + rows, mask=rows_ok, other=1.0)          # [BLOCK_R]
    shift, total, log_total, _ = _softmax_stats(x_ptr, x_ptr, row_start, rows_ok, n_cols, n_segments,
                                                scale[:, None], False, BLOCK_R, W, GP)
    tokens = tl.load(tokens_ptr + rows, mask=rows_ok, other=0)          # [BLOCK_R]
    chosen = tl.load(x_ptr + row_start + tokens, mask=rows_ok, other=0.0) * scale
    out = (chosen - shift) - log_total
    tl.store(out_ptr + rows, tl.where(total == 0.0, NEG_INF, out), mask=rows_ok)


# -- Backward (spec 26) ------------------------------------------------------------
# Each kernel gives dx of BLOCK_R rows, in the order of the same-named
# function in canonical.py: the temperature's one multiply dx = dw * scale
# comes last (spec 26.1), before the +0.0 of the entries that do not count.

@triton.jit
def logsumexp_backward_kernel(x_ptr, mask_ptr, scale_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments,
                              HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols], g: [n_rows]; out = select(m, (g * P) * scale, +0.0)
    # with P = exp(log_softmax(x)), log_softmax recomputed from the forward's statistics (spec 26.2).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, total, log_total, _ = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments,
                                                scale, HAS_MASK, BLOCK_R, W, GP)
    g = tl.load(g_ptr + rows, mask=rows_ok, other=0.0)[:, None]         # [BLOCK_R, 1]
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = _load_scaled(x_ptr, mask_ptr, offs, inside, scale, HAS_MASK)
        p = canonical.exp(_log_probs(w, shift, total, log_total))
        tl.store(out_ptr + offs, _counted(mask_ptr, offs, inside, (g * p) * scale, HAS_MASK), mask=inside)


@triton.jit
def log_softmax_backward_kernel(y_ptr, mask_ptr, scale_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments,
                                HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr,
                                GP: tl.constexpr):
    # y (the forward's output), mask, g, out: [n_rows, n_cols] (spec 26.3):
    #   G   = canonical sum of select(m, g, -0.0)
    #   out = select(m, (g - exp(y) * G) * scale, +0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    big_g, _ = masked_row_sum(g_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, HAS_MASK, BLOCK_R, W, GP)
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        y = tl.load(y_ptr + offs, mask=inside, other=0.0)
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        out = (g - canonical.exp(y) * big_g[:, None]) * scale
        tl.store(out_ptr + offs, _counted(mask_ptr, offs, inside, out, HAS_MASK), mask=inside)


@triton.jit
def softmax_backward_kernel(p_ptr, mask_ptr, scale_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments,
                            HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # p (the forward's output), mask, g, out: [n_rows, n_cols] (spec 26.4):
    #   G   = canonical sum of select(m, g * p, -0.0)
    #   out = select(m, (p * (g - G)) * scale, +0.0).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    big_g, _ = masked_row_sum(p_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments, HAS_MASK, BLOCK_R, W, GP,
                              factor_ptr=g_ptr)
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        p = tl.load(p_ptr + offs, mask=inside, other=0.0)
        g = tl.load(g_ptr + offs, mask=inside, other=0.0)
        out = (p * (g - big_g[:, None])) * scale
        tl.store(out_ptr + offs, _counted(mask_ptr, offs, inside, out, HAS_MASK), mask=inside)


@triton.jit
def entropy_backward_kernel(x_ptr, mask_ptr, scale_ptr, h_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments,
                            HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, mask, out: [n_rows, n_cols], h (the forward's output), g: [n_rows] (spec 26.5):
    #   d = w - shift, e = exp(d), q = e * recip, a = log_total - d (entropy_kernel's terms)
    #   out = select(m, select(e == 0, +0.0, ((q * (a - h)) * g) * scale), +0.0).
    # A masked entry has e == 0 already, except in a row whose shift is NaN: the outer
    # select keeps it +0.0 there too (spec 26.1).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, _, log_total, recip = _softmax_stats(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments,
                                                scale, HAS_MASK, BLOCK_R, W, GP)
    h = tl.load(h_ptr + rows, mask=rows_ok, other=0.0)[:, None]         # [BLOCK_R, 1]
    g = tl.load(g_ptr + rows, mask=rows_ok, other=0.0)[:, None]         # [BLOCK_R, 1]
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        d = _load_scaled(x_ptr, mask_ptr, offs, inside, scale, HAS_MASK) - shift[:, None]
        e = canonical.exp(d)
        q = e * recip[:, None]
        a = log_total[:, None] - d
        out = ((q * (a - h)) * g) * scale
        out = _counted(mask_ptr, offs, inside, tl.where(e == 0.0, 0.0, out), HAS_MASK)
        tl.store(out_ptr + offs, out, mask=inside)


@triton.jit
def token_logprobs_backward_kernel(x_ptr, tokens_ptr, scale_ptr, g_ptr, out_ptr, n_rows, n_cols, n_segments,
                                   BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, out: [n_rows, n_cols], tokens: [n_rows] int64, g: [n_rows] (spec 26.6):
    #   out = (select(i == token, g, +0.0) - P * g) * scale, P = exp(log_softmax(x)).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    scale = _row_scales(scale_ptr, rows, rows_ok)                      # [BLOCK_R, 1]
    shift, total, log_total, _ = _softmax_stats(x_ptr, x_ptr, row_start, rows_ok, n_cols, n_segments, scale,
                                                False, BLOCK_R, W, GP)
    tokens = tl.load(tokens_ptr + rows, mask=rows_ok, other=0)[:, None]  # [BLOCK_R, 1]
    g = tl.load(g_ptr + rows, mask=rows_ok, other=0.0)[:, None]         # [BLOCK_R, 1]
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = _load_scaled(x_ptr, x_ptr, offs, inside, scale, False)
        p = canonical.exp(_log_probs(w, shift, total, log_total))
        hit = cols[None, :] == tokens
        tl.store(out_ptr + offs, (tl.where(hit, g, 0.0) - p * g) * scale, mask=inside)


def _launch(kernel, tensors, **constexprs):
    # tensors: the kernel's tensor arguments in order, the first [n_rows, n_cols]
    # (x, or the forward's output), the last the output.
    n_rows, n_cols = tensors[0].shape
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(kernel, triton.cdiv(n_rows, rows), *tensors, n_rows, n_cols, n_segments,
           BLOCK_R=rows, W=width, GP=slots, **constexprs)
    return tensors[-1]


def _masked(kernel, x, mask, scale, *tensors):
    # tensors: the kernel's tensor arguments after x, the mask (x itself when there is none) and scale.
    return _launch(kernel, (x, x if mask is None else mask, scale, *tensors), HAS_MASK=mask is not None)


def _row_out(x):
    return torch.empty(x.shape[0], dtype=torch.float32, device=x.device)


def logsumexp(x, mask, scale):
    return _masked(logsumexp_kernel, x, mask, scale, _row_out(x))


def log_softmax(x, mask, scale):
    return _masked(log_softmax_kernel, x, mask, scale, torch.empty_like(x))


def softmax(x, mask, scale):
    return _masked(softmax_kernel, x, mask, scale, torch.empty_like(x))


def entropy(x, mask, scale):
    return _masked(entropy_kernel, x, mask, scale, _row_out(x))


def token_logprobs(x, tokens, scale):
    return _launch(token_logprobs_kernel, (x, tokens, scale, _row_out(x)))


def logsumexp_backward(x, mask, scale, g):
    return _masked(logsumexp_backward_kernel, x, mask, scale, g, torch.empty_like(x))


def log_softmax_backward(y, mask, scale, g):
    return _masked(log_softmax_backward_kernel, y, mask, scale, g, torch.empty_like(y))


def softmax_backward(p, mask, scale, g):
    return _masked(softmax_backward_kernel, p, mask, scale, g, torch.empty_like(p))


def entropy_backward(x, mask, scale, h, g):
    return _masked(entropy_backward_kernel, x, mask, scale, h, g, torch.empty_like(x))


def token_logprobs_backward(x, tokens, scale, g):
    return _launch(token_logprobs_backward_kernel, (x, tokens, scale, g, torch.empty_like(x)))
