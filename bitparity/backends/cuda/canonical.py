"""The shared pieces of the canonical order as Triton device functions.

One helper per piece of bitparity/reference/canonical.py, with the same
operation order, so each op kernel reads as the reference does:

- ``tree_sum``: the halving tree acc[i] += acc[i + h], h = W/2, ..., 1 (spec 3);
- ``nan_max`` / ``tree_max``: the NaN-propagating maximum (spec 4);
- ``exp`` / ``log``: the portable exp and log (spec 5, 6);
- ``reciprocal``: Newton steps plus one Dekker-exact correction (spec 7);
- ``neg_zeros``: the padding -0.0, which a Triton literal cannot express;
- ``nans``: quiet NaNs, from their bits;
- ``put``: writes a segment partial into its slot of a small vector;
- ``program_rows``: the rows one program handles;
- ``masked_row_sum``: the canonical sum of the counted entries of each row
  (or of their squared deviations, or of their products with a second
  tensor) and their exact count (spec 3, 15, 26);
- ``dot_sums``: canonical dot products of a tile of vector pairs (spec 24);
- ``negate``, ``nan_min``, ``nan_clamp``: sign flip and NaN-propagating
  clamps of the RL operators (spec 16, 17);
- ``count_reciprocal``, ``rsqrt``, ``k3``, ``k3_derivative``: spec 15.1, 15.2, 16 and 26.9;
- ``sqrt32``, ``recip``: the square root and the general reciprocal of spec 29.10, 29.11;
- ``order_key``: spec 21's order as int32 keys; ``search_probes`` and
  ``search_narrow``: an 8-way search over keys for a monotone predicate;
  ``kth_largest_key``: the k-th largest key of each row, by that search with exact counts.

Only float32 add/sub/mul, compares, min/max, selects, exact int32->float32
conversions, bit casts and integer arithmetic (exact: counts, keys, Philox's
uint32 words) are used.  Never ``/``,
``tl.exp``/``tl.log``/``tl.sqrt`` (approximate on the GPU, numpy's in the
interpreter) or a ``tl.sum`` over more than two elements (its order is
the compiler's): the halving tree splits a tensor into halves and adds them.
Nor any other jit function of triton.language (``tl.sum``, ``tl.min``,
``tl.zeros``, ``tl.cdiv``, ...): those cannot run in the interpreter when
triton was imported before TRITON_INTERPRET was set, as a test session may.
Float->int conversions truncate in Triton, so exp rounds with the
1.5 * 2**23 magic constant and reads k from the bits (spec 5).
Kernels must be launched with ``enable_fp_fusion=False`` so that no a*b+c
here becomes one ``fma.rn.f32`` (tests/backends/test_cuda_ptx.py checks it).
"""

import triton
import triton.language as tl

from ... import spec

_f = spec.f32

SEGMENT: tl.constexpr = tl.constexpr(spec.SEGMENT)
NEG_ZERO_BITS: tl.constexpr = tl.constexpr(spec.NEG_ZERO_BITS - (1 << 32))   # 0x80000000 as an int32
NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
POS_INF: tl.constexpr = tl.constexpr(float("inf"))
# The quiet NaN numpy writes (np.float32(np.nan)), as bits: a NaN-valued
# global would differ from itself in triton.jit's check that two callees saw
# the same global values, so no kernel could call log twice.
NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
INT32_MIN: tl.constexpr = tl.constexpr(-(1 << 31))
SEARCH_PROBES: tl.constexpr = tl.constexpr(8)
SEARCH_PASSES: tl.constexpr = tl.constexpr(11)

