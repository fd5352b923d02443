/* The canonical float32 order (docs/spec.md) in C99, for the `cpu` backend:
 * the pieces its ops share.
 *
 * Every function of the backend computes the same bits as
 * bitparity/reference/canonical.py.  Each contract op is one exported function
 * over row-major float32 arrays, in one file per op named as the cuda and
 * ascend backends name theirs: reduce.c, softmax.c, elementwise.c, masked.c,
 * kl.c, gae.c, ppo.c, sampling.c, topk.c, linear.c, rms_norm.c, rotary.c,
 * attention.c, silu_mul.c, and for training (spec 29) fold_rows.c and optim.c.
 * The canonical pieces are written once, here: lane
 * accumulation + halving tree (spec 3), segment partials, the NaN-propagating
 * maximum (spec 4), exp (spec 5), log (spec 6), the reciprocal (spec 7), and
 * for the RL operators rsqrt (spec 15.2) and the masked mean (spec 15.1),
 * which whitening and the PPO loss reuse; and for the backward (spec 26), the
 * +0.0 of entries that do not count (counted), the clamp-edge test (outside)
 * and element passes over (row, segment) items (run_row_segments).  Each
 * backward sits in its forward's file and reuses the forward's pieces (the
 * softmax statistics, entropy_parts, count_reciprocal, the KL series, the
 * PPO token terms), so its statistics are the forward's bits.  What several
 * ops share beyond them
 * is written once too: in softmax_stats.h (spec 8.2's row statistics:
 * softmax.c, attention.c), selection.h (spec 21's order keys, k-th largest
 * key and selection scratch: topk.c, sampling.c), dot_panels.h (spec 24's
 * sums of products: linear.c, attention.c) and row_fold.h (spec 29.1's row
 * fold: fold_rows.c, linear.c's weight_grad).  The headers' functions are
 * static, most of them inline, so each op's file is compiled seeing every
 * piece it calls, as when all were one file.
 *
 * Why the bits cannot depend on the build:
 *  - Built with -ffp-contract=off -fno-fast-math: every a*b+c rounds twice and
 *    gcc may not reassociate, so the source order below IS the evaluation order.
 *    x86-64 evaluates float in SSE registers (FLT_EVAL_METHOD == 0): no excess
 *    precision.
 *  - Loops are written element-wise (lane j of a chunk only ever meets lane j),
 *    so auto-vectorisation at any width performs the same IEEE operations on
 *    the same operands as the scalar loop.  Selects are C conditionals; gcc
 *    keeps their exact meaning when it vectorises them (a blend, or a max/min
 *    instruction only where its NaN and signed-zero rules are the
 *    conditional's).  -fno-trapping-math is what lets it if-convert them
 *    (evaluate both arms, then blend); it changes no value, only whether a
 *    speculated operation may raise an exception flag, which nothing reads.
 *  - Rows are independent, so splitting rows over threads cannot change a bit.
 *    The RL reductions split (row, segment) pairs instead: each segment's
 *    partial is computed alone and then folded by the canonical partial tree,
 *    so that split cannot change a bit either.  GAE's recurrence runs in
 *    order within a sequence; sequences are split over threads.
 *
 * Bit reinterpretation goes through memcpy: copying an object representation
 * is defined behaviour in C99 (6.5p7 forbids reading a float through a
 * uint32_t lvalue; memcpy copies bytes instead), and gcc compiles a 4-byte
 * memcpy to a register move, so it vectorises like a cast.
 * Integer arithmetic that may wrap is done in uint32_t (defined modulo 2^32);
 * left shifts are of uint32_t.  Two gcc-defined behaviours are used, as gcc
 * documents them ("Integers implementation", gcc manual): converting a uint32_t
 * above INT32_MAX to int32_t wraps modulo 2^32, and >> of a negative int32_t
 * shifts in sign bits.  numpy's int32 ops behave the same way.
 *
 * Constants come from bitparity/spec.py as -D macros (see __init__.py), so
 * there is no copy of them here to drift; the build cache key hashes them.
 */

