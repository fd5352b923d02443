"""philox, filter_logits and sample (spec 19-22), as the same-named functions of canonical.py.

filter_logits handles each row in passes over it:
  1. w = x * scale: the row maximum (the shift) and whether a w is NaN or +inf (a bad row);
  2. e = exp(w - shift), keep = (w != -inf) and, with min-p, e >= min_p; scratch rows get
     key = order_key(w) where kept, INT32_MIN elsewhere, and, for top-p, mass = select(keep, e, -0.0);
  3. top-k: t_k = the k-th largest key (canonical.kth_largest_key, exact counts);
  4. top-p: t_p = the smallest key t with A(t) < top_p * Z, A(t) the canonical sum of the
     masses with key > t (A is non-increasing in t, spec 21, so a search over keys finds
     the reference's value);
  5. out = select(key >= max(t_k, t_p), w, -inf), all NaN on a bad row.
Top-k and top-p each keep the tokens whose key reaches a threshold, so the kept set is one
floor on the keys.  Steps 3 and 4 are 8-way searches (canonical.search_probes): 11 sweeps
of the scratch rows each, every sweep evaluating 8 probes.  sample runs steps 1-4 and then
takes the lowest-index maximum of (out - shift) - noise, shift the row maximum, the noise of each token from Philox (spec 19, 20).

On a GPU one program takes one row (layout.block_rows); the sweeps run in sequence within
it.  A split-row version for [64, 151936] would give each segment its own program in every
sweep and combine the [n_rows, GP] counts and partials between sweeps (one launch per sweep):
the same counts and the same canonical sums, so the same bits.
"""

import torch
import triton
import triton.language as tl