EXP_HI: tl.constexpr = tl.constexpr(_f(spec.EXP_HI_BITS))
EXP_LO: tl.constexpr = tl.constexpr(_f(spec.EXP_LO_BITS))
EXP_CLAMP_HI: tl.constexpr = tl.constexpr(_f(spec.EXP_CLAMP_HI_BITS))
EXP_CLAMP_LO: tl.constexpr = tl.constexpr(_f(spec.EXP_CLAMP_LO_BITS))
LOG2E: tl.constexpr = tl.constexpr(_f(spec.LOG2E_BITS))
ROUND_MAGIC: tl.constexpr = tl.constexpr(_f(spec.ROUND_MAGIC_BITS))
ROUND_MAGIC_BITS: tl.constexpr = tl.constexpr(spec.ROUND_MAGIC_BITS)
LN2_HI: tl.constexpr = tl.constexpr(_f(spec.LN2_HI_BITS))
LN2_LO: tl.constexpr = tl.constexpr(_f(spec.LN2_LO_BITS))
EXP_P0: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[0]))
EXP_P1: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[1]))
EXP_P2: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[2]))
EXP_P3: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[3]))
EXP_P4: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[4]))
EXP_P5: tl.constexpr = tl.constexpr(_f(spec.EXP_POLY_BITS[5]))

LOG_SQRTHALF_BITS: tl.constexpr = tl.constexpr(spec.LOG_SQRTHALF_BITS)
LOG_SUBNORMAL_SCALE: tl.constexpr = tl.constexpr(_f(spec.LOG_SUBNORMAL_SCALE_BITS))
MIN_NORMAL: tl.constexpr = tl.constexpr(_f(spec.MIN_NORMAL_BITS))
LOG_P0: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[0]))
LOG_P1: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[1]))
LOG_P2: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[2]))
LOG_P3: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[3]))
LOG_P4: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[4]))
LOG_P5: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[5]))
LOG_P6: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[6]))
LOG_P7: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[7]))
LOG_P8: tl.constexpr = tl.constexpr(_f(spec.LOG_POLY_BITS[8]))
LOG_LN2_LO: tl.constexpr = tl.constexpr(_f(spec.LOG_LN2_LO_BITS))
LOG_LN2_HI: tl.constexpr = tl.constexpr(_f(spec.LOG_LN2_HI_BITS))
HALF: tl.constexpr = tl.constexpr(_f(spec.HALF_BITS))

RECIP_MAGIC: tl.constexpr = tl.constexpr(spec.RECIP_MAGIC)
RECIP_NEWTON_STEPS: tl.constexpr = tl.constexpr(spec.RECIP_NEWTON_STEPS)
SPLIT: tl.constexpr = tl.constexpr(_f(spec.SPLIT_BITS))
TWO: tl.constexpr = tl.constexpr(_f(spec.TWO_BITS))
ONE: tl.constexpr = tl.constexpr(_f(spec.ONE_BITS))

RSQRT_MAGIC: tl.constexpr = tl.constexpr(spec.RSQRT_MAGIC)
RSQRT_NEWTON_STEPS: tl.constexpr = tl.constexpr(spec.RSQRT_NEWTON_STEPS)
THREE_HALVES: tl.constexpr = tl.constexpr(_f(spec.THREE_HALVES_BITS))
K3_SERIES_LIMIT: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_LIMIT_BITS))
# RN32(1/(k+2)!) for k = 10 .. 0: K3_C0 = 1/12!, ..., K3_C10 = 1/2!.
K3_C0: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[0]))
K3_C1: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[1]))
K3_C2: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[2]))
K3_C3: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[3]))
K3_C4: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[4]))
K3_C5: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[5]))
K3_C6: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[6]))
K3_C7: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[7]))
K3_C8: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[8]))
K3_C9: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[9]))
K3_C10: tl.constexpr = tl.constexpr(_f(spec.K3_SERIES_BITS[10]))


@triton.constexpr_function
def log2(n):
    """log2 of a power of two, at compile time (the number of tree levels)."""
    return n.bit_length() - 1


# -- Reduction structure (spec 3, 4) ------------------------------------------

@triton.jit
def halves(x):
    # x: [R, W] -> (x[:, :W/2], x[:, W/2:]), each [R, W/2].
    # [R, W] -> [R, 2, W/2] puts x[:, i] and x[:, i + W/2] at [:, 0, i] and
    # [:, 1, i]; moving that axis last lets tl.split take the two halves.
    R: tl.constexpr = x.shape[0]
    H: tl.constexpr = x.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(x, (R, 2, H)), (0, 2, 1)))