#ifndef BP_CPU_CANONICAL_H
#define BP_CPU_CANONICAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
ALWAYS_INLINE float float_of(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

#define NEG_ZERO float_of(BP_NEG_ZERO_BITS)
#define POS_INF float_of(0x7F800000u)
#define NEG_INF float_of(0xFF800000u)
#define NAN_F32 float_of(0x7FC00000u)

static inline int64_t next_pow2(int64_t n)
{
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* -- exp (spec 5) ---------------------------------------------------------- */

/* Cody-Waite reduction x = k ln2 + r, Cephes polynomial, scaling by 2^k as two
 * multiplies by 2^(k>>1) and 2^(k-(k>>1)), specials by select. */
ALWAYS_INLINE float canonical_exp(float x)
{
    const float magic = float_of(BP_ROUND_MAGIC_BITS);
    float xc = x > float_of(BP_EXP_CLAMP_LO_BITS) ? x : float_of(BP_EXP_CLAMP_LO_BITS);
    xc = xc < float_of(BP_EXP_CLAMP_HI_BITS) ? xc : float_of(BP_EXP_CLAMP_HI_BITS);
    float t = xc * float_of(BP_LOG2E_BITS) + magic;          /* round(x / ln2) in t's low bits */
    int32_t k = (int32_t)(bits_of(t) - BP_ROUND_MAGIC_BITS); /* |k| <= 150 for non-NaN x */
    float kf = t - magic;                                    /* k as a float32, exact */
    float r = (xc - kf * float_of(BP_LN2_HI_BITS)) - kf * float_of(BP_LN2_LO_BITS);
    float p = float_of(BP_EXP_P0);
    p = p * r + float_of(BP_EXP_P1);
    p = p * r + float_of(BP_EXP_P2);
    p = p * r + float_of(BP_EXP_P3);
    p = p * r + float_of(BP_EXP_P4);
    p = p * r + float_of(BP_EXP_P5);
    float y = (p * (r * r) + r) + 1.0f;
    int32_t k1 = k >> 1;                                     /* floor(k / 2) */
    int32_t k2 = k - k1;
    y = (y * float_of((uint32_t)(k1 + 127) << 23)) * float_of((uint32_t)(k2 + 127) << 23);
    y = x > float_of(BP_EXP_HI_BITS) ? POS_INF : y;
    y = x <= float_of(BP_EXP_LO_BITS) ? 0.0f : y;
    return x != x ? x : y;
}

/* -- log (spec 6) ---------------------------------------------------------- */

/* Subnormals scaled by 2^23, mantissa reduced to [sqrt(1/2), sqrt(2)) with int
 * ops, Cephes polynomial, specials by select. */
ALWAYS_INLINE float canonical_log(float x)
{
    int subnormal = x < float_of(BP_MIN_NORMAL_BITS);       /* also zero and negatives: selected away */
    float xs = subnormal ? x * float_of(BP_LOG_SUBNORMAL_SCALE_BITS) : x;
    uint32_t ix = bits_of(xs);
    int32_t e = (int32_t)(ix - BP_LOG_SQRTHALF_BITS) >> 23;
    float m = float_of(ix - ((uint32_t)e << 23));
    float f = m - 1.0f;                                      /* exact (Sterbenz) */
    float ef = (float)(e - (subnormal ? 23 : 0));            /* exact: |e| < 2^24 */
    float z = f * f;
    float y = float_of(BP_LOG_P0);
    y = y * f + float_of(BP_LOG_P1);
    y = y * f + float_of(BP_LOG_P2);
    y = y * f + float_of(BP_LOG_P3);
    y = y * f + float_of(BP_LOG_P4);
    y = y * f + float_of(BP_LOG_P5);
    y = y * f + float_of(BP_LOG_P6);
    y = y * f + float_of(BP_LOG_P7);
    y = y * f + float_of(BP_LOG_P8);
    y = (y * f) * z;
    y = y + ef * float_of(BP_LOG_LN2_LO_BITS);
    y = y - float_of(BP_HALF_BITS) * z;
    float out = (f + y) + ef * float_of(BP_LOG_LN2_HI_BITS);
    out = x == POS_INF ? POS_INF : out;
    out = x == 0.0f ? NEG_INF : out;
    out = x < 0.0f ? NAN_F32 : out;
    return x != x ? x : out;
}

/* -- reciprocal (spec 7) --------------------------------------------------- */

ALWAYS_INLINE void veltkamp_split(float a, float *hi, float *lo)
{
    float c = float_of(BP_SPLIT_BITS) * a;
    *hi = c - (c - a);
    *lo = a - *hi;
}

/* 1/s for a softmax denominator: magic initial guess, Newton steps, then one
 * correction whose residual 1 - s*r is computed exactly (Dekker product). */
static inline float canonical_reciprocal(float s)
{
    const float two = float_of(BP_TWO_BITS);
    float r = float_of(BP_RECIP_MAGIC - bits_of(s));
    for (int i = 0; i < BP_RECIP_NEWTON_STEPS; i++)
        r = r * (two - s * r);
    float p = s * r;
    float sh, sl, rh, rl;
    veltkamp_split(s, &sh, &sl);
    veltkamp_split(r, &rh, &rl);
    float err = (((sh * rh - p) + sh * rl) + sl * rh) + sl * rl;   /* s*r - p, exactly */
    float e = (float_of(BP_ONE_BITS) - p) - err;
    return r + r * e;
}

/* -- rsqrt (spec 15.2) ------------------------------------------------------ */

/* 1/sqrt(y) for y > 0 (a variance plus eps): bit-trick guess, then Newton steps
 * r = r * (1.5 - (h * r) * r) with h = 0.5 * y; +inf gives 0, NaN propagates. */
ALWAYS_INLINE float canonical_rsqrt(float y)
{
    float r = float_of(BP_RSQRT_MAGIC - (uint32_t)((int32_t)bits_of(y) >> 1));
    float h = float_of(BP_HALF_BITS) * y;
    for (int i = 0; i < BP_RSQRT_NEWTON_STEPS; i++)
        r = r * (float_of(BP_THREE_HALVES_BITS) - (h * r) * r);
    return y == POS_INF ? 0.0f : r;
}

/* -- Reduction structure (spec 3) ------------------------------------------ */

/* Lane width of a row: LANES, or the next power of two >= n for short rows.
 * Same bits either way (padding is an exact identity); the narrow width only
 * saves work. */
static inline int64_t lane_width(int64_t n)
{
    return n < BP_LANES ? next_pow2(n) : BP_LANES;
}

/* acc[0:w][0:cols] -> acc[0][0:cols]: acc[i] += acc[i + h] for h = w/2, w/4, ..., 1 (w a power of
 * two), where each of the w lanes is a block of cols floats, one per independent sum.  Block i and
 * block i + h are contiguous halves, so each level is one flat element-wise add. */
ALWAYS_INLINE void halving_tree_cols(float *acc, int64_t w, int64_t cols)
{
    for (int64_t h = w / 2; h >= 1; h /= 2)
        for (int64_t i = 0; i < h * cols; i++)
            acc[i] = acc[i] + acc[i + h * cols];
}

/* acc[0:w] -> acc[0]: the halving tree of one sum. */
static inline float halving_tree(float *acc, int64_t w)
{
    halving_tree_cols(acc, w, 1);
    return acc[0];
}

/* The terms a canonical sum may run over; a constant argument of the always-
 * inlined functions below, so each use compiles to its own branch-free loop. */
enum term {
    TERM_MASKED_X,      /* sum op, masked means: mask ? x : -0.0 */
    TERM_ENTROPY,       /* entropy: e == 0 ? -0.0 : q * a (entropy_parts) */
    TERM_SQ_DEV,        /* whitening: mask ? (x - mean) * (x - mean) : -0.0 */
    TERM_SQUARE,        /* rms_norm: x * x */
    TERM_MASKED_YX,     /* softmax backward's G: mask ? y * x : -0.0 (y = g, x = p) */
    TERM_MASKED_Y_DEV,  /* whitening backward's gd: mask ? y * (x - mean) : -0.0 (y = g) */
};

struct term_args {
    float scale, shift, recip, log_total, mean;
};

/* w = x * scale, masked entries -inf (spec 8.1). */
ALWAYS_INLINE float scaled(const float *x, const uint8_t *mask, int64_t i, float scale)
{
    float w = x[i] * scale;
    return mask && !mask[i] ? NEG_INF : w;
}

/* Spec 8.4's pieces of one entry of a softmax row, which entropy's term (TERM_ENTROPY) and entropy's
 * backward (spec 26.5) both use, so they are written once: d = w - shift, e = exp(d), q = e * recip
 * (the probability), a = log_total - d (-log of it, without cancellation). */
struct entropy_parts {
    float e, q, a;
};

ALWAYS_INLINE struct entropy_parts entropy_parts(float w, float shift, float recip, float log_total)
{
    struct entropy_parts p;
    float d = w - shift;
    p.e = canonical_exp(d);
    p.q = p.e * recip;
    p.a = log_total - d;
    return p;
}

/* Term i of a sum over x (and y, the second array of the two-array kinds; NULL for the others). */
ALWAYS_INLINE float term_value(enum term kind, const float *x, const float *y, const uint8_t *mask, int64_t i,
                               const struct term_args *a)
{
    if (kind == TERM_MASKED_X)
        return mask && !mask[i] ? NEG_ZERO : x[i];
    if (kind == TERM_SQUARE)
        return x[i] * x[i];
    if (kind == TERM_SQ_DEV) {
        float d = x[i] - a->mean;
        return mask && !mask[i] ? NEG_ZERO : d * d;
    }
    if (kind == TERM_MASKED_YX)
        return mask && !mask[i] ? NEG_ZERO : y[i] * x[i];
    if (kind == TERM_MASKED_Y_DEV)
        return mask && !mask[i] ? NEG_ZERO : y[i] * (x[i] - a->mean);
    struct entropy_parts p = entropy_parts(scaled(x, mask, i, a->scale), a->shift, a->recip, a->log_total);
    return p.e == 0.0f ? NEG_ZERO : p.q * p.a;
}

/* Sum of terms [0:len] (one segment, len <= SEGMENT) in the canonical order:
 * lane j accumulates terms j, j+W, j+2W, ... in sequence, starting from -0.0
 * (the exact identity, so this equals starting from term j), then the halving
 * tree over W lanes.  Lanes past the data keep -0.0, the padding (spec 3.2).
 * lanes: scratch of W floats. */
ALWAYS_INLINE float segment_sum(enum term kind, const float *x, const float *y, const uint8_t *mask,
                                int64_t len, int64_t w, const struct term_args *a, float *lanes)
{
    for (int64_t j = 0; j < w; j++)
        lanes[j] = NEG_ZERO;
    for (int64_t c = 0; c < len; c += w) {
        int64_t m = len - c < w ? len - c : w;
        const float *xc = x + c;
        const float *yc = y ? y + c : NULL;
        const uint8_t *mc = mask ? mask + c : NULL;
        for (int64_t j = 0; j < m; j++)
            lanes[j] = lanes[j] + term_value(kind, xc, yc, mc, j, a);
    }
    return halving_tree(lanes, w);
}

/* Partials [0:g][0:cols] -> partials[0][0:cols], cols sums at once: the halving tree padded to a
 * power of two with -0.0.  partials: scratch of next_pow2(g) * cols floats. */
ALWAYS_INLINE void combine_partials_cols(float *partials, int64_t g, int64_t cols)
{
    int64_t gp = next_pow2(g);
    for (int64_t i = g * cols; i < gp * cols; i++)
        partials[i] = NEG_ZERO;
    halving_tree_cols(partials, gp, cols);
}

/* Partials [0:g] -> their sum (one row). */
static inline float combine_partials(float *partials, int64_t g)
{
    combine_partials_cols(partials, g, 1);
    return partials[0];
}

/* Canonical sum of one row of n terms: segment partials, then combine_partials.  y: the second
 * array of the two-array kinds, or NULL. */
ALWAYS_INLINE float row_sum(enum term kind, const float *x, const float *y, const uint8_t *mask, int64_t n,
                            const struct term_args *a, float *lanes, float *partials)
{
    int64_t w = lane_width(n);
    int64_t g = 0;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        partials[g] = segment_sum(kind, x + s, y ? y + s : NULL, mask ? mask + s : NULL, len, w, a, lanes);
    }
    return combine_partials(partials, g);
}

/* -- Maximum (spec 4) ------------------------------------------------------ */

/* NaN-propagating max: takes v if it is larger or NaN, and keeps a NaN once held. */
ALWAYS_INLINE float max_nan(float m, float v)
{
    return (v > m || v != v) ? v : m;
}

/* Max of w over one segment, + 0.0 so a zero maximum is +0.0.  The order of a
 * NaN-propagating max only decides which zero or which NaN wins, and the +0.0
 * and NaN canonicalisation make that invisible.  lanes: scratch of W floats. */
ALWAYS_INLINE float segment_max(const float *x, const uint8_t *mask, int64_t len, int64_t w,
                                float scale, float *lanes)
{
    for (int64_t j = 0; j < w; j++)
        lanes[j] = NEG_INF;
    for (int64_t c = 0; c < len; c += w) {
        int64_t m = len - c < w ? len - c : w;
        const float *xc = x + c;
        const uint8_t *mc = mask ? mask + c : NULL;
        for (int64_t j = 0; j < m; j++)
            lanes[j] = max_nan(lanes[j], scaled(xc, mc, j, scale));
    }
    for (int64_t h = w / 2; h >= 1; h /= 2)
        for (int64_t i = 0; i < h; i++)
            lanes[i] = max_nan(lanes[i], lanes[i + h]);
    return lanes[0] + 0.0f;
}

/* -- NaN-propagating clamps (spec 14-17) ------------------------------ */

/* numpy's np.maximum(a, b) and np.minimum(a, b), which reference/canonical.py
 * uses for clamps: NaN from either operand propagates, and on a tie of +0.0
 * with -0.0 the result is b.  (C's fmaxf/fminf return the non-NaN operand.) */
ALWAYS_INLINE float max_prop(float a, float b) { return (a > b || a != a) ? a : b; }
ALWAYS_INLINE float min_prop(float a, float b) { return (a < b || a != a) ? a : b; }

/* min(max(v, low), high), NaN-propagating.  A clamp that is not set is passed
 * as low = -inf, high = +inf, which leaves every v unchanged (NaN and -inf
 * included), so the loops need no flag. */
ALWAYS_INLINE float clamp_prop(float v, float low, float high) { return min_prop(max_prop(v, low), high); }

ALWAYS_INLINE float abs_f32(float v) { return float_of(bits_of(v) & 0x7FFFFFFFu); }

/* v < -bound or v > bound: where a clamp to [-bound, bound] holds v constant, so its gradient is 0
 * (spec 26.9, 26.10).  A value on a bound is inside (torch's clamp passes its gradient there); NaN
 * compares false and passes; an unset clamp (+inf) holds nothing. */
ALWAYS_INLINE int outside(float v, float bound) { return v < -bound || v > bound; }

/* -- Backward (spec 26) ------------------------------------------------------ */

/* select(mask_i, v, +0.0): entries that do not count get +0.0 (spec 26.1); mask NULL: all count. */
ALWAYS_INLINE float counted(const uint8_t *mask, int64_t i, float v)
{
    return mask && !mask[i] ? 0.0f : v;
}

/* -- Masked sums and means (spec 15.1) ------------------------------------ */

/* Number of counted entries of mask[0:len] (all len without a mask): an exact integer. */
ALWAYS_INLINE int64_t count_true(const uint8_t *mask, int64_t len)
{
    if (!mask)
        return len;
    int64_t c = 0;
    for (int64_t i = 0; i < len; i++)
        c += mask[i];
    return c;
}

/* R = 0 for an empty row, else reciprocal(n), n the exact count rounded once to float32: the masked
 * mean's factor (spec 15.1), and the weight of each entry in its backward (spec 26.7, 26.10). */
static inline float count_reciprocal(int64_t count)
{
    return count == 0 ? 0.0f : canonical_reciprocal((float)count);
}

/* sum * R + 0.0 (spec 15.1: an empty mean is +0.0). */
static inline float mean_of(float sum, int64_t count)
{
    return sum * count_reciprocal(count) + 0.0f;
}

/* Canonical sums of the terms of each row of x [rows, n] (kind TERM_MASKED_X,
 * TERM_SQ_DEV or TERM_MASKED_Y_DEV; y [rows, n] the second array of the last,
 * else NULL), and (counts != NULL) each row's exact count of counted entries;
 * x == NULL: the counts only.  The work items are (row, segment) pairs, not
 * rows: each segment's partial is computed alone and a row's partials are then
 * folded by combine_partials, which is row_sum's order, so a dim=None
 * reduction (one row [1, B*T]) spreads over every thread with the same bits.
 * args: one per row (the mean of the _DEV kinds), or NULL.
 * Returns 0, or -1 if scratch could not be allocated. */
struct segment_sums {
    enum term kind;
    const float *x, *y;
    const uint8_t *mask;
    int64_t n, g, gp, w;
    const struct term_args *args;
    float *partials;
    int64_t *seg_counts;
};

/* masked_row_sums' (row, segment) items [begin, end): each segment's count and partial. */
static inline void segment_sums_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct segment_sums *c = ctx;
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t n = c->n, g = c->g, w = c->w;
    for (int64_t item = begin; item < end; item++) {
        float lanes[BP_LANES];
        int64_t r = item / g, seg = item % g, s = seg * BP_SEGMENT;
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        const uint8_t *ms = c->mask ? c->mask + r * n + s : NULL;
        c->seg_counts[item] = count_true(ms, len);
        if (c->x == NULL)
            continue;
        const float *xs = c->x + r * n + s;
        const float *ys = c->y ? c->y + r * n + s : NULL;
        const struct term_args *a = c->args ? &c->args[r] : &none;
        /* one inlined loop per term kind, each compiled for its constant kind */
        c->partials[r * c->gp + seg] =
            c->kind == TERM_SQ_DEV ? segment_sum(TERM_SQ_DEV, xs, NULL, ms, len, w, a, lanes)
            : c->kind == TERM_MASKED_Y_DEV ? segment_sum(TERM_MASKED_Y_DEV, xs, ys, ms, len, w, a, lanes)
            : segment_sum(TERM_MASKED_X, xs, NULL, ms, len, w, a, lanes);
    }
}