from ... import spec
from . import canonical
from .canonical import (HALF, INT32_MIN, NEG_INF, POS_INF, SEARCH_PASSES, SEGMENT, halves, kth_largest_key, log2,
                        nans, negate, neg_zeros, order_key, program_rows, put, search_narrow, search_probes, tree_max,
                        tree_sum)
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
def race_noise(start, pos_lo, pos_hi, seed_lo, seed_hi, BLOCK_R: tl.constexpr, W: tl.constexpr):
    # start: the first of W token indices, a multiple of W; pos_*, seed_*:
    # [BLOCK_R] uint32 words of the int64 position and seed -> [BLOCK_R, W]
    # float32 log(E), E token i's Exp(1) variate.  Token i reads words
    # (x0, x1) of Philox(i >> 1, pos_lo, pos_hi, SAMPLE_STREAM; seed_lo,
    # seed_hi) when i is even, (x2, x3) when it is odd (spec 19): one Philox
    # call per pair of tokens, whose words are then interleaved.
    PW: tl.constexpr = (W + 1) // 2
    shape: tl.constexpr = (BLOCK_R, PW)
    pairs = ((start >> 1) + tl.arange(0, PW)).to(tl.uint32)             # [PW]
    x0, x1, x2, x3 = philox4x32(tl.broadcast_to(pairs[None, :], shape),
                                tl.broadcast_to(pos_lo[:, None], shape), tl.broadcast_to(pos_hi[:, None], shape),
                                tl.full(shape, SAMPLE_STREAM, tl.uint32),
                                tl.broadcast_to(seed_lo[:, None], shape), tl.broadcast_to(seed_hi[:, None], shape))
    if W == 1:
        # A one-token row: token 0, even.
        a = x0
        b = x1
    else:
        a = tl.reshape(tl.join(x0, x2), (BLOCK_R, W))                   # x0[0], x2[0], x0[1], ...
        b = tl.reshape(tl.join(x1, x3), (BLOCK_R, W))
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
def _mass_above(keys_ptr, mass_ptr, tile, n_cols, n_segments, above,
                BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # tile: [BLOCK_R, W] scratch offsets, above: [BLOCK_R, Q] int64 ->
    # [BLOCK_R, Q]: for each of the Q keys, the canonical sum (spec 3) of
    # select(key > above, mass, -0.0) over the row.  mass is -0.0 wherever a
    # token is not kept and in the padding, so this is A of spec 21 at each key.
    Q: tl.constexpr = above.shape[1]
    neg_zero = neg_zeros(())
    slots = tl.arange(0, GP)                                            # [GP]
    bounds = above[:, :, None]                                          # [BLOCK_R, Q, 1]
    partials = neg_zeros((BLOCK_R * Q, GP))                             # [BLOCK_R * Q, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        # Lanes start at -0.0 and skip the all-padding chunks: both exact (spec 3).
        acc = neg_zeros((BLOCK_R, Q, W))                                # [BLOCK_R, Q, W]
        for start in range(seg_start, seg_end, W):
            keys = tl.load(keys_ptr + tile + start).to(tl.int64)[:, None, :]    # [BLOCK_R, 1, W]
            mass = tl.load(mass_ptr + tile + start)[:, None, :]                 # [BLOCK_R, 1, W]
            acc = acc + tl.where(keys > bounds, mass, neg_zero)
        partials = put(partials, slots, g, tree_sum(tl.reshape(acc, (BLOCK_R * Q, W))))
    return tl.reshape(tree_sum(partials), (BLOCK_R, Q))


@triton.jit
def _scratch_tile(rows, n_padded, W: tl.constexpr):
    # rows: [BLOCK_R] -> [BLOCK_R, W] offsets of the rows' first W scratch entries.
    return rows.to(tl.int64)[:, None] * n_padded + tl.arange(0, W)[None, :]


@triton.jit
def _filter_rows(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, keys_ptr, mass_ptr,
                 n_rows, n_cols, n_padded, n_segments,
                 USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                 BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # Steps 1-4 of the module docstring for this program's rows -> (rows,
    # rows_ok, row_start, tile, scale, shift, bad, floor): the rows (program_rows),
    # their scratch offsets tile [BLOCK_R, W], scale and shift [BLOCK_R, 1], and bad and
    # floor [BLOCK_R]: the tokens kept are those whose scratch key is >= floor.
    # Scratch rows are n_padded wide, a multiple of W, and hold order_key(w)
    # for a kept token and INT32_MIN for the others and the padding
    # (floor > INT32_MIN); mass rows hold select(keep, e, -0.0).
    # USE_*: whether any row of the launch uses a step; each row still applies
    # a step only when its own parameter is not neutral (spec 21).
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    tile = _scratch_tile(rows, n_padded, W)                             # [BLOCK_R, W]
    lanes = tl.arange(0, W)                                             # [W]
    scale = tl.load(scale_ptr + rows, mask=rows_ok, other=1.0)[:, None]     # [BLOCK_R, 1]
    # Pass 1: the maximum is order-free; bad counts NaN and +inf entries.
    lane_max = tl.full((BLOCK_R, W), NEG_INF, tl.float32)               # [BLOCK_R, W]
    lane_bad = tl.full((BLOCK_R, W), 0, tl.int32)                       # [BLOCK_R, W]
    for start in range(0, n_cols, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = tl.load(x_ptr + row_start[:, None] + cols[None, :], mask=inside, other=NEG_INF) * scale
        lane_max = canonical.nan_max(lane_max, w)
        lane_bad += ((w != w) | (w == POS_INF)).to(tl.int32)
    bad = tree_sum(lane_bad) > 0                                        # [BLOCK_R]
    row_max = tree_max(lane_max) + 0.0
    shift = tl.where(row_max == NEG_INF, 0.0, row_max)[:, None]         # [BLOCK_R, 1]
    # Pass 2: min-p, p_i >= min_p * p_max <=> e_i >= min_p; a bad row keeps nothing.
    neg_zero = neg_zeros(())
    min_p = tl.load(min_p_ptr + rows, mask=rows_ok, other=0.0)[:, None]    # [BLOCK_R, 1]
    for start in range(0, n_cols, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = tl.load(x_ptr + row_start[:, None] + cols[None, :], mask=inside, other=NEG_INF) * scale
        e = canonical.exp(w - shift)
        keep = (w != NEG_INF) & ~bad[:, None]
        if USE_MIN_P:
            keep = keep & ((min_p <= 0.0) | (e >= min_p))
        tl.store(keys_ptr + tile + start, tl.where(keep, order_key(w), INT32_MIN))
        if USE_TOP_P:
            tl.store(mass_ptr + tile + start, tl.where(keep, e, neg_zero))
    # The passes below read what this program's threads just wrote.
    tl.debug_barrier()
    # Top-k: keep the keys >= the k-th largest, counting repeats (ties stay).
    # A row with fewer than k kept tokens gets INT32_MIN: it keeps them all.
    floor = tl.full((BLOCK_R,), INT32_MIN + 1, tl.int64)                # [BLOCK_R]
    if USE_TOP_K:
        top_k = tl.load(top_k_ptr + rows, mask=rows_ok, other=0)
        use_k = (top_k > 0) & (top_k < n_cols)
        t_k = kth_largest_key(keys_ptr, tile, n_padded, top_k, BLOCK_R, W)
        floor = tl.where(use_k, tl.maximum(t_k, floor), floor)
    # Top-p: the smallest key t with A(t) < thr = top_p * Z, Z the kept mass.
    # A(-2**31 - 1) = Z >= thr and A(2**31 - 1) = -0.0 < thr (thr > 0 when
    # anything is kept), so the search ends with hi at that key.  The keys
    # below floor after top-k are not kept: every sum counts only keys > max(t, floor - 1).
    if USE_TOP_P:
        top_p = tl.load(top_p_ptr + rows, mask=rows_ok, other=1.0)
        below = (floor - 1)[:, None]                                    # [BLOCK_R, 1]
        total = _mass_above(keys_ptr, mass_ptr, tile, n_cols, n_segments, below, BLOCK_R, W, GP)
        thr = top_p[:, None] * total                                    # [BLOCK_R, 1]
        lo = tl.full((BLOCK_R,), INT32_MIN - 1, tl.int64)               # [BLOCK_R]
        hi = tl.full((BLOCK_R,), -INT32_MIN - 1, tl.int64)              # [BLOCK_R]
        for _ in range(SEARCH_PASSES):
            probes = search_probes(lo, hi)                              # [BLOCK_R, P]
            mass = _mass_above(keys_ptr, mass_ptr, tile, n_cols, n_segments, tl.maximum(probes, below),
                               BLOCK_R, W, GP)
            lo, hi = search_narrow(lo, hi, probes, mass >= thr)
        floor = tl.where(top_p < 1.0, tl.maximum(floor, hi), floor)
    return rows, rows_ok, row_start, tile, scale, shift, bad, floor


@triton.jit
def filter_logits_kernel(x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, keys_ptr, mass_ptr,
                         n_rows, n_cols, n_padded, n_segments,
                         USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                         BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x, out: [n_rows, n_cols]; scale, top_k, top_p, min_p: [n_rows];
    # keys, mass: scratch [programs * BLOCK_R, n_padded].
    rows, rows_ok, row_start, tile, scale, shift, bad, floor = _filter_rows(
        x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, keys_ptr, mass_ptr, n_rows, n_cols, n_padded,
        n_segments, USE_MIN_P, USE_TOP_K, USE_TOP_P, BLOCK_R, W, GP)
    # out = select(kept, w, -inf), all NaN on a bad row.
    lanes = tl.arange(0, W)
    for start in range(0, n_cols, W):
        cols = start + lanes
        offs = row_start[:, None] + cols[None, :]                       # [BLOCK_R, W]
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        w = tl.load(x_ptr + offs, mask=inside, other=NEG_INF) * scale
        out = tl.where(tl.load(keys_ptr + tile + start) >= floor[:, None], w, NEG_INF)
        tl.store(out_ptr + offs, tl.where(bad[:, None], nans(()), out), mask=inside)


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
                  tokens_ptr, keys_ptr, mass_ptr, n_rows, n_cols, n_padded, n_segments,
                  USE_MIN_P: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                  BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr):
    # x: [n_rows, n_cols]; the parameters and tokens: [n_rows]; keys, mass: as filter_logits_kernel's.
    # token = lowest index of max_i score_i, score = x on greedy rows, else
    # (f - shift) - noise with f the filtered logits and shift the row maximum;
    # -1 on a bad row or when every score is -inf.
    rows, rows_ok, row_start, tile, scale, shift, bad, floor = _filter_rows(
        x_ptr, scale_ptr, top_k_ptr, top_p_ptr, min_p_ptr, keys_ptr, mass_ptr, n_rows, n_cols, n_padded,
        n_segments, USE_MIN_P, USE_TOP_K, USE_TOP_P, BLOCK_R, W, GP)
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
        x = tl.load(x_ptr + offs, mask=inside, other=NEG_INF)
        f = tl.where(tl.load(keys_ptr + tile + start) >= floor[:, None], x * scale, NEG_INF)
        score = tl.where(greedy, x, (f - shift) - race_noise(start, pos_lo, pos_hi, seed_lo, seed_hi, BLOCK_R, W))
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
    # Launches kernel(x, scale, top_k, top_p, min_p, *args, keys, mass, ...)
    # with scratch rows for the keys and, when a row uses top-p, the masses.
    n_rows, n_cols = x.shape
    width, n_segments, slots = row_layout(n_cols)
    rows = block_rows(n_rows, width)
    n_programs = triton.cdiv(n_rows, rows)
    scratch = (n_programs * rows, triton.cdiv(n_cols, width) * width)
    use_top_p = bool((top_p < 1.0).any())
    keys = torch.empty(scratch, dtype=torch.int32, device=x.device)
    mass = torch.empty(scratch, dtype=torch.float32, device=x.device) if use_top_p else keys
    launch(kernel, n_programs, x, scale, top_k, top_p, min_p, *args, keys, mass,
           n_rows, n_cols, scratch[1], n_segments,
           USE_MIN_P=bool((min_p > 0.0).any()), USE_TOP_K=bool(((top_k > 0) & (top_k < n_cols)).any()),
           USE_TOP_P=use_top_p, BLOCK_R=rows, W=width, GP=slots)


def filter_logits(x, scale, top_k, top_p, min_p):
    out = torch.empty_like(x)
    _filter_launch(filter_logits_kernel, x, scale, top_k, top_p, min_p, out)
    return out


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    tokens = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _filter_launch(sample_kernel, x, scale, top_k, top_p, min_p, greedy, seeds, positions, tokens)
    return tokens
