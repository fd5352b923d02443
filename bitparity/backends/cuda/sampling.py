"""philox, filter_logits and sample (spec 19-22), as the same-named functions of canonical.py.

filter_logits handles each row in passes over it:
  1. w = x * scale: the row maximum (the shift) and whether a w is NaN or +inf (a bad row);
  2. e = exp(w - shift), keep = (w != -inf) and, with min-p, e >= min_p; the scratch rows
     get left = select(keep, w, -inf) and, for top-p, mass = select(keep, e, -0.0);
  3. top-k: t_k = the key (canonical.order_key) of the k-th largest left, 32 counting passes;
  4. top-p: t_p = the smallest key t with A(t) < top_p * Z, 32 passes of one canonical sum
     each (A(t) is non-increasing in t, spec 21, so bisection finds the reference's value);
  5. out = select(order_key(left) >= max(t_k, t_p), left, -inf), all NaN on a bad row.
Top-k and top-p each keep the tokens whose key reaches a threshold, so the kept set is
left's tokens above one floor.  sample runs steps 1-4 and then takes the lowest-index
maximum of out - noise, the noise of each token drawn from Philox (spec 19, 20).

On a GPU one program takes one row (layout.block_rows); the passes run in sequence within it.
A split-row version for [64, 151936] would give each segment its own program in every pass
and combine the [n_rows, GP] counts and partials between passes (one launch per pass):
the same counts and the same canonical sums, so the same bits.
"""

import torch
import triton
import triton.language as tl

from ... import spec
from . import canonical
from .canonical import (INT32_MIN, NEG_INF, POS_INF, NAN, SEGMENT, halves, kth_largest_key, log2, negate,
                        neg_zeros, order_key, program_rows, put, tree_max, tree_sum)
from .layout import block_elements, block_rows, launch, row_layout

_f = spec.f32

PHILOX_ROUNDS: tl.constexpr = tl.constexpr(spec.PHILOX_ROUNDS)
PHILOX_M0: tl.constexpr = tl.constexpr(spec.PHILOX_M0)
PHILOX_M1: tl.constexpr = tl.constexpr(spec.PHILOX_M1)
PHILOX_W0: tl.constexpr = tl.constexpr(spec.PHILOX_W0)
PHILOX_W1: tl.constexpr = tl.constexpr(spec.PHILOX_W1)
SAMPLE_STREAM: tl.constexpr = tl.constexpr(spec.SAMPLE_STREAM)
UNIFORM_COARSE_MIN: tl.constexpr = tl.constexpr(spec.UNIFORM_COARSE_MIN)
TWO_M24: tl.constexpr = tl.constexpr(_f(spec.TWO_M24_BITS))
TWO_M48: tl.constexpr = tl.constexpr(_f(spec.TWO_M48_BITS))
THIRD: tl.constexpr = tl.constexpr(_f(spec.THIRD_BITS))
HALF: tl.constexpr = tl.constexpr(_f(spec.HALF_BITS))


# -- Philox4x32-10 and the race noise (spec 19, 20) ---------------------------------

@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    # Counter words c0..c3 and key words k0, k1: uint32 tensors of one shape
    # -> the four output words.  tl.umulhi and the wrapping uint32 multiply
    # are the high and low words of the exact 64-bit product.
    for _ in tl.static_range(PHILOX_ROUNDS):
        hi0 = tl.umulhi(c0, PHILOX_M0)
        lo0 = c0 * PHILOX_M0
        hi1 = tl.umulhi(c2, PHILOX_M1)
        lo1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + PHILOX_W0
        k1 = k1 + PHILOX_W1
    return c0, c1, c2, c3