static inline int masked_row_sums(enum term kind, const float *x, const float *y, const uint8_t *mask,
                                  int64_t rows, int64_t n, const struct term_args *args, float *sums,
                                  int64_t *counts, int nthreads)
{
    int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
    int64_t gp = next_pow2(g);
    float *partials = malloc(sizeof(float) * (size_t)(rows * gp));
    int64_t *seg_counts = malloc(sizeof(int64_t) * (size_t)(rows * g));
    if (partials == NULL || seg_counts == NULL) {
        free(partials);
        free(seg_counts);
        return -1;
    }
    const struct segment_sums ctx = {kind, x, y, mask, n, g, gp, lane_width(n), args, partials, seg_counts};
    bp_parallel_for(segment_sums_span, &ctx, rows * g, nthreads);
    for (int64_t r = 0; r < rows; r++) {
        if (x != NULL)
            sums[r] = combine_partials(partials + r * gp, g);
        if (counts) {
            counts[r] = 0;
            for (int64_t seg = 0; seg < g; seg++)
                counts[r] += seg_counts[r * g + seg];
        }
    }
    free(partials);
    free(seg_counts);
    return 0;
}

/* Masked mean of each row of x [rows, n] (spec 15.1) into means[rows]; the
 * exact counts go to counts[rows].  mask NULL: every entry counts. */