@triton.jit
def tree_sum(x):
    # x: [R, W], W a power of two -> [R].
    # acc[i] = acc[i] + acc[i + h] for h = W/2, W/4, ..., 1: one float32 add
    # per pair and level, exactly canonical._halving_tree.
    for _ in tl.static_range(log2(x.shape[1])):
        lo, hi = halves(x)
        x = lo + hi
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def nan_max(a, b):
    # Elementwise maximum that returns NaN when either input is NaN: numpy's
    # np.maximum, and max.NaN.f32 on the GPU (the default tl.maximum drops NaN
    # on the GPU but keeps it in the interpreter).
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def tree_max(x):
    # x: [R, W], W a power of two -> [R]: the NaN-propagating maximum of each
    # row.  The maximum is order-free; the caller adds +0.0 so that a zero
    # maximum is +0.0 whichever zero came out (spec 4).
    for _ in tl.static_range(log2(x.shape[1])):
        lo, hi = halves(x)
        x = nan_max(lo, hi)
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def neg_zeros(shape: tl.constexpr):
    # A float32 tensor of -0.0, the additive identity (shape () for a scalar).
    # Built from its bits: Triton turns every scalar constant equal to 0,
    # -0.0 included, into +0.0 (semantic.scalar_constant), so tl.full(shape,
    # -0.0), tl.where(c, -0.0, x) and other=-0.0 all give +0.0.
    return tl.full(shape, NEG_ZERO_BITS, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def nans(shape: tl.constexpr):
    # A float32 tensor of quiet NaNs (shape () for a scalar), from their bits (see NAN_BITS).
    return tl.full(shape, NAN_BITS, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def put(slots_vec, slots, g, value):
    # slots_vec: [R, G], slots: [G] = arange(G), value: [R] -> slots_vec with
    # column g replaced by value: where a segment's partial is kept until the
    # partials are folded.
    return tl.where(slots[None, :] == g, value[:, None], slots_vec)


@triton.jit
def program_rows(n_rows, n_cols, BLOCK_R: tl.constexpr):
    # This program's rows: indices, in-range flags and element offsets, each [BLOCK_R].
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    return rows, rows < n_rows, rows.to(tl.int64) * n_cols


@triton.jit
def masked_row_sum(x_ptr, mask_ptr, row_start, rows_ok, n_cols, n_segments,
                   HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, W: tl.constexpr, GP: tl.constexpr,
                   center=None, factor_ptr=None):
    # row_start, rows_ok: [BLOCK_R] -> (sum, count), each [BLOCK_R]:
    # sum   = canonical sum (spec 3) of select(m, t, -0.0), the term t of each
    #         entry built from v = x, or v = x - center given center [BLOCK_R]:
    #         t = f * v given factor_ptr (f: a tensor laid out as x), else
    #         t = v * v given center, else t = v;
    # count = how many entries count, an exact int32 (lane counts folded
    #         by the same tree; integer sums are exact in any order).
    neg_zero = neg_zeros(())
    lanes = tl.arange(0, W)                                             # [W]
    slots = tl.arange(0, GP)                                            # [GP]
    # One partial per segment, -0.0 in the slots past the last segment.
    # The segments run in sequence here; a split-row version would give each
    # segment its own program and fold the [n_rows, GP] partials afterwards,
    # with the same bits.
    partials = neg_zeros((BLOCK_R, GP))                                 # [BLOCK_R, GP]
    lane_counts = tl.full((BLOCK_R, W), 0, tl.int32)                    # [BLOCK_R, W]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n_cols)
        # Lane j adds the terms of x[j], x[j + W], ... in order.  Starting
        # from -0.0 and skipping the all-padding chunks of the last segment
        # are both exact: v + (-0.0) == v for every v.
        acc = neg_zeros((BLOCK_R, W))                                   # [BLOCK_R, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes                                        # [W]
            offs = row_start[:, None] + cols[None, :]                   # [BLOCK_R, W]
            valid = rows_ok[:, None] & (cols < n_cols)[None, :]
            if HAS_MASK:
                valid = valid & tl.load(mask_ptr + offs, mask=valid, other=False)
            terms = tl.load(x_ptr + offs, mask=valid, other=0.0)
            if center is not None:
                terms = terms - center[:, None]
            if factor_ptr is not None:
                terms = tl.load(factor_ptr + offs, mask=valid, other=0.0) * terms
            elif center is not None:
                terms = terms * terms
            acc = acc + tl.where(valid, terms, neg_zero)
            lane_counts += valid.to(tl.int32)
        partials = put(partials, slots, g, tree_sum(acc))
    return tree_sum(partials), tree_sum(lane_counts)


@triton.jit
def dot_sums(a_ptr, a_start, a_ok, b_ptr, b_start, b_ok, n, n_segments, lanes, slots):
    # a_start, a_ok: [P, 1]; b_start, b_ok: [P or 1, Q] -> [P, Q]: for every
    # pair, the canonical sum (spec 3) of the n products a[k] * b[k], each
    # rounded once (dot of spec 24), a and b the n-element vectors starting at
    # the given offsets.  lanes = arange(W), slots = arange(GP), with W lanes
    # and GP segment slots of row_layout(n) (tensors, not constexprs, so that
    # they keep their sizes in a tuple: attention.py's score arguments).
    # Pairs that are not ok read nothing (their vectors are skipped, not zero:
    # the caller selects over their results).
    P: tl.constexpr = a_start.shape[0]
    Q: tl.constexpr = b_start.shape[1]
    W: tl.constexpr = lanes.shape[0]
    GP: tl.constexpr = slots.shape[0]
    neg_zero = neg_zeros(())
    a_at = a_ptr + a_start[:, :, None]                                  # [P, 1, 1]
    b_at = b_ptr + b_start[:, :, None]                                  # [P or 1, Q, 1]
    partials = neg_zeros((P * Q, GP))                                   # [P * Q, GP]
    for g in range(n_segments):
        seg_start = g * SEGMENT
        seg_end = tl.minimum(seg_start + SEGMENT, n)
        # Lane j adds the products of elements j, j + W, ... in order, from
        # -0.0; positions past n are -0.0, never a product of padding (0 * 0
        # is +0.0, which would turn an all -0.0 sum into +0.0).
        acc = neg_zeros((P, Q, W))                                      # [P, Q, W]
        for start in range(seg_start, seg_end, W):
            cols = start + lanes[None, None, :]                         # [1, 1, W]
            inside = cols < n
            a = tl.load(a_at + cols, mask=a_ok[:, :, None] & inside, other=0.0)    # [P, 1, W]
            b = tl.load(b_at + cols, mask=b_ok[:, :, None] & inside, other=0.0)    # [P or 1, Q, W]
            acc = acc + tl.where(inside, a * b, neg_zero)
        partials = put(partials, slots, g, tree_sum(tl.reshape(acc, (P * Q, W))))
    return tl.reshape(tree_sum(partials), (P, Q))


# -- exp (spec 5) ---------------------------------------------------------------

@triton.jit
def exp(x):
    # x: any shape, float32.  Same operations, same order as canonical.exp.
    # A NaN x may clamp to anything here: the last select returns x itself.
    xc = tl.minimum(tl.maximum(x, EXP_CLAMP_LO), EXP_CLAMP_HI)
    # round(x / ln2) lands in t's low mantissa bits: k without a float->int
    # conversion (those truncate in Triton); kf = k exactly.
    t = xc * LOG2E + ROUND_MAGIC
    k = t.to(tl.int32, bitcast=True) - ROUND_MAGIC_BITS
    kf = t - ROUND_MAGIC
    # Cody-Waite: kf * LN2_HI is exact (15-bit hi), so r = x - k ln2 loses nothing.
    r = (xc - kf * LN2_HI) - kf * LN2_LO
    # Cephes polynomial by Horner, highest degree first.
    p = EXP_P0 * r + EXP_P1
    p = p * r + EXP_P2
    p = p * r + EXP_P3
    p = p * r + EXP_P4
    p = p * r + EXP_P5
    y = (p * (r * r) + r) + 1.0
    # Scale by 2**k as 2**(k>>1) * 2**(k - (k>>1)): both factors are normal,
    # so a subnormal result is rounded once, by the second multiply.
    k1 = k >> 1
    k2 = k - k1
    scale1 = ((k1 + 127) << 23).to(tl.float32, bitcast=True)
    scale2 = ((k2 + 127) << 23).to(tl.float32, bitcast=True)
    y = (y * scale1) * scale2
    y = tl.where(x > EXP_HI, POS_INF, y)
    y = tl.where(x <= EXP_LO, 0.0, y)
    return tl.where(x != x, x, y)


# -- log (spec 6) -----------------------------------------------------------------

@triton.jit
def log(x):
    # x: any shape, float32.  Same operations, same order as canonical.log.
    # Subnormals are scaled by 2**23 first and 23 is taken off the exponent.
    subnormal = x < MIN_NORMAL
    xs = tl.where(subnormal, x * LOG_SUBNORMAL_SCALE, x)
    # Integer reduction: m in [sqrt(1/2), sqrt(2)), xs = m * 2**e.
    ix = xs.to(tl.int32, bitcast=True)
    e = (ix - LOG_SQRTHALF_BITS) >> 23
    m = (ix - (e << 23)).to(tl.float32, bitcast=True)
    f = m - 1.0
    ef = (e - tl.where(subnormal, 23, 0)).to(tl.float32)
    z = f * f
    y = LOG_P0 * f + LOG_P1
    y = y * f + LOG_P2
    y = y * f + LOG_P3
    y = y * f + LOG_P4
    y = y * f + LOG_P5
    y = y * f + LOG_P6
    y = y * f + LOG_P7
    y = y * f + LOG_P8
    y = (y * f) * z
    y = y + ef * LOG_LN2_LO
    y = y - HALF * z
    out = (f + y) + ef * LOG_LN2_HI
    out = tl.where(x == POS_INF, POS_INF, out)
    out = tl.where(x == 0.0, NEG_INF, out)
    out = tl.where(x < 0.0, nans(()), out)
    return tl.where(x != x, x, out)


# -- reciprocal (spec 7) -------------------------------------------------------

@triton.jit
def _split(a):
    # Veltkamp split: a = hi + lo exactly, each half with at most 12 significant bits.
    c = SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


@triton.jit
def reciprocal(s):
    # 1/s for s in [1, 2**31] (a softmax denominator), as canonical.reciprocal.
    # Two statements: in the interpreter `constexpr - tensor` is a constexpr
    # wrapping the tensor, which has no .to() until an assignment unwraps it.
    r_bits = RECIP_MAGIC - s.to(tl.int32, bitcast=True)
    r = r_bits.to(tl.float32, bitcast=True)
    for _ in tl.static_range(RECIP_NEWTON_STEPS):
        r = r * (TWO - s * r)
    p = s * r
    sh, sl = _split(s)
    rh, rl = _split(r)
    err = (((sh * rh - p) + sh * rl) + sl * rh) + sl * rl    # s*r - p, exactly
    e = (ONE - p) - err
    return r + r * e


# -- RL operators (spec 14-17) -------------------------------------------------

@triton.jit
def negate(x):
    # -x by flipping the sign bit, as numpy's negative.  Triton's unary minus
    # is 0 - x, which gives +0.0 for x = +0.0 where -x is -0.0.
    return (x.to(tl.int32, bitcast=True) ^ NEG_ZERO_BITS).to(tl.float32, bitcast=True)


@triton.jit
def nan_min(a, b):
    # Elementwise minimum that returns NaN when either input is NaN (np.minimum, min.NaN.f32).
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_clamp(v, low, high):
    # min(max(v, low), high), NaN-propagating, as canonical._nan_clamp.  The
    # bounds are positive normal float32 values or their negations (ops.py
    # checks), so no comparison is a tie between +0.0 and -0.0, where
    # numpy and the GPU's max.NaN/min.NaN would pick different zeros.
    return nan_min(nan_max(v, low), high)


@triton.jit
def count_reciprocal(n):
    # 1/n for a float32 count n >= 1 (spec 7's domain), 0 for n = 0, so an
    # empty mean is 0 (canonical._count_reciprocal).
    return tl.where(n == 0.0, 0.0, reciprocal(nan_max(n, 1.0)))


@triton.jit
def rsqrt(y):
    # 1/sqrt(y) for y > 0 (a variance plus eps), as canonical.rsqrt: the
    # bit-trick guess, then Newton steps r = r * (1.5 - (h * r) * r), h = y/2.
    # Two statements for the guess: see reciprocal.
    r_bits = RSQRT_MAGIC - (y.to(tl.int32, bitcast=True) >> 1)
    r = r_bits.to(tl.float32, bitcast=True)
    h = HALF * y
    for _ in tl.static_range(RSQRT_NEWTON_STEPS):
        r = r * (THREE_HALVES - (h * r) * r)
    return tl.where(y == POS_INF, 0.0, r)


@triton.jit
def sqrt32(y):
    # sqrt(y) for y >= 0, as canonical.sqrt32 (spec 29.10): s = y * rsqrt(y), then one
    # correction by the Dekker-exact residual y - s*s; +0.0 below the smallest normal
    # (y = 1 stands in for it), +inf at +inf (where s is inf * 0), NaN propagates.
    small = y < MIN_NORMAL
    safe = tl.where(small, 1.0, y)
    r = rsqrt(safe)
    s = safe * r
    p = s * s
    sh, sl = _split(s)
    err = ((sh * sh - p) + (sh * sl + sh * sl)) + sl * sl              # s*s - p, exactly
    s = s + ((safe - p) - err) * (HALF * r)
    return tl.where(small, 0.0, tl.where(y == POS_INF, POS_INF, s))


@triton.jit
def recip(d):
    # 1/d for d in [2**-126, +inf] or NaN, as canonical.recip (spec 29.11): d = m * 2**e
    # with m in [1, 2); reciprocal(m) (spec 7) times 2**-e, built from its bits; for
    # e = 127, 2**-127 is subnormal, so (reciprocal(m) * 0.5) * 2**-126.  +inf gives +0.0
    # (its e = 128 would scale by -inf); NaN propagates.
    bits = d.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    mantissa = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    r = reciprocal(mantissa)
    low = e == 127
    scale = ((127 - tl.where(low, 126, e)) << 23).to(tl.float32, bitcast=True)
    out = tl.where(low, (r * HALF) * scale, r * scale)
    return tl.where(d == POS_INF, 0.0, tl.where(d != d, d, out))


@triton.jit
def _k3_phi(d):
    # phi(d) = sum_k d^k / (k + 2)!, k = 0 .. 10, by Horner from the highest
    # degree: e^d - 1 - d = d*d * phi(d) with nothing cancelling (spec 16).
    phi = K3_C0 * d + K3_C1
    phi = phi * d + K3_C2
    phi = phi * d + K3_C3
    phi = phi * d + K3_C4
    phi = phi * d + K3_C5
    phi = phi * d + K3_C6
    phi = phi * d + K3_C7
    phi = phi * d + K3_C8
    phi = phi * d + K3_C9
    return phi * d + K3_C10


@triton.jit
def k3(d):
    # e^d - 1 - d without cancellation, as canonical._k3: for |d| < 1,
    # d*d * phi(d); otherwise (exp(d) - 1) - d.
    series = (d * d) * _k3_phi(d)
    direct = (exp(d) - 1.0) - d
    out = tl.where(tl.abs(d) < K3_SERIES_LIMIT, series, direct)
    # d = +inf: direct is inf - inf; the estimator is +inf.
    return tl.where(d == POS_INF, POS_INF, out)


@triton.jit
def k3_derivative(d):
    # d/dd of k3: e^d - 1 without cancellation, as canonical._k3_derivative
    # (spec 26.9): for |d| < 1, d + d*d * phi(d) (k3's own series); otherwise
    # exp(d) - 1, which is +inf at d = +inf and -1 at d = -inf.
    series = d + (d * d) * _k3_phi(d)
    direct = exp(d) - 1.0
    return tl.where(tl.abs(d) < K3_SERIES_LIMIT, series, direct)


# -- Order and selection (spec 21) ----------------------------------------------

@triton.jit
def order_key(x):
    # x: any shape, float32 -> int32 keys in spec 21's order: numerically,
    # -0.0 == +0.0, -inf below every finite value, every NaN below -inf.
    # Adding +0.0 turns -0.0 into +0.0.  A non-negative float keeps its bits;
    # a negative one flips its 31 magnitude bits (b ^ 0x7FFFFFFF = -1 - |x|'s
    # bits), so it lies below every non-negative key and falls as |x| grows.
    b = (x + 0.0).to(tl.int32, bitcast=True)
    key = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return tl.where(x != x, INT32_MIN, key)


@triton.jit
def search_probes(lo, hi):
    # lo, hi: [BLOCK_R] int64 -> [BLOCK_R, SEARCH_PROBES] int64 keys
    # lo + floor((hi - lo) * j / SEARCH_PROBES), j = 1 .. SEARCH_PROBES, ascending
    # (the last is hi).  Each search pass evaluates its predicate at all of them
    # in one sweep over the row: the interval shrinks 8-fold per pass, so
    # SEARCH_PASSES = 11 passes take a 2**32 interval down to hi = lo + 1
    # (2**32 / 8**10 = 4, and the probes of an interval of <= 8 are all its keys).
    j = tl.arange(1, SEARCH_PROBES + 1).to(tl.int64)                    # [P]
    return lo[:, None] + (((hi - lo)[:, None] * j[None, :]) >> log2(SEARCH_PROBES))


@triton.jit
def search_narrow(lo, hi, probes, low_side):
    # lo, hi: [BLOCK_R]; probes, low_side: [BLOCK_R, P], low_side true on a
    # prefix of the probes (the predicate holds at lo and fails at hi) ->
    # (lo, hi): the last probe where it holds (or lo), the first where it fails (or hi).
    # The first is a maximum; the second a minimum, taken as -max(-v) (int64, no overflow).
    new_lo = tree_max(tl.where(low_side, probes, lo[:, None]))
    new_hi = tree_max(tl.where(low_side, -hi[:, None], -probes))
    return new_lo, -new_hi


@triton.jit
def kth_largest_key(keys_ptr, tile, n_padded, k, BLOCK_R: tl.constexpr, W: tl.constexpr):
    # keys: rows of n_padded int32 order keys (a multiple of W), INT32_MIN in
    # the padding; tile: [BLOCK_R, W] offsets of the rows' first W keys;
    # k: [BLOCK_R] -> [BLOCK_R] int64: the largest t with #{i : key_i >= t} >= k,
    # the key of the k-th largest value counting repeats (1 <= k <= the row's length).
    # Search over all 2**32 int32 keys: every key is >= lo = -2**31, none is
    # >= hi = 2**31, and every probe is above INT32_MIN, so the padding is
    # never counted.  The counts are exact integers: the order the lanes and
    # the tree add them in cannot matter.
    lo = tl.full((BLOCK_R,), INT32_MIN, tl.int64)                       # [BLOCK_R]
    hi = tl.full((BLOCK_R,), 1 << 31, tl.int64)                         # [BLOCK_R]
    for _ in range(SEARCH_PASSES):
        probes = search_probes(lo, hi)                                  # [BLOCK_R, P]
        bounds = probes[:, :, None]                                     # [BLOCK_R, P, 1]
        counts = tl.full((BLOCK_R, SEARCH_PROBES, W), 0, tl.int32)      # [BLOCK_R, P, W]
        for start in range(0, n_padded, W):
            keys = tl.load(keys_ptr + tile + start).to(tl.int64)[:, None, :]    # [BLOCK_R, 1, W]
            counts += (keys >= bounds).to(tl.int32)
        totals = tl.reshape(tree_sum(tl.reshape(counts, (BLOCK_R * SEARCH_PROBES, W))), (BLOCK_R, SEARCH_PROBES))
        lo, hi = search_narrow(lo, hi, probes, totals >= k[:, None])
    return lo