@triton.jit
def philox_kernel(counters_ptr, keys_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # counters: [n, 4], keys: [n, 2], out: [n, 4]; int64 holding uint32 words.
    i = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # [BLOCK]
    ok = i < n
    c0 = tl.load(counters_ptr + 4 * i, mask=ok, other=0).to(tl.uint32)
    c1 = tl.load(counters_ptr + 4 * i + 1, mask=ok, other=0).to(tl.uint32)
    c2 = tl.load(counters_ptr + 4 * i + 2, mask=ok, other=0).to(tl.uint32)
    c3 = tl.load(counters_ptr + 4 * i + 3, mask=ok, other=0).to(tl.uint32)
    k0 = tl.load(keys_ptr + 2 * i, mask=ok, other=0).to(tl.uint32)
    k1 = tl.load(keys_ptr + 2 * i + 1, mask=ok, other=0).to(tl.uint32)
    x0, x1, x2, x3 = philox4x32(c0, c1, c2, c3, k0, k1)
    # uint32 -> int64 zero-extends.
    tl.store(out_ptr + 4 * i, x0.to(tl.int64), mask=ok)
    tl.store(out_ptr + 4 * i + 1, x1.to(tl.int64), mask=ok)
    tl.store(out_ptr + 4 * i + 2, x2.to(tl.int64), mask=ok)
    tl.store(out_ptr + 4 * i + 3, x3.to(tl.int64), mask=ok)


@triton.jit
def race_noise(cols, pos_lo, pos_hi, seed_lo, seed_hi, BLOCK_R: tl.constexpr, W: tl.constexpr):
    # cols: [W] token indices; pos_*, seed_*: [BLOCK_R] uint32 words of the
    # int64 position and seed -> [BLOCK_R, W] float32 log(E), E token i's Exp(1) variate.
    # Token i reads words (x0, x1) of Philox(i >> 1, pos_lo, pos_hi, SAMPLE_STREAM;
    # seed_lo, seed_hi) when i is even, (x2, x3) when it is odd (spec 19).
    shape: tl.constexpr = (BLOCK_R, W)
    x0, x1, x2, x3 = philox4x32(tl.broadcast_to((cols >> 1).to(tl.uint32)[None, :], shape),
                            tl.broadcast_to(pos_lo[:, None], shape), tl.broadcast_to(pos_hi[:, None], shape),
                            tl.full(shape, SAMPLE_STREAM, tl.uint32),
                            tl.broadcast_to(seed_lo[:, None], shape), tl.broadcast_to(seed_hi[:, None], shape))
    odd = ((cols & 1) == 1)[None, :]
    a = tl.where(odd, x2, x0)
    b = tl.where(odd, x3, x1)
    # V in (0, 1): 24 bits of a (logical shifts: the words are uint32), and 23
    # more bits of b below 2**-8.  Every integer converted is below 2**24: exact.
    ha = (a >> 8).to(tl.int32)
    hb = (b >> 9).to(tl.int32)
    coarse = ha >= UNIFORM_COARSE_MIN
    v_coarse = ha.to(tl.float32) * TWO_M24
    v = tl.where(coarse, v_coarse, v_coarse + (2 * hb + 1).to(tl.float32) * TWO_M48)
    # E = -log(1 - V) (1 - V exact on the coarse grid; "-" a sign flip), or
    # V + V^2/2 + V^3/3 below 2**-8, then noise = log(E).
    one_minus_v = 1.0 - v
    big = negate(canonical.log(one_minus_v))
    s = v * THIRD
    s = s + HALF
    s = (v * v) * s
    small = v + s
    return canonical.log(tl.where(coarse, big, small))


# -- filter_logits (spec 21) --------------------------------------------------------

@triton.jit
def _mass_above(left_ptr, mass_ptr, row_start, rows_ok, n_cols, n_segments, above,
                BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # above: [BLOCK_R] int64 -> [BLOCK_R]: the canonical sum (spec 3) of
    # select(order_key(left) > above, mass, -0.0).  mass is -0.0 wherever a
    # token is not kept, so this is A(v) of spec 21 for the key above.
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    partials = neg_zeros((BLOCK_R, GP))                                 # [BLOCK_R, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        # Lanes start at -0.0 and skip the all-padding chunks: both exact (spec 3).
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes
            offs = row_start[:, None] + cols[None, :]                   # [BLOCK_R, W]
            inside = rows_ok[:, None] & (cols < n_cols)[None, :]
            keys = order_key(tl.load(left_ptr + offs, mask=inside, other=NEG_INF))
            terms = tl.load(mass_ptr + offs, mask=inside, other=0.0)
            acc = acc + tl.where(inside & (keys > above[:, None]), terms, neg_zero)
        partials = put(partials, slots, g, tree_sum(acc))
    return tree_sum(partials)


@triton.jit
def _filter_floor(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, left_ptr, mass_ptr,
                  rows, rows_ok, row_start, n_cols, n_segments,
                  USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                  BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # Steps 1-4 of the module docstring -> (bad, floor), each [BLOCK_R]: the
    # kept tokens are those with order_key(left) >= floor; left_ptr's rows hold left.
    # USE_*: whether any row of the launch uses a step; each row still applies
    # a step only when its own parameter is not neutral (spec 21).
    lanes = tl.arange(0, W)                                             # [W]
    scale = tl.load(scale_ptr + rows, mask=rows_ok, other=1.0)          # [BLOCK_R]
    # Pass 1: the maximum is order-free; bad counts NaN and +inf entries.
    lane_max = tl.full((BLOCK_R, W), NEG_INF, tl.float32)               # [BLOCK_R, W]
    lane_bad = tl.full((BLOCK_R, W), 0, tl.int32)                       # [BLOCK_R, W]
    for start in range(0, n_cols, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = tl.load(x_ptr + row_start[:, None] + cols[None, :], mask=inside, other=NEG_INF) * scale[:, None]
        lane_max = canonical.nan_max(lane_max, w)
        lane_bad += ((w != w) | (w == POS_INF)).to(tl.int32)
    bad = tree_sum(lane_bad) > 0                                        # [BLOCK_R]
    row_max = tree_max(lane_max) + 0.0
    shift = tl.where(row_max == NEG_INF, 0.0, row_max)
    # Pass 2: min-p, p_i >= min_p * p_max <=> e_i >= min_p; a bad row keeps nothing.
    neg_zero = neg_zeros(())
    min_p = tl.load(min_p_ptr + rows, mask=rows_ok, other=0.0)          # [BLOCK_R]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = tl.load(x_ptr + offs, mask=inside, other=NEG_INF) * scale[:, None]
        e = canonical.exp(w - shift[:, None])
        keep = (w != NEG_INF) & ~bad[:, None]
        if USE_MIN_P:
            keep = keep & ((min_p <= 0.0)[:, None] | (e >= min_p[:, None]))
        tl.store(left_ptr + offs, tl.where(keep, w, NEG_INF), mask=inside)
        if USE_TOP_P:
            tl.store(mass_ptr + offs, tl.where(keep, e, neg_zero), mask=inside)
    # The passes below read what this program just wrote.
    tl.debug_barrier()
    # Top-k: keep left >= the k-th largest left, counting repeats (ties stay).
    t_k = tl.full((BLOCK_R,), INT32_MIN, tl.int64)                      # [BLOCK_R]
    if USE_TOP_K:
        top_k = tl.load(top_k_ptr + rows, mask=rows_ok, other=0)
        use_k = (top_k > 0) & (top_k < n_cols)
        t_k = tl.where(use_k, kth_largest_key(left_ptr, row_start, rows_ok, n_cols, top_k, BLOCK_R, W), t_k)
    floor = t_k
    # Top-p: the smallest key t with A(t) < thr = top_p * Z, Z the kept mass.
    # A(-2**31 - 1) = Z >= thr and A(2**31 - 1) = -0.0 < thr (thr > 0 when
    # anything is kept), so after 32 halvings hi is that key.  Keys below t_k
    # are not kept: every sum counts only keys > max(t, t_k - 1).
    if USE_TOP_P:
        top_p = tl.load(top_p_ptr + rows, mask=rows_ok, other=1.0)
        below_k = t_k - 1
        thr = top_p * _mass_above(left_ptr, mass_ptr, row_start, rows_ok, n_cols, n_segments, below_k,
                                  BLOCK_R, W, GP)
        lo = tl.full((BLOCK_R,), INT32_MIN - 1, tl.int64)               # [BLOCK_R]
        hi = tl.full((BLOCK_R,), -INT32_MIN - 1, tl.int64)              # [BLOCK_R]
        for _ in range(32):
            mid = lo + ((hi - lo) >> 1)
            mass = _mass_above(left_ptr, mass_ptr, row_start, rows_ok, n_cols, n_segments,
                               tl.maximum(mid, below_k), BLOCK_R, W, GP)
            under = mass < thr
            hi = tl.where(under, mid, hi)
            lo = tl.where(under, lo, mid)
        floor = tl.where(top_p < 1.0, tl.maximum(floor, hi), floor)
    return bad, floor


@triton.jit
def filter_logits_kernel(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, mass_ptr,
                         n_rows, n_cols, n_segments,
                         USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                         BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, out, mass: [n_rows, n_cols]; scale, top_k, top_p, min_p: [n_rows].
    # out holds left until the last pass turns it into the output.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    bad, floor = _filter_floor(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, mass_ptr,
                               rows, rows_ok, row_start, n_cols, n_segments,
                               USE_MIN_P, USE_TOP_K, USE_TOP_P, BLOCK_R, W, GP)
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        left = tl.load(out_ptr + offs, mask=inside, other=NEG_INF)
        out = tl.where(order_key(left) >= floor[:, None], left, NEG_INF)
        tl.store(out_ptr + offs, tl.where(bad[:, None], NAN, out), mask=inside)


# -- sample (spec 22) ---------------------------------------------------------------

@triton.jit
def _first_argmax(values, cols):
    # values, cols: [R, W] -> ([R], [R]): the maximum of each row and the
    # lowest column holding it, by the halving tree (ties go to the lower column).
    for _ in tl.static_range(log2(values.shape[1])):
        v_lo, v_hi = halves(values)
        c_lo, c_hi = halves(cols)
        take_hi = (v_hi > v_lo) | ((v_hi == v_lo) & (c_hi < c_lo))
        values = tl.where(take_hi, v_hi, v_lo)
        cols = tl.where(take_hi, c_hi, c_lo)
    return tl.reshape(values, (values.shape[0],)), tl.reshape(cols, (cols.shape[0],))


@triton.jit
def sample_kernel(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, greedy_ptr, seeds_ptr, positions_ptr,
                  tokens_ptr, left_ptr, mass_ptr, n_rows, n_cols, n_segments,
                  USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                  BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, left, mass: [n_rows, n_cols]; the parameters and tokens: [n_rows].
    # token = lowest index of max_i score_i, score = x on greedy rows, else
    # f - noise with f the filtered logits; -1 on a bad row or when every score is -inf.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    bad, floor = _filter_floor(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, left_ptr, mass_ptr,
                               rows, rows_ok, row_start, n_cols, n_segments,
                               USE_MIN_P, USE_TOP_K, USE_TOP_P, BLOCK_R, W, GP)
    greedy = tl.load(greedy_ptr + rows, mask=rows_ok, other=False)[:, None]     # [BLOCK_R, 1]
    # The int64 seed and position as uint32 words of their two's-complement patterns.
    seeds = tl.load(seeds_ptr + rows, mask=rows_ok, other=0)            # [BLOCK_R]
    positions = tl.load(positions_ptr + rows, mask=rows_ok, other=0)    # [BLOCK_R]
    seed_lo, seed_hi = seeds.to(tl.uint32), (seeds >> 32).to(tl.uint32)
    pos_lo, pos_hi = positions.to(tl.uint32), (positions >> 32).to(tl.uint32)
    # Each lane keeps its first maximum: a later column replaces it only when strictly greater.
    lanes = tl.arange(0, W)
    best = tl.full((BLOCK_R, W), NEG_INF, tl.float32)                  # [BLOCK_R, W]
    best_cols = tl.full((BLOCK_R, W), 0, tl.int32)                      # [BLOCK_R, W]
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        left = tl.load(left_ptr + offs, mask=inside, other=NEG_INF)
        f = tl.where(order_key(left) >= floor[:, None], left, NEG_INF)
        score = f - race_noise(cols, pos_lo, pos_hi, seed_lo, seed_hi, BLOCK_R, W)
        score = tl.where(greedy, tl.load(x_ptr + offs, mask=inside, other=NEG_INF), score)
        better = score > best
        best = tl.where(better, score, best)
        best_cols = tl.where(better, cols[None, :], best_cols)
    top, token = _first_argmax(best, best_cols)
    none = bad | (top == NEG_INF)
    tl.store(tokens_ptr + rows, tl.where(none, -1, token.to(tl.int64)), mask=rows_ok)


# -- Host side ----------------------------------------------------------------------

def philox(counters, keys):
    n = counters.shape[0]
    out = torch.empty_like(counters)
    block = block_elements(n)
    launch(philox_kernel, triton.cdiv(n, block), counters, keys, out, n, BLOCK=block)
    return out


def _filter_launch(kernel, x, scale, top_k, top_p, min_p, *args):
    # Launches kernel(x, scale, top_k, top_p, min_p, *args, mass, ...); mass
    # is a scratch row per row, needed only when a row uses top-p.
    n_rows, n_cols = x.shape
    use_top_p = bool((top_p < 1.0).any())
    mass = torch.empty_like(x) if use_top_p else x
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    launch(kernel, triton.cdiv(n_rows, rows), x, scale, top_k, top_p, min_p, *args, mass,
           n_rows, n_cols, n_segments,
           USE_MIN_P=bool((min_p > 0.0).any()), USE_TOP_K=bool(((top_k > 0) & (top_k < n_cols)).any()),
           USE_TOP_P=use_top_p, BLOCK_R=rows, W=width, GP=slots)


def filter_logits(x, scale, top_k, top_p, min_p):
    out = torch.empty_like(x)
    _filter_launch(filter_logits_kernel, x, scale, top_k, top_p, min_p, out)
    return out


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    tokens = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _filter_launch(sample_kernel, x, scale, top_k, top_p, min_p, greedy, seeds, positions, tokens,
                   torch.empty_like(x))
    return tokens