static inline int masked_mean_rows(const float *x, const uint8_t *mask, int64_t rows, int64_t n,
                                   float *means, int64_t *counts, int nthreads)
{
    if (masked_row_sums(TERM_MASKED_X, x, NULL, mask, rows, n, NULL, means, counts, nthreads) != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        means[r] = mean_of(means[r], counts[r]);
    return 0;
}

/* A pass over the entries of rows [rows, n]: fn(ctx, r, start, end) for each row r and each segment
 * [start, end) of it, as (row, segment) work items like masked_row_sums, so one long row (dim=None)
 * spreads over every thread.  Each entry is written by exactly one item from the same operands, so no
 * bit depends on the split. */
typedef void span_fn(const void *ctx, int64_t r, int64_t start, int64_t end);

struct row_segments {
    span_fn *fn;
    const void *ctx;
    int64_t n, g;
};

/* run_row_segments' items [begin, end). */
static inline void row_segments_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct row_segments *c = ctx;
    for (int64_t item = begin; item < end; item++) {
        int64_t r = item / c->g, s = (item % c->g) * BP_SEGMENT;
        c->fn(c->ctx, r, s, c->n - s < BP_SEGMENT ? c->n : s + BP_SEGMENT);
    }
}

static inline void run_row_segments(span_fn *fn, const void *ctx, int64_t rows, int64_t n, int nthreads)
{
    const struct row_segments c = {fn, ctx, n, (n + BP_SEGMENT - 1) / BP_SEGMENT};
    bp_parallel_for(row_segments_span, &c, rows * c.g, nthreads);
}

/* -- Row ops (docs/backend-contract.md) ------------------------------------ */

/* Per-thread scratch: lanes[2 LANES]; seg_max, seg_count, seg_rest [G'], G' = next_pow2(segments). */
struct scratch {
    float *lanes, *seg_max, *seg_count, *seg_rest;
};

/* The arguments of a row op: x: f32[rows, n]; mask: u8[rows, n] or NULL;
 * tokens: i64[rows] or NULL; out: f32[rows, n] or f32[rows]; op: which op of
 * the row function's family (softmax.c's enum op); for a backward, g: the
 * upstream gradient (f32[rows, n] or f32[rows]) and h: entropy's output
 * f32[rows] (else NULL). */
struct row_args {
    const float *x;
    const uint8_t *mask;
    const int64_t *tokens;
    int64_t n;
    float scale;
    int op;
    float *out;
    const float *g, *h;
};

/* Row r of a row op, with its thread's scratch. */
typedef void row_fn(const struct row_args *a, int64_t r, const struct scratch *sc);

struct rows_job {
    row_fn *row;
    const struct row_args *a;
};

/* A member of run_rows' job: its own scratch, then the rows it claims. */
static inline int rows_member(const void *ctx, struct bp_job *job)
{
    const struct rows_job *c = ctx;
    int64_t gp = next_pow2((c->a->n + BP_SEGMENT - 1) / BP_SEGMENT);
    struct scratch sc;
    sc.lanes = malloc(sizeof(float) * (size_t)(2 * BP_LANES + 3 * gp));
    if (sc.lanes == NULL)
        return -1;
    sc.seg_max = sc.lanes + 2 * BP_LANES;
    sc.seg_count = sc.seg_max + gp;
    sc.seg_rest = sc.seg_count + gp;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t r = begin; r < end; r++)
            c->row(c->a, r, &sc);
    free(sc.lanes);
    return 0;
}

/* Runs row over rows on bp_parallel's threads: a thread computes whole rows
 * with its own scratch, so no bit depends on which thread or how many.
 * Returns 0, or -1 if scratch could not be allocated. */
static inline int run_rows(row_fn *row, const struct row_args *a, int64_t rows, int nthreads)
{
    const struct rows_job c = {row, a};
    return bp_parallel(rows_member, &c, rows, nthreads);
}

#endif /* BP_CPU_CANONICAL_H */
