/* The canonical float32 order (docs/spec.md) in C99, for the `cpu` backend.
 *
 * Every function here computes the same bits as bitparity/reference/canonical.py.
 * The canonical pieces are written once: lane accumulation + halving tree
 * (spec 3), segment partials, the NaN-propagating maximum (spec 4), exp
 * (spec 5), log (spec 6), the reciprocal (spec 7), and for the RL operators
 * rsqrt (spec 15.2), k3 (spec 16) and the masked mean (spec 15.1), which
 * whitening and the PPO loss reuse.  Each contract op is one exported function
 * over row-major float32 arrays.
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

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
ALWAYS_INLINE float float_of(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

#define NEG_ZERO float_of(BP_NEG_ZERO_BITS)
#define POS_INF float_of(0x7F800000u)
#define NEG_INF float_of(0xFF800000u)
#define NAN_F32 float_of(0x7FC00000u)

static int64_t next_pow2(int64_t n)
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
static float canonical_reciprocal(float s)
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
static int64_t lane_width(int64_t n)
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
static float halving_tree(float *acc, int64_t w)
{
    halving_tree_cols(acc, w, 1);
    return acc[0];
}

/* The terms a canonical sum may run over; a constant argument of the always-
 * inlined functions below, so each use compiles to its own branch-free loop. */
enum term {
    TERM_MASKED_X,      /* sum op, masked means: mask ? x : -0.0 */
    TERM_ENTROPY,       /* entropy: e == 0 ? -0.0 : (e * recip) * (log_total - d), d = w - shift, e = exp(d) */
    TERM_SQ_DEV,        /* whitening: mask ? (x - mean) * (x - mean) : -0.0 */
    TERM_SQUARE,        /* rms_norm: x * x */
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

ALWAYS_INLINE float term_value(enum term kind, const float *x, const uint8_t *mask, int64_t i,
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
    float d = scaled(x, mask, i, a->scale) - a->shift;
    float e = canonical_exp(d);
    float t = (e * a->recip) * (a->log_total - d);
    return e == 0.0f ? NEG_ZERO : t;
}

/* Sum of terms [0:len] (one segment, len <= SEGMENT) in the canonical order:
 * lane j accumulates terms j, j+W, j+2W, ... in sequence, starting from -0.0
 * (the exact identity, so this equals starting from term j), then the halving
 * tree over W lanes.  Lanes past the data keep -0.0, the padding (spec 3.2).
 * lanes: scratch of W floats. */
ALWAYS_INLINE float segment_sum(enum term kind, const float *x, const uint8_t *mask, int64_t len,
                                int64_t w, const struct term_args *a, float *lanes)
{
    for (int64_t j = 0; j < w; j++)
        lanes[j] = NEG_ZERO;
    for (int64_t c = 0; c < len; c += w) {
        int64_t m = len - c < w ? len - c : w;
        const float *xc = x + c;
        const uint8_t *mc = mask ? mask + c : NULL;
        for (int64_t j = 0; j < m; j++)
            lanes[j] = lanes[j] + term_value(kind, xc, mc, j, a);
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
static float combine_partials(float *partials, int64_t g)
{
    combine_partials_cols(partials, g, 1);
    return partials[0];
}

/* Canonical sum of one row of n terms: segment partials, then combine_partials. */
ALWAYS_INLINE float row_sum(enum term kind, const float *x, const uint8_t *mask, int64_t n,
                            const struct term_args *a, float *lanes, float *partials)
{
    int64_t w = lane_width(n);
    int64_t g = 0;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        partials[g] = segment_sum(kind, x + s, mask ? mask + s : NULL, len, w, a, lanes);
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

/* -- Softmax statistics (spec 8.2) ----------------------------------------- */

/* One segment's exponentials e = exp(w - shift), split: *count = canonical sum
 * of (e == 1 ? 1 : -0.0), *rest = canonical sum of (e == 1 ? -0.0 : e), in one
 * pass with two sets of lanes.
 *
 * Padding: reference/canonical.py pads w with -inf, so its padded terms are
 * -0.0 in the count and exp(-inf) = +0.0 in the rest; here both start at -0.0.
 * The sign of a zero term can only change the sign of a zero sum (x + y for
 * nonzero x + y does not see zero signs), and a zero rest or count enters
 * total and err below only through two_sum with the other, where both signs
 * give the same total up to the sign of a zero total and err = +0.0; log and
 * the selects treat -0.0 and +0.0 alike.  So the bits of every result agree.
 * lanes_count, lanes_rest: scratch of W floats each. */
ALWAYS_INLINE void segment_exp_sums(const float *x, const uint8_t *mask, int64_t len, int64_t w,
                                    float scale, float shift, float *lanes_count, float *lanes_rest,
                                    float *count, float *rest)
{
    for (int64_t j = 0; j < w; j++) {
        lanes_count[j] = NEG_ZERO;
        lanes_rest[j] = NEG_ZERO;
    }
    for (int64_t c = 0; c < len; c += w) {
        int64_t m = len - c < w ? len - c : w;
        const float *xc = x + c;
        const uint8_t *mc = mask ? mask + c : NULL;
        for (int64_t j = 0; j < m; j++) {
            float e = canonical_exp(scaled(xc, mc, j, scale) - shift);
            int one = e == 1.0f;
            lanes_count[j] = lanes_count[j] + (one ? 1.0f : NEG_ZERO);
            lanes_rest[j] = lanes_rest[j] + (one ? NEG_ZERO : e);
        }
    }
    *count = halving_tree(lanes_count, w);
    *rest = halving_tree(lanes_rest, w);
}

/* (s, err): s = RN(a + b) and its exact rounding error (Knuth's TwoSum). */
ALWAYS_INLINE float two_sum(float a, float b, float *err)
{
    float s = a + b;
    float bb = s - a;
    *err = (a - (s - bb)) + (b - bb);
    return s;
}

struct stats {
    float shift, total, log_total, recip;
};

/* Per-thread scratch: lanes[2 LANES]; seg_max, seg_count, seg_rest [G'], G' = next_pow2(segments). */
struct scratch {
    float *lanes, *seg_max, *seg_count, *seg_rest;
};

/* Per segment g: m_g = max, shift_g = m_g (0 if -inf), count_g and rest_g of
 * exp(w - shift_g).  Row: shift = max_g m_g (0 if -inf), c_g = exp(m_g - shift);
 * a segment with c_g == 1 keeps its count and rest apart, any other folds
 * c_g * (count_g + rest_g) into the rest; count and rest are combined by the
 * partial tree, total = two_sum(count, rest), log_total = log(total) + err * recip.
 * Each segment is read twice back to back, so the second read hits cache. */
ALWAYS_INLINE struct stats softmax_stats(const float *x, const uint8_t *mask, int64_t n, float scale,
                                         const struct scratch *sc)
{
    int64_t w = lane_width(n);
    int64_t g = 0;
    float row_max = NEG_INF;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        const uint8_t *ms = mask ? mask + s : NULL;
        float m = segment_max(x + s, ms, len, w, scale, sc->lanes);
        segment_exp_sums(x + s, ms, len, w, scale, m == NEG_INF ? 0.0f : m, sc->lanes,
                         sc->lanes + BP_LANES, &sc->seg_count[g], &sc->seg_rest[g]);
        sc->seg_max[g] = m;
        row_max = max_nan(row_max, m);
    }
    struct stats st;
    row_max = row_max + 0.0f;
    st.shift = row_max == NEG_INF ? 0.0f : row_max;
    for (int64_t i = 0; i < g; i++) {
        float c = canonical_exp(sc->seg_max[i] - st.shift);
        int top = c == 1.0f;
        float folded = c * (sc->seg_count[i] + sc->seg_rest[i]);
        sc->seg_count[i] = top ? sc->seg_count[i] : NEG_ZERO;
        sc->seg_rest[i] = top ? sc->seg_rest[i] : folded;
    }
    float count = combine_partials(sc->seg_count, g);
    float rest = combine_partials(sc->seg_rest, g);
    float err;
    st.total = two_sum(count, rest, &err);
    float recip = canonical_reciprocal(st.total);
    st.recip = st.total == 0.0f ? 0.0f : recip;       /* 0 for an empty row */
    st.log_total = canonical_log(st.total) + err * st.recip;
    return st;
}

/* -- Ops (docs/backend-contract.md) ---------------------------------------- */

enum op { OP_SUM, OP_LOGSUMEXP, OP_LOG_SOFTMAX, OP_SOFTMAX, OP_ENTROPY, OP_TOKEN_LOGPROBS };

/* One row of op.  xr, mr: the row's n values and mask (NULL: none); orow: its
 * n outputs (log_softmax, softmax); *oval: its one output (the reductions). */
ALWAYS_INLINE void row_op(enum op op, const float *xr, const uint8_t *mr, int64_t n, float scale,
                          int64_t token, float *orow, float *oval, const struct scratch *sc)
{
    if (op == OP_SUM) {
        const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        *oval = row_sum(TERM_MASKED_X, xr, mr, n, &none, sc->lanes, sc->seg_rest);
        return;
    }
    struct stats st = softmax_stats(xr, mr, n, scale, sc);
    switch (op) {
    case OP_LOGSUMEXP:
        *oval = st.shift + st.log_total;
        break;
    case OP_LOG_SOFTMAX:
        /* (w - shift) - log_total, or -inf for every entry where the total is 0 */
        if (st.total == 0.0f) {
            for (int64_t i = 0; i < n; i++)
                orow[i] = NEG_INF;
        } else {
            for (int64_t i = 0; i < n; i++)
                orow[i] = (scaled(xr, mr, i, scale) - st.shift) - st.log_total;
        }
        break;
    case OP_SOFTMAX:
        for (int64_t i = 0; i < n; i++)
            orow[i] = canonical_exp(scaled(xr, mr, i, scale) - st.shift) * st.recip;
        break;
    case OP_ENTROPY: {
        /* canonical sum of p_i * (log S - (w_i - shift)), zero-probability terms -0.0, then + 0.0 */
        const struct term_args a = {scale, st.shift, st.recip, st.log_total, 0.0f};
        *oval = row_sum(TERM_ENTROPY, xr, mr, n, &a, sc->lanes, sc->seg_rest) + 0.0f;
        break;
    }
    case OP_TOKEN_LOGPROBS: {
        /* log_softmax's entry at the token, without writing the row */
        float lp = (xr[token] * scale - st.shift) - st.log_total;
        *oval = st.total == 0.0f ? NEG_INF : lp;
        break;
    }
    case OP_SUM:
        break;
    }
}

/* Runs op over rows under `omp parallel for schedule(static)`: a thread owns
 * whole rows and its own scratch, so no bit depends on the thread count.
 * x: f32[rows, n]; mask: u8[rows, n] or NULL; tokens: i64[rows] or NULL;
 * out: f32[rows, n] or f32[rows].  Returns 0, or -1 if scratch could not be allocated. */
static int run_rows(enum op op, const float *x, const uint8_t *mask, const int64_t *tokens,
                    int64_t rows, int64_t n, float scale, float *out, int nthreads)
{
    int64_t gp = next_pow2((n + BP_SEGMENT - 1) / BP_SEGMENT);
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        struct scratch sc;
        sc.lanes = malloc(sizeof(float) * (size_t)(2 * BP_LANES + 3 * gp));
        sc.seg_max = sc.lanes + 2 * BP_LANES;
        sc.seg_count = sc.seg_max + gp;
        sc.seg_rest = sc.seg_count + gp;
        failed = sc.lanes == NULL;
        /* every thread reaches the loop: a worksharing loop needs all of them */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (failed)
                continue;
            const float *xr = x + r * n;
            int64_t token = tokens ? tokens[r] : 0;
            float *orow = op == OP_LOG_SOFTMAX || op == OP_SOFTMAX ? out + r * n : NULL;
            /* two inlined copies, so each inner loop is compiled knowing whether a mask exists */
            if (mask)
                row_op(op, xr, mask + r * n, n, scale, token, orow, out + r, &sc);
            else
                row_op(op, xr, NULL, n, scale, token, orow, out + r, &sc);
        }
        free(sc.lanes);
    }
    return failed ? -1 : 0;
}

int bp_sum(const float *x, const uint8_t *mask, int64_t rows, int64_t n,
                  float *out, int nthreads)
{
    return run_rows(OP_SUM, x, mask, NULL, rows, n, 0.0f, out, nthreads);
}

int bp_logsumexp(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                        float *out, int nthreads)
{
    return run_rows(OP_LOGSUMEXP, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_log_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                          float *out, int nthreads)
{
    return run_rows(OP_LOG_SOFTMAX, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                      float *out, int nthreads)
{
    return run_rows(OP_SOFTMAX, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_entropy(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                      float *out, int nthreads)
{
    return run_rows(OP_ENTROPY, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_token_logprobs(const float *x, const int64_t *tokens, int64_t rows, int64_t n,
                             float scale, float *out, int nthreads)
{
    return run_rows(OP_TOKEN_LOGPROBS, x, NULL, tokens, rows, n, scale, out, nthreads);
}

/* Element-wise exp and log of x[0:n]: independent elements, split over threads. */
void bp_exp(const float *x, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++)
        out[i] = canonical_exp(x[i]);
}

void bp_log(const float *x, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++)
        out[i] = canonical_log(x[i]);
}

/* -- RL operators (spec 14-17) ---------------------------------------------- */

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

/* sum * R + 0.0 with R = 0 for an empty row, else reciprocal(n), n the count
 * rounded once to float32 (spec 15.1: an empty mean is +0.0). */
static float mean_of(float sum, int64_t count)
{
    float r = count == 0 ? 0.0f : canonical_reciprocal((float)count);
    return sum * r + 0.0f;
}

/* Canonical sums of the terms of each row of x [rows, n], and (counts != NULL)
 * each row's exact count of counted entries.  The work items are (row,
 * segment) pairs, not rows: each segment's partial is computed alone and a
 * row's partials are then folded by combine_partials, which is row_sum's
 * order, so a dim=None reduction (one row [1, B*T]) spreads over every thread
 * with the same bits.  args: one per row (TERM_SQ_DEV's mean), or NULL.
 * Returns 0, or -1 if scratch could not be allocated. */
static int masked_row_sums(enum term kind, const float *x, const uint8_t *mask, int64_t rows, int64_t n,
                           const struct term_args *args, float *sums, int64_t *counts, int nthreads)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
    int64_t gp = next_pow2(g);
    int64_t w = lane_width(n);
    float *partials = malloc(sizeof(float) * (size_t)(rows * gp));
    int64_t *seg_counts = malloc(sizeof(int64_t) * (size_t)(rows * g));
    if (partials == NULL || seg_counts == NULL) {
        free(partials);
        free(seg_counts);
        return -1;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t item = 0; item < rows * g; item++) {
        float lanes[BP_LANES];
        int64_t r = item / g, seg = item % g, s = seg * BP_SEGMENT;
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        const float *xs = x + r * n + s;
        const uint8_t *ms = mask ? mask + r * n + s : NULL;
        const struct term_args *a = args ? &args[r] : &none;
        /* one inlined loop per term kind, each compiled for its constant kind */
        partials[r * gp + seg] = kind == TERM_SQ_DEV ? segment_sum(TERM_SQ_DEV, xs, ms, len, w, a, lanes)
                                                     : segment_sum(TERM_MASKED_X, xs, ms, len, w, a, lanes);
        seg_counts[item] = count_true(ms, len);
    }
    for (int64_t r = 0; r < rows; r++) {
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
static int masked_mean_rows(const float *x, const uint8_t *mask, int64_t rows, int64_t n,
                            float *means, int64_t *counts, int nthreads)
{
    if (masked_row_sums(TERM_MASKED_X, x, mask, rows, n, NULL, means, counts, nthreads) != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        means[r] = mean_of(means[r], counts[r]);
    return 0;
}

int bp_masked_mean(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float *out, int nthreads)
{
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    int status = counts ? masked_mean_rows(x, mask, rows, n, out, counts, nthreads) : -1;
    free(counts);
    return status;
}

/* Whitening of each row of x [rows, n] (spec 15.3):
 *   mean = masked mean; ss = canonical sum of (mask ? (x - mean)^2 : -0.0)
 *   var = ss * reciprocal(max(n - 1, 1))   (max(n, 1) when biased)
 *   out = (x - mean) * rsqrt(var + eps), + mean when !shift_mean; 0 where not counted.
 * The output pass runs over (row, segment) items like the sums. */
int bp_masked_whiten(const float *x, const uint8_t *mask, int64_t rows, int64_t n, int shift_mean,
                     int unbiased, float eps, float *out, int nthreads)
{
    float *mean = malloc(sizeof(float) * (size_t)rows);
    float *inv = malloc(sizeof(float) * (size_t)rows);      /* each row's sum of squares, then rsqrt(var + eps) */
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    struct term_args *args = malloc(sizeof(struct term_args) * (size_t)rows);
    int status = mean && inv && counts && args ? 0 : -1;
    if (status == 0)
        status = masked_mean_rows(x, mask, rows, n, mean, counts, nthreads);
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++)
            args[r] = (struct term_args){0.0f, 0.0f, 0.0f, 0.0f, mean[r]};
        status = masked_row_sums(TERM_SQ_DEV, x, mask, rows, n, args, inv, NULL, nthreads);
    }
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++) {
            int64_t divisor = unbiased ? counts[r] - 1 : counts[r];
            float var = inv[r] * canonical_reciprocal((float)(divisor > 1 ? divisor : 1));
            inv[r] = canonical_rsqrt(var + eps);
        }
        int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t item = 0; item < rows * g; item++) {
            int64_t r = item / g, s = (item % g) * BP_SEGMENT;
            int64_t end = n - s < BP_SEGMENT ? n : s + BP_SEGMENT;
            const float *xr = x + r * n;
            const uint8_t *mr = mask + r * n;
            float *orow = out + r * n;
            float m = mean[r], k = inv[r];
            for (int64_t i = s; i < end; i++) {
                float o = (xr[i] - m) * k;
                o = shift_mean ? o : o + m;
                orow[i] = mr[i] ? o : 0.0f;
            }
        }
    }
    free(mean);
    free(inv);
    free(counts);
    free(args);
    return status;
}

/* e^d - 1 - d without cancellation (spec 16): d^2 * phi(d) by phi's Taylor
 * series (Horner from the highest degree) for |d| < 1, else (exp(d) - 1) - d. */
ALWAYS_INLINE float canonical_k3(float d)
{
    float phi = float_of(BP_K3_P0);
    phi = phi * d + float_of(BP_K3_P1);
    phi = phi * d + float_of(BP_K3_P2);
    phi = phi * d + float_of(BP_K3_P3);
    phi = phi * d + float_of(BP_K3_P4);
    phi = phi * d + float_of(BP_K3_P5);
    phi = phi * d + float_of(BP_K3_P6);
    phi = phi * d + float_of(BP_K3_P7);
    phi = phi * d + float_of(BP_K3_P8);
    phi = phi * d + float_of(BP_K3_P9);
    phi = phi * d + float_of(BP_K3_P10);
    float series = (d * d) * phi;
    float direct = (canonical_exp(d) - 1.0f) - d;
    float out = abs_f32(d) < float_of(BP_K3_SERIES_LIMIT_BITS) ? series : direct;
    return d == POS_INF ? POS_INF : out;
}

enum kl_kind { KL_K1, KL_K2, KL_K3, KL_ABS };

/* One estimator of d = clamp(ref - logp, ±log_ratio_clamp), clamped to ±clamp (spec 16). */
ALWAYS_INLINE float kl_term(enum kl_kind kind, float logp, float ref, float clamp, float log_ratio_clamp)
{
    float d = clamp_prop(ref - logp, -log_ratio_clamp, log_ratio_clamp);
    float k;
    switch (kind) {
    case KL_K1: k = -d; break;
    case KL_K2: k = (d * d) * float_of(BP_HALF_BITS); break;
    case KL_K3: k = canonical_k3(d); break;
    default: k = abs_f32(d); break;
    }
    return clamp_prop(k, -clamp, clamp);
}

ALWAYS_INLINE void kl_block(enum kl_kind kind, const float *logp, const float *ref, int64_t len, float clamp,
                            float log_ratio_clamp, float *out)
{
    for (int64_t i = 0; i < len; i++)
        out[i] = kl_term(kind, logp[i], ref[i], clamp, log_ratio_clamp);
}

/* Elements per work item of bp_kl_penalty: the kind is dispatched once per block. */
#define KL_BLOCK 4096

/* Element-wise KL estimator of logp, ref [n] into out [n]; kind is an enum
 * kl_kind; an unset clamp is +inf (see clamp_prop).  Each block runs the loop
 * compiled for its constant kind, so the loop is branch-free. */
void bp_kl_penalty(const float *logp, const float *ref, int64_t n, int kind, float clamp,
                   float log_ratio_clamp, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t s = 0; s < n; s += KL_BLOCK) {
        int64_t len = n - s < KL_BLOCK ? n - s : KL_BLOCK;
        switch (kind) {
        case KL_K1: kl_block(KL_K1, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        case KL_K2: kl_block(KL_K2, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        case KL_K3: kl_block(KL_K3, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        default: kl_block(KL_ABS, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        }
    }
}

/* One sequence's GAE (spec 14), t = T-1 down to 0, from next_v = bootstrap, last = +0.0.
 * carry (verl): delta = (r + g * next_v) - v; cand = delta + gl * last;
 *               next_v = m ? v : next_v; last = m ? cand : last; adv = last; ret = last + v.
 * zero (TRL):   r, v = m ? r, v : 0; delta as above; last = delta + gl * last; next_v = v;
 *               adv = m ? last : 0; ret = m ? last + v : 0. */
ALWAYS_INLINE void gae_row(int zero_mode, const float *r, const float *v, const uint8_t *m, int64_t t_len,
                           float bootstrap, float g, float gl, float *adv, float *ret)
{
    float next_v = bootstrap, last = 0.0f;
    for (int64_t t = t_len - 1; t >= 0; t--) {
        if (zero_mode) {
            float rt = m[t] ? r[t] : 0.0f, vt = m[t] ? v[t] : 0.0f;
            float delta = (rt + g * next_v) - vt;
            last = delta + gl * last;
            next_v = vt;
            adv[t] = m[t] ? last : 0.0f;
            ret[t] = m[t] ? last + vt : 0.0f;
        } else {
            float delta = (r[t] + g * next_v) - v[t];
            float cand = delta + gl * last;
            next_v = m[t] ? v[t] : next_v;
            last = m[t] ? cand : last;
            adv[t] = last;
            ret[t] = last + v[t];
        }
    }
}

/* GAE of rewards, values, mask [B, T], bootstrap [B] into adv, ret [B, T]:
 * sequences are independent, so they are split over threads; each runs its
 * recurrence alone and in order. */
void bp_gae(const float *rewards, const float *values, const uint8_t *mask, const float *bootstrap,
            int64_t b, int64_t t_len, float g, float gl, int zero_mode, float *adv, float *ret, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < b; i++) {
        int64_t o = i * t_len;
        if (zero_mode)
            gae_row(1, rewards + o, values + o, mask + o, t_len, bootstrap[i], g, gl, adv + o, ret + o);
        else
            gae_row(0, rewards + o, values + o, mask + o, t_len, bootstrap[i], g, gl, adv + o, ret + o);
    }
}

/* verl's clipped surrogate of one token (spec 17.1); *clipped = 1.0 where
 * loss2 > loss1, else 0.0.  Unset dual_clip and ratio_clamp are +inf, for
 * which min_prop(na * c, loss) and the clamp leave their operand unchanged. */
ALWAYS_INLINE float ppo_token_loss(float logp, float old_logp, float adv, float ratio_low, float ratio_high,
                                   float dual_clip, float ratio_clamp, float *clipped)
{
    float d = clamp_prop(logp - old_logp, -ratio_clamp, ratio_clamp);
    float ratio = canonical_exp(d);
    float na = -adv;
    float loss1 = na * ratio;
    float loss2 = na * clamp_prop(ratio, ratio_low, ratio_high);
    *clipped = loss2 > loss1 ? 1.0f : 0.0f;
    float loss = max_prop(loss1, loss2);
    return adv < 0.0f ? min_prop(na * dual_clip, loss) : loss;
}

enum ppo_agg { AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_MEAN };

/* The token losses [B, T] aggregated by agg (spec 17.2) into *total:
 *   token-mean:          masked mean of the losses as one row [1, B*T];
 *   seq-mean-token-sum:  s_b = canonical sum of the counted losses of row b, then the mean of s [1, B];
 *   seq-mean-token-mean: m_b = masked mean of row b, then the mean of m [1, B].
 * per_seq: scratch of B floats; counts: of B int64. */
static int ppo_aggregate(enum ppo_agg agg, const float *loss, const uint8_t *mask, int64_t b, int64_t t_len,
                         float *per_seq, int64_t *counts, float *total, int nthreads)
{
    if (agg == AGG_TOKEN_MEAN)
        return masked_mean_rows(loss, mask, 1, b * t_len, total, counts, nthreads);
    int status = agg == AGG_SEQ_MEAN_TOKEN_SUM
        ? masked_row_sums(TERM_MASKED_X, loss, mask, b, t_len, NULL, per_seq, NULL, nthreads)
        : masked_mean_rows(loss, mask, b, t_len, per_seq, counts, nthreads);
    return status != 0 ? status : masked_mean_rows(per_seq, NULL, 1, b, total, counts, nthreads);
}

/* PPO policy loss of logp, old_logp, advantages, mask [B, T] into result[0]
 * (the loss aggregated by agg, an enum ppo_agg) and result[1] (the clip
 * fraction: the masked mean over all B*T tokens of clipped, as one row).
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_ppo_policy_loss(const float *logp, const float *old_logp, const float *advantages, const uint8_t *mask,
                       int64_t b, int64_t t_len, float ratio_low, float ratio_high, float dual_clip,
                       float ratio_clamp, int agg, float *result, int nthreads)
{
    int64_t n = b * t_len;
    float *loss = malloc(sizeof(float) * (size_t)(2 * n));    /* loss [n], then clipped [n] */
    float *per_seq = malloc(sizeof(float) * (size_t)b);
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)b);
    int status = -1;
    if (loss && per_seq && counts) {
        float *clipped = loss + n;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t i = 0; i < n; i++)
            loss[i] = ppo_token_loss(logp[i], old_logp[i], advantages[i], ratio_low, ratio_high, dual_clip,
                                     ratio_clamp, &clipped[i]);
        status = ppo_aggregate(agg, loss, mask, b, t_len, per_seq, counts, &result[0], nthreads);
        if (status == 0)
            status = masked_mean_rows(clipped, mask, 1, n, &result[1], counts, nthreads);
    }
    free(loss);
    free(per_seq);
    free(counts);
    return status;
}

/* -- Counter-based random numbers (spec 19, 20) ------------------------------ */

/* Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1), in
 * place.  Each round: (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2),
 * hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)), then the key is bumped by (W0, W1); the
 * 32 x 32-bit products are exact in uint64_t, the key sums wrap modulo 2^32. */
ALWAYS_INLINE void philox(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < BP_PHILOX_ROUNDS; r++) {
        uint64_t p0 = (uint64_t)BP_PHILOX_M0 * *c0;
        uint64_t p1 = (uint64_t)BP_PHILOX_M1 * *c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ *c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ *c3 ^ k1;
        *c0 = n0;
        *c1 = (uint32_t)p1;
        *c2 = n2;
        *c3 = (uint32_t)p0;
        k0 += BP_PHILOX_W0;
        k1 += BP_PHILOX_W1;
    }
}

/* counters u32[n, 4] and keys u32[n, 2], held in int64 -> out int64[n, 4]. */
void bp_philox(const int64_t *counters, const int64_t *keys, int64_t n, int64_t *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++) {
        uint32_t c0 = (uint32_t)counters[4 * i], c1 = (uint32_t)counters[4 * i + 1];
        uint32_t c2 = (uint32_t)counters[4 * i + 2], c3 = (uint32_t)counters[4 * i + 3];
        philox(&c0, &c1, &c2, &c3, (uint32_t)keys[2 * i], (uint32_t)keys[2 * i + 1]);
        out[4 * i] = c0;
        out[4 * i + 1] = c1;
        out[4 * i + 2] = c2;
        out[4 * i + 3] = c3;
    }
}

/* The Exp(1) variate E made from the words (a, b) (spec 20):
 * V = (a >> 8) * 2^-24 where that is >= 2^-8, else with the 23 bits b >> 9
 * below it; E = -log(1 - V), or its series V + V^2/2 + V^3/3 for small V. */
ALWAYS_INLINE float exponential(uint32_t a, uint32_t b)
{
    int32_t ha = (int32_t)(a >> 8), hb = (int32_t)(b >> 9);
    float coarse_v = (float)ha * float_of(BP_TWO_M24_BITS);              /* exact */
    int coarse = ha >= BP_UNIFORM_COARSE_MIN;
    float v = coarse ? coarse_v : coarse_v + (float)(2 * hb + 1) * float_of(BP_TWO_M48_BITS);
    float big = -canonical_log(1.0f - v);
    float s = v * float_of(BP_THIRD_BITS);
    s = s + float_of(BP_HALF_BITS);
    s = (v * v) * s;
    float small = v + s;
    return coarse ? big : small;
}

/* Tokens whose noise one noise_block call computes (even, a few vectors wide). */
#define NOISE_BLOCK 32

/* The noise of tokens i0 .. i0 + NOISE_BLOCK - 1 (i0 even) of the stream
 * (seed, position) (spec 19) into noise[]: token i0 + 2m at noise[m] from words
 * (0, 1), token i0 + 2m + 1 at noise[NOISE_BLOCK / 2 + m] from words (2, 3) of
 * philox(i >> 1, position lo, hi, SAMPLE_STREAM; seed lo, hi).  Tokens past a
 * row's end are computed too and never read.  Three loops, so that each
 * vectorises: the words, the variates E, their logs. */
static void noise_block(uint64_t seed, uint64_t position, int64_t i0, float *noise)
{
    uint32_t a[NOISE_BLOCK], b[NOISE_BLOCK];
    for (int m = 0; m < NOISE_BLOCK / 2; m++) {
        uint32_t c0 = (uint32_t)(i0 / 2 + m), c1 = (uint32_t)position, c2 = (uint32_t)(position >> 32);
        uint32_t c3 = BP_SAMPLE_STREAM;
        philox(&c0, &c1, &c2, &c3, (uint32_t)seed, (uint32_t)(seed >> 32));
        a[m] = c0;
        b[m] = c1;
        a[NOISE_BLOCK / 2 + m] = c2;
        b[NOISE_BLOCK / 2 + m] = c3;
    }
    for (int m = 0; m < NOISE_BLOCK; m++)
        noise[m] = exponential(a[m], b[m]);
    for (int m = 0; m < NOISE_BLOCK; m++)
        noise[m] = canonical_log(noise[m]);
}

/* -- Selection (spec 21) ----------------------------------------------------- */

/* A uint32 whose unsigned order is spec 21's order of values: numerically,
 * -0.0 == +0.0 (made +0.0 by the add), NaN (0) below -inf (0x007FFFFF). */
ALWAYS_INLINE uint32_t order_key(float v)
{
    uint32_t b = bits_of(v + 0.0f);
    uint32_t k = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);    /* negative: ~b; else b | sign */
    return v != v ? 0u : k;
}

/* Radix digits of a key, most significant first: 11, 11 and 10 bits. */
#define DIGIT_BINS 2048
static const int digit_shift[3] = {21, 10, 0};

/* The k-th largest of keys[0:size] counting repeats (1 <= k <= size), fixing
 * one radix digit at a time.  hist: scratch of DIGIT_BINS. */
static uint32_t radix_kth_largest(const uint32_t *keys, int64_t size, int64_t k, int64_t *hist)
{
    uint32_t prefix = 0, fixed = 0;
    for (int level = 0; level < 3; level++) {
        int s = digit_shift[level];
        uint32_t digits = (level == 2 ? 0x3FFu : 0x7FFu);
        memset(hist, 0, sizeof(int64_t) * DIGIT_BINS);
        for (int64_t i = 0; i < size; i++)
            if ((keys[i] & fixed) == prefix)
                hist[(keys[i] >> s) & digits]++;
        uint32_t d = digits;
        while (k > hist[d]) {
            k -= hist[d];
            d--;
        }
        prefix |= d << s;
        fixed |= digits << s;
    }
    return prefix;
}

/* Keys scanned per step of kth_largest_key: one vectorised test, then (rarely) a copy. */
#define SELECT_BLOCK 64

/* Size of kth_largest_key's buffer for k. */
static int64_t select_buffer_size(int64_t k) { return 2 * k + 1024 + SELECT_BLOCK; }

/* The k-th largest of keys[0:n] counting repeats (1 <= k <= n): what top-k
 * keeps is every key >= it (spec 21).  Threshold filter: t is a key with at
 * least k keys >= t among those seen, so no key <= t can change the answer;
 * buf holds every seen key > t.  A block of keys is copied only when one of
 * them exceeds t; when buf is full, t becomes the k-th largest of buf and buf
 * keeps the (fewer than k) keys above it.  At the end the answer is the k-th
 * largest of buf if buf holds k keys, else t.  t starts at 0, the least key,
 * and all n >= k keys are >= 0.  buf: select_buffer_size(k) keys. */
static uint32_t kth_largest_key(const uint32_t *keys, int64_t n, int64_t k, uint32_t *buf, int64_t *hist)
{
    int64_t cap = select_buffer_size(k), size = 0;
    uint32_t t = 0;
    for (int64_t s = 0; s < n; s += SELECT_BLOCK) {
        int64_t len = n - s < SELECT_BLOCK ? n - s : SELECT_BLOCK;
        int above = 0;
        for (int64_t i = s; i < s + len; i++)
            above |= keys[i] > t;
        if (!above)
            continue;
        if (size + SELECT_BLOCK > cap) {
            t = radix_kth_largest(buf, size, k, hist);
            int64_t kept = 0;
            for (int64_t i = 0; i < size; i++)
                if (buf[i] > t)
                    buf[kept++] = buf[i];
            size = kept;
        }
        for (int64_t i = s; i < s + len; i++)
            if (keys[i] > t)
                buf[size++] = keys[i];
    }
    return size >= k ? radix_kth_largest(buf, size, k, hist) : t;
}

/* A position and its key as one uint64 whose ascending order is spec 21's
 * selection order: value descending, then position ascending (positions < 2^32). */
ALWAYS_INLINE uint64_t rank_of(uint32_t key, int64_t i) { return ((uint64_t)~key << 32) | (uint64_t)i; }
ALWAYS_INLINE int64_t rank_position(uint64_t r) { return (int64_t)(r & 0xFFFFFFFFu); }

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}


/* -- Top-p mass (spec 21) ---------------------------------------------------- */

/* Nodes of one segment's tree: LANES lanes, then the levels of the halving tree. */
#define SEGMENT_NODES (2 * BP_LANES - 1)

/* The canonical sum (spec 3) of a row of n terms, kept with every node of its
 * trees, so that changing the terms of one lane costs that lane and its paths:
 * per segment the lanes and the levels of its halving tree, then the partials
 * and the levels of theirs (tree_build's layout).  Positions without a term
 * hold -0.0, the exact identity, so a lane accumulating only the positions
 * that have a term, in increasing order, has the dense lane loop's bits, and so
 * does every node above it, the root included (spec 3.2). */
struct mass_tree {
    float *node;
    int64_t n, g, gp;      /* row length, segments, partial leaves next_pow2(g) */
};

static int64_t mass_tree_size(int64_t n)
{
    int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
    return g * SEGMENT_NODES + 2 * next_pow2(g) - 1;
}

/* The halving tree over the leaves node[0:w] (w a power of two) with every
 * level kept: level h (h nodes) at node[2w - 2h], node[2w - 2] the root. */
static void tree_build(float *node, int64_t w)
{
    for (int64_t h = w / 2; h >= 1; h /= 2) {
        const float *below = node + 2 * w - 4 * h;
        float *level = node + 2 * w - 2 * h;
        for (int64_t i = 0; i < h; i++)
            level[i] = below[i] + below[i + h];
    }
}

/* tree_build's nodes above leaf `leaf`, recomputed after that leaf changed. */
static void tree_path(float *node, int64_t w, int64_t leaf)
{
    for (int64_t h = w / 2; h >= 1; h /= 2) {
        const float *below = node + 2 * w - 4 * h;
        float *level = node + 2 * w - 2 * h;
        int64_t i = leaf & (h - 1);
        level[i] = below[i] + below[i + h];
    }
}

static float *tree_partials(const struct mass_tree *t) { return t->node + t->g * SEGMENT_NODES; }

static float mass_tree_root(const struct mass_tree *t) { return tree_partials(t)[2 * t->gp - 2]; }

/* The tree of the terms e[p] at the positions p of cand[0:nc] (ascending) with f[p] > v. */
static void mass_tree_fill(const struct mass_tree *t, const float *f, const float *e, const int64_t *cand,
                           int64_t nc, float v)
{
    for (int64_t s = 0; s < t->g; s++)
        for (int64_t j = 0; j < BP_LANES; j++)
            t->node[s * SEGMENT_NODES + j] = NEG_ZERO;
    for (int64_t c = 0; c < nc; c++) {
        int64_t p = cand[c];
        float *lane = &t->node[p / BP_SEGMENT * SEGMENT_NODES + p % BP_LANES];
        if (f[p] > v)
            *lane = *lane + e[p];
    }
    float *partials = tree_partials(t);
    for (int64_t s = 0; s < t->gp; s++) {
        if (s < t->g) {
            tree_build(t->node + s * SEGMENT_NODES, BP_LANES);
            partials[s] = t->node[s * SEGMENT_NODES + 2 * BP_LANES - 2];
        } else {
            partials[s] = NEG_ZERO;
        }
    }
    tree_build(partials, t->gp);
}

/* The lane of position p recomputed over the terms e[q] with f[q] >= v, in
 * increasing q, then the paths above it. */
static void mass_tree_lane(const struct mass_tree *t, const float *f, const float *e, int64_t p, float v)
{
    int64_t s = p / BP_SEGMENT, j = p % BP_LANES;
    int64_t end = (s + 1) * BP_SEGMENT < t->n ? (s + 1) * BP_SEGMENT : t->n;
    float acc = NEG_ZERO;
    for (int64_t q = s * BP_SEGMENT + j; q < end; q += BP_LANES)
        if (f[q] >= v)
            acc = acc + e[q];
    float *seg = t->node + s * SEGMENT_NODES;
    seg[j] = acc;
    tree_path(seg, BP_LANES, j);
    float *partials = tree_partials(t);
    partials[s] = seg[2 * BP_LANES - 2];
    tree_path(partials, t->gp, s);
}

/* Searches spec 21's v* (the smallest kept value with A(v) < thr) among the
 * kept values at ranks[0:nr] (sorted here), which lie below every kept value
 * not among them that is above, and above every one that is below (`below`:
 * whether there are any).  The tree starts as A(t1), the kept mass above the
 * largest of them; each value t that passes (A(t) < thr) has its positions'
 * lanes recomputed over f >= t, which makes the tree A(next value).  Returns
 * 1 with *floor = v*, or 0 when v* is not among them: above them when A(t1)
 * fails, below them when every value passes and so does the next one. */
static int top_p_floor_among(const float *f, const float *e, const int64_t *cand, int64_t nc, uint64_t *ranks,
                             int64_t nr, int below, float thr, const struct mass_tree *t, float *floor)
{
    qsort(ranks, (size_t)nr, sizeof *ranks, compare_u64);
    mass_tree_fill(t, f, e, cand, nc, f[rank_position(ranks[0])]);
    int found = 0;
    for (int64_t i = 0; i < nr;) {
        float v = f[rank_position(ranks[i])];
        if (!(mass_tree_root(t) < thr))
            return found;
        *floor = v;
        found = 1;
        for (; i < nr && f[rank_position(ranks[i])] == v; i++)
            mass_tree_lane(t, f, e, rank_position(ranks[i]), v);
    }
    return !below || !(mass_tree_root(t) < thr);
}

/* Buckets of kept mass by d = shift - w: MASS_PER_UNIT per unit of d below
 * MASS_RANGE, then one for the rest (mass_bucket is monotone in w). */
#define MASS_PER_UNIT 32
#define MASS_RANGE 104
#define MASS_BUCKETS (MASS_PER_UNIT * MASS_RANGE + 1)
/* Kept tokens above which top-p first narrows its search by bucket masses. */
#define TOP_P_DIRECT 1024
/* Relative margin on the float64 bucket masses, far above the canonical sum's
 * relative error (below 2^-18: every term is >= 0 and no path has 64 adds). */
#define MASS_MARGIN 0x1p-12

ALWAYS_INLINE int64_t mass_bucket(float shift, float w)
{
    float d = shift - w;
    return d < (float)MASS_RANGE ? (int64_t)(d * (float)MASS_PER_UNIT) : MASS_BUCKETS - 1;
}

/* Per-thread scratch of the selection and sampling ops, for rows of n values. */
struct select_scratch {
    float *lanes;        /* 2 LANES: row_max */
    float *f, *e;        /* n each: the filtered row (sample), e_i = exp(w_i - shift) */
    uint32_t *keys;      /* n */
    uint32_t *buf;       /* select_buffer_size(n) */
    int64_t *cand;       /* n: kept positions, ascending */
    uint64_t *ranks;     /* 2n: ranks to sort (topk: at most 2k; top-p: the searched positions) */
    int64_t *hist;       /* DIGIT_BINS */
    float *tree;         /* mass_tree nodes */
    double *mass;        /* MASS_BUCKETS */
};

static void select_scratch_free(struct select_scratch *sc)
{
    free(sc->lanes);
    free(sc->f);
    free(sc->e);
    free(sc->keys);
    free(sc->buf);
    free(sc->cand);
    free(sc->ranks);
    free(sc->hist);
    free(sc->tree);
    free(sc->mass);
    *sc = (struct select_scratch){0};
}

/* Scratch for rows of n values; returns 0, or 1 (everything freed) if an allocation failed. */
static int select_scratch_alloc(struct select_scratch *sc, int64_t n)
{
    sc->lanes = malloc(sizeof(float) * 2 * BP_LANES);
    sc->f = malloc(sizeof(float) * (size_t)n);
    sc->e = malloc(sizeof(float) * (size_t)n);
    sc->keys = malloc(sizeof(uint32_t) * (size_t)n);
    sc->buf = malloc(sizeof(uint32_t) * (size_t)select_buffer_size(n));
    sc->cand = malloc(sizeof(int64_t) * (size_t)n);
    sc->ranks = malloc(sizeof(uint64_t) * (size_t)(2 * n));
    sc->hist = malloc(sizeof(int64_t) * DIGIT_BINS);
    sc->tree = malloc(sizeof(float) * (size_t)mass_tree_size(n));
    sc->mass = malloc(sizeof(double) * MASS_BUCKETS);
    if (sc->lanes && sc->f && sc->e && sc->keys && sc->buf && sc->cand && sc->ranks && sc->hist && sc->tree
        && sc->mass)
        return 0;
    select_scratch_free(sc);
    return 1;
}

/* Top-p (spec 21) over the kept positions cand[0:*nc] of f, e their e_i:
 * thr = top_p * Z, Z the canonical sum of the kept e; every kept token below v*
 * gets f = -inf and leaves cand.  A sort of all kept tokens and one lane update
 * per token finds v*; with many kept tokens (top-k off), float64 masses per
 * bucket first pick the few buckets where the mass above crosses thr, and only
 * their tokens are sorted and walked, from the exact canonical sum of the mass
 * above them.  The float64 masses only choose where to look: every decision is
 * the canonical A(v) < thr, and if v* is not where they point, the search falls
 * back to all kept tokens. */
static void top_p_filter(float *f, const float *e, int64_t *cand, int64_t *nc, float shift, float top_p,
                         const struct select_scratch *sc, const struct mass_tree *t)
{
    mass_tree_fill(t, f, e, cand, *nc, NEG_INF);
    float thr = top_p * mass_tree_root(t);
    float floor = NEG_INF;
    int found = 0;
    if (*nc > TOP_P_DIRECT) {
        for (int64_t q = 0; q < MASS_BUCKETS; q++)
            sc->mass[q] = 0.0;
        for (int64_t c = 0; c < *nc; c++)
            sc->mass[mass_bucket(shift, f[cand[c]])] += e[cand[c]];
        /* buckets [qa, qb]: the mass above qa is surely < thr, the mass through qb surely >= thr */
        double low = (double)thr * (1.0 - MASS_MARGIN), high = (double)thr * (1.0 + MASS_MARGIN);
        double above = 0.0;
        int64_t qa = 0;
        while (qa < MASS_BUCKETS - 1 && above + sc->mass[qa] <= low)
            above += sc->mass[qa++];
        int64_t qb = qa;
        double through = above + sc->mass[qb];
        while (qb < MASS_BUCKETS - 1 && through < high)
            through += sc->mass[++qb];
        int64_t nr = 0;
        int below = 0;
        for (int64_t c = 0; c < *nc; c++) {
            int64_t p = cand[c], q = mass_bucket(shift, f[p]);
            if (q >= qa && q <= qb)
                sc->ranks[nr++] = rank_of(order_key(f[p]), p);
            below |= q > qb;
        }
        found = nr > 0 && top_p_floor_among(f, e, cand, *nc, sc->ranks, nr, below, thr, t, &floor);
    }
    if (!found) {
        /* always found: A(max) = -0.0 < thr, and nothing is below */
        for (int64_t c = 0; c < *nc; c++)
            sc->ranks[c] = rank_of(order_key(f[cand[c]]), cand[c]);
        top_p_floor_among(f, e, cand, *nc, sc->ranks, *nc, 0, thr, t, &floor);
    }
    int64_t kept = 0;
    for (int64_t c = 0; c < *nc; c++) {
        int64_t p = cand[c];
        if (f[p] >= floor)
            cand[kept++] = p;
        else
            f[p] = NEG_INF;
    }
    *nc = kept;
}

/* The arguments of the selection row ops; each op reads its own. */
struct select_args {
    const float *x;
    int64_t k;                                   /* topk */
    float *values;
    int64_t *indices;
    const float *scale, *top_p, *min_p;          /* filter_logits, sample: one per row */
    const int64_t *top_k;
    float *out;                                  /* filter_logits */
    const uint8_t *greedy;                       /* sample */
    const int64_t *seeds, *positions;
    int64_t *tokens;
};

/* topk of row r (spec 21) into values and indices [r, 0:k]: tau = the k-th
 * largest key; the keys above tau (fewer than k) and the first k keys equal to
 * it, by position, are ranked (value descending, position ascending) and the
 * first k taken.  Values are copied, bits unchanged. */
static void topk_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    const float *xr = a->x + r * n;
    int64_t k = a->k;
    for (int64_t i = 0; i < n; i++)
        sc->keys[i] = order_key(xr[i]);
    uint32_t tau = kth_largest_key(sc->keys, n, k, sc->buf, sc->hist);
    int64_t nr = 0, ties = 0;
    for (int64_t i = 0; i < n; i++) {
        if (sc->keys[i] > tau || (sc->keys[i] == tau && ties++ < k))
            sc->ranks[nr++] = rank_of(sc->keys[i], i);
    }
    qsort(sc->ranks, (size_t)nr, sizeof *sc->ranks, compare_u64);
    for (int64_t j = 0; j < k; j++) {
        int64_t i = rank_position(sc->ranks[j]);
        a->values[r * k + j] = xr[i];
        a->indices[r * k + j] = i;
    }
}

/* -- Filtering and sampling (spec 21, 22) ------------------------------------- */

struct filter_params {
    float scale;
    int64_t top_k;
    float top_p, min_p;
};

/* Max of w = x * scale over a row, NaN-propagating, + 0.0 (spec 4). */
static float row_max(const float *x, int64_t n, float scale, float *lanes)
{
    int64_t w = lane_width(n);
    float m = NEG_INF;
    for (int64_t s = 0; s < n; s += BP_SEGMENT)
        m = max_nan(m, segment_max(x + s, NULL, n - s < BP_SEGMENT ? n - s : BP_SEGMENT, w, scale, lanes));
    return m + 0.0f;
}

/* f_i = w_i = x_i * scale where kept, else -inf.  Kept: w_i != -inf and, with
 * with_exp, e_i = exp(w_i - shift) >= min_p (min-p), e_i stored; min_p = 0
 * keeps every e_i (never NaN on a row without NaN and +inf). */
ALWAYS_INLINE void keep_pass(int with_exp, const float *x, int64_t n, float scale, float shift, float min_p,
                             float *f, float *e)
{
    for (int64_t i = 0; i < n; i++) {
        float w = x[i] * scale;
        int keep = w != NEG_INF;
        if (with_exp) {
            float ei = canonical_exp(w - shift);
            e[i] = ei;
            keep &= ei >= min_p;
        }
        f[i] = keep ? w : NEG_INF;
    }
}

/* Positions i of f[0:n] with f_i != -inf, ascending, into cand; returns how many.
 * A block is tested in one vectorised pass and copied only when it holds one. */
static int64_t kept_positions(const float *f, int64_t n, int64_t *cand)
{
    int64_t nc = 0;
    for (int64_t s = 0; s < n; s += SELECT_BLOCK) {
        int64_t end = n - s < SELECT_BLOCK ? n : s + SELECT_BLOCK;
        int any = 0;
        for (int64_t i = s; i < end; i++)
            any |= f[i] != NEG_INF;
        if (!any)
            continue;
        for (int64_t i = s; i < end; i++)
            if (f[i] != NEG_INF)
                cand[nc++] = i;
    }
    return nc;
}

/* One row of filter_logits (spec 21), in its order: w = x * scale, then min-p,
 * top-k, top-p, into f[0:n] (w where kept, -inf where removed) and sc->cand,
 * the kept positions ascending (*nc of them).  Returns 1, writing nothing, when
 * w holds a NaN or +inf (no distribution), else 0.  top-k: tau by selection on
 * order keys (kth_largest_key); every f_i >= tau stays, ties included. */
static int filter_row(const float *x, int64_t n, struct filter_params p, float *f, int64_t *nc,
                      const struct select_scratch *sc)
{
    float m = row_max(x, n, p.scale, sc->lanes);
    if (m != m || m == POS_INF)
        return 1;
    float shift = m == NEG_INF ? 0.0f : m;
    int top_k = p.top_k > 0 && p.top_k < n, top_p = p.top_p < 1.0f;
    /* after top-k, top-p needs e only at the ~k tokens left: computed there below */
    int dense_e = p.min_p > 0.0f || (top_p && !top_k);
    if (dense_e)
        keep_pass(1, x, n, p.scale, shift, p.min_p, f, sc->e);
    else
        keep_pass(0, x, n, p.scale, shift, p.min_p, f, sc->e);
    if (top_k) {
        for (int64_t i = 0; i < n; i++)
            sc->keys[i] = order_key(f[i]);
        uint32_t tau = kth_largest_key(sc->keys, n, p.top_k, sc->buf, sc->hist);
        for (int64_t i = 0; i < n; i++)
            f[i] = sc->keys[i] >= tau ? f[i] : NEG_INF;
    }
    *nc = kept_positions(f, n, sc->cand);
    if (top_p && *nc > 0) {
        if (!dense_e)
            for (int64_t c = 0; c < *nc; c++)
                sc->e[sc->cand[c]] = canonical_exp(f[sc->cand[c]] - shift);
        int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
        const struct mass_tree t = {sc->tree, n, g, next_pow2(g)};
        top_p_filter(f, sc->e, sc->cand, nc, shift, p.top_p, sc, &t);
    }
    return 0;
}

static struct filter_params params_of(const struct select_args *a, int64_t r)
{
    return (struct filter_params){a->scale[r], a->top_k[r], a->top_p[r], a->min_p[r]};
}

/* filter_logits of row r into out [r, 0:n]; all NaN without a distribution. */
static void filter_logits_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    float *orow = a->out + r * n;
    int64_t nc;
    if (filter_row(a->x + r * n, n, params_of(a, r), orow, &nc, sc))
        for (int64_t i = 0; i < n; i++)
            orow[i] = NAN_F32;
}

/* The lowest-index maximum of (f_i - shift) - noise_i over the kept positions
 * cand[0:nc] (ascending; spec 22), shift the largest kept value (the row
 * maximum, which every filter keeps), or -1 if there are none.  Only blocks
 * holding a kept token get noise; every score is finite, so the first one is
 * taken. */
static int64_t race_winner(const float *f, const int64_t *cand, int64_t nc, int64_t seed, int64_t position)
{
    float noise[NOISE_BLOCK];
    float best = NEG_INF, shift = NEG_INF;
    int64_t token = -1;
    for (int64_t c = 0; c < nc; c++)
        shift = f[cand[c]] > shift ? f[cand[c]] : shift;   /* a zero's sign cannot change a comparison below */
    for (int64_t c = 0; c < nc;) {
        int64_t b = cand[c] - cand[c] % NOISE_BLOCK;
        noise_block((uint64_t)seed, (uint64_t)position, b, noise);
        for (; c < nc && cand[c] < b + NOISE_BLOCK; c++) {
            int64_t i = cand[c], r = i - b;
            float score = (f[i] - shift) - noise[(r & 1) * (NOISE_BLOCK / 2) + (r >> 1)];
            if (score > best) {
                best = score;
                token = i;
            }
        }
    }
    return token;
}

/* Lowest index of the maximum of x[0:n] (no NaN or +inf), -1 if all are -inf. */
static int64_t first_argmax(const float *x, int64_t n, float *lanes)
{
    float m = row_max(x, n, 1.0f, lanes);
    if (m == NEG_INF)
        return -1;
    int64_t i = 0;
    while (x[i] != m)
        i++;
    return i;
}

/* sample (spec 22) of row r into tokens[r]: a greedy row takes first_argmax of
 * x, any other the race winner over filter_logits' kept tokens; -1 where
 * w = x * scale holds a NaN or +inf. */
static void sample_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    const float *xr = a->x + r * n;
    const struct filter_params p = params_of(a, r);
    int64_t nc;
    if (a->greedy[r]) {
        float m = row_max(xr, n, p.scale, sc->lanes);
        a->tokens[r] = m != m || m == POS_INF ? -1 : first_argmax(xr, n, sc->lanes);
    } else if (filter_row(xr, n, p, sc->f, &nc, sc)) {
        a->tokens[r] = -1;
    } else {
        a->tokens[r] = race_winner(sc->f, sc->cand, nc, a->seeds[r], a->positions[r]);
    }
}

enum select_op { OP_TOPK, OP_FILTER_LOGITS, OP_SAMPLE };

/* Runs op over rows under `omp parallel for schedule(static)`: a thread owns
 * whole rows and its own scratch, so no bit depends on the thread count.
 * Returns 0, or -1 if scratch could not be allocated. */
static int select_rows(enum select_op op, const struct select_args *a, int64_t rows, int64_t n, int nthreads)
{
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        struct select_scratch sc;
        failed = select_scratch_alloc(&sc, n);
        /* every thread reaches the loop: a worksharing loop needs all of them */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (failed)
                continue;
            switch (op) {
            case OP_TOPK: topk_row(a, r, n, &sc); break;
            case OP_FILTER_LOGITS: filter_logits_row(a, r, n, &sc); break;
            case OP_SAMPLE: sample_row(a, r, n, &sc); break;
            }
        }
        select_scratch_free(&sc);
    }
    return failed ? -1 : 0;
}

/* topk of each row of x [rows, n] into values f32[rows, k], indices i64[rows, k]. */
int bp_topk(const float *x, int64_t rows, int64_t n, int64_t k, float *values, int64_t *indices, int nthreads)
{
    const struct select_args a = {.x = x, .k = k, .values = values, .indices = indices};
    return select_rows(OP_TOPK, &a, rows, n, nthreads);
}

/* filter_logits of each row of x [rows, n] with per-row parameters into out [rows, n]. */
int bp_filter_logits(const float *x, int64_t rows, int64_t n, const float *scale, const int64_t *top_k,
                     const float *top_p, const float *min_p, float *out, int nthreads)
{
    const struct select_args a = {.x = x, .scale = scale, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                  .out = out};
    return select_rows(OP_FILTER_LOGITS, &a, rows, n, nthreads);
}

/* sample of each row of x [rows, n] with per-row parameters into tokens i64[rows]. */
int bp_sample(const float *x, int64_t rows, int64_t n, const float *scale, const int64_t *top_k,
              const float *top_p, const float *min_p, const uint8_t *greedy, const int64_t *seeds,
              const int64_t *positions, int64_t *tokens, int nthreads)
{
    const struct select_args a = {.x = x, .scale = scale, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                  .greedy = greedy, .seeds = seeds, .positions = positions, .tokens = tokens};
    return select_rows(OP_SAMPLE, &a, rows, n, nthreads);
}


/* -- Model building blocks (spec 24) ---------------------------------------- */

/* linear and attention are sums of products, computed PANEL sums at a time: a
 * panel holds PANEL columns of the second factor with term j's PANEL values
 * contiguous ([n][PANEL]), so the lane accumulation and every tree level are
 * element-wise over the PANEL columns (one vector op, no horizontal step).
 * Each column is its own canonical sum in row_sum's order: per segment, lanes
 * accumulate terms j, j + W, ... from -0.0, then the halving tree; then the
 * partial tree over segments (halving_tree_cols, combine_partials_cols). */
#define PANEL 16

/* panel[j][c] = src[(c0 + c) * col_stride + j * term_stride] for j < n, c < PANEL, and +0.0 for the
 * columns c0 + c >= cols past the data (their sums are computed and dropped). */
static void pack_panel(const float *src, int64_t n, int64_t cols, int64_t c0, int64_t col_stride,
                       int64_t term_stride, float *panel)
{
    int64_t filled = cols - c0 < PANEL ? cols - c0 : PANEL;
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < filled; c++)
            panel[j * PANEL + c] = src[(c0 + c) * col_stride + j * term_stride];
        for (int64_t c = filled; c < PANEL; c++)
            panel[j * PANEL + c] = 0.0f;
    }
}

/* Floats of scratch panel_dot needs for sums of up to n terms: W lanes and the segment partials. */
static int64_t panel_scratch_size(int64_t n)
{
    return (lane_width(n) + next_pow2((n + BP_SEGMENT - 1) / BP_SEGMENT)) * PANEL;
}

/* out[c] = canonical sum over j < n of a[j] * panel[j][c], each product rounded once, for c < PANEL
 * (spec 3; spec 24's dot).  scratch: panel_scratch_size(n) floats. */
ALWAYS_INLINE void panel_dot(const float *a, const float *panel, int64_t n, float *scratch, float *out)
{
    int64_t w = lane_width(n);
    float *lanes = scratch, *partials = scratch + w * PANEL;
    int64_t g = 0;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        for (int64_t i = 0; i < w * PANEL; i++)
            lanes[i] = NEG_ZERO;
        /* term j goes to lane j mod W, so each lane meets its terms in increasing order */
        for (int64_t j = 0; j < len; j++) {
            float aj = a[s + j];
            const float *pj = panel + (s + j) * PANEL;
            float *lj = lanes + (j & (w - 1)) * PANEL;
            /* simd: without it gcc unrolls this short loop into scalar code before it would vectorise */
#pragma omp simd
            for (int64_t c = 0; c < PANEL; c++)
                lj[c] = lj[c] + aj * pj[c];
        }
        halving_tree_cols(lanes, w, PANEL);
        memcpy(partials + g * PANEL, lanes, sizeof(float) * PANEL);
    }
    combine_partials_cols(partials, g, PANEL);
    memcpy(out, partials, sizeof(float) * PANEL);
}

/* linear's kernel: a tile of TILE_ROWS rows of x by one panel's PANEL outputs, each output its own canonical
 * sum, held in registers as one PANEL-wide vector per row (gcc's vector extension: element-wise IEEE ops,
 * uncontracted under -ffp-contract=off, split into narrower registers on narrower ISAs).  Instead of the
 * halving tree's level order the tree is evaluated depth first, which needs log2(W) + 1 live vectors per
 * row instead of W: the tree over lanes base + stride * t, t < w, is
 *   T(base, stride, w) = T(base, 2 stride, w/2) + T(base + stride, 2 stride, w/2)
 * (its last level, h = 1, adds the sum of the even positions to the sum of the odd ones; each of those is
 * the same tree over half the lanes).  A subtree whose lanes all lie past the data is -0.0, so its add is
 * the identity and is skipped.  A lane (leaf) is its chunk accumulation: the terms j, j + LANES, ... of
 * the segment in sequence, the first one exact (-0.0 + p = p). */
#define TILE_ROWS 4
#define TILE_TREE_LEAVES 64

/* aligned(4): scratch comes from malloc, which guarantees less than the vector's own 64 bytes */
typedef float panel_vec __attribute__((vector_size(PANEL * sizeof(float)), aligned(4)));

struct tile {
    panel_vec row[TILE_ROWS];
};

/* One segment of the tile's sums: x[r] + s (r < rows) and panel + s * PANEL, len terms. */
struct tile_segment {
    const float *x[TILE_ROWS];
    const float *panel;
    int64_t len;
};

ALWAYS_INLINE panel_vec load_panel_vec(const float *p)
{
    panel_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Lane j of rows [0:rows): the products of terms j, j + LANES, ... (< len) accumulated in sequence. */
ALWAYS_INLINE struct tile tile_lane(const struct tile_segment *s, int rows, int64_t j)
{
    struct tile t = {{{0}}};   /* rows past `rows` are never read; zero keeps them defined */
    panel_vec wj = load_panel_vec(s->panel + j * PANEL);
    for (int r = 0; r < rows; r++)
        t.row[r] = s->x[r][j] * wj;
    for (int64_t c = j + BP_LANES; c < s->len; c += BP_LANES) {
        panel_vec wc = load_panel_vec(s->panel + c * PANEL);
        for (int r = 0; r < rows; r++)
            t.row[r] = t.row[r] + s->x[r][c] * wc;
    }
    return t;
}

#define TILE_TREE_1(s, rows, base, stride) tile_lane(s, rows, base)

/* T(base, stride, w) for w = 2 * half, as above; defined for w = 2, 4, ..., TILE_TREE_LEAVES. */
#define DEFINE_TILE_TREE(w, half)                                                                             \
    ALWAYS_INLINE struct tile tile_tree_##w(const struct tile_segment *s, int rows, int64_t base, int64_t stride) \
    {                                                                                                         \
        struct tile even = TILE_TREE_##half(s, rows, base, 2 * stride);                                      \
        if (base + stride >= s->len)                                                                          \
            return even;                                                                                      \
        struct tile odd = TILE_TREE_##half(s, rows, base + stride, 2 * stride);                              \
        for (int r = 0; r < rows; r++)                                                                        \
            even.row[r] = even.row[r] + odd.row[r];                                                           \
        return even;                                                                                          \
    }
DEFINE_TILE_TREE(2, 1)
#define TILE_TREE_2 tile_tree_2
DEFINE_TILE_TREE(4, 2)
#define TILE_TREE_4 tile_tree_4
DEFINE_TILE_TREE(8, 4)
#define TILE_TREE_8 tile_tree_8
DEFINE_TILE_TREE(16, 8)
#define TILE_TREE_16 tile_tree_16
DEFINE_TILE_TREE(32, 16)
#define TILE_TREE_32 tile_tree_32
DEFINE_TILE_TREE(64, 32)

/* Depth-first subtrees of a segment of len terms: W / 64 for W = lane_width(len) > 64, else 1. */
static int64_t tile_subtrees(int64_t len)
{
    int64_t w = lane_width(len);
    return w > TILE_TREE_LEAVES ? w / TILE_TREE_LEAVES : 1;
}

/* Floats of scratch linear_tile needs for sums of k terms: the subtrees of one segment, then the segment
 * partials, each a tile. */
static int64_t tile_scratch_size(int64_t k)
{
    return (tile_subtrees(k) + next_pow2((k + BP_SEGMENT - 1) / BP_SEGMENT)) * TILE_ROWS * PANEL;
}

/* The tile's row r, column c: dot(x[r], panel column c), for r < rows.  Per segment of len terms the tree
 * over W = lane_width(len) lanes (the segment's LANES lanes give the same bits, spec 3.2) is the halving
 * tree over its top W / 64 subtrees (lanes b + (W / 64) t), each computed depth first in registers
 * (W <= 64: one subtree over 64 lanes, the top ones empty); then the partial tree over segments.
 * scratch: tile_scratch_size(k) floats. */
ALWAYS_INLINE struct tile linear_tile(const float *const *x, int rows, const float *panel, int64_t k,
                                      float *scratch)
{
    struct tile *top = (struct tile *)scratch;
    struct tile *partials = top + tile_subtrees(k);
    int64_t g = 0;
    for (int64_t s0 = 0; s0 < k; s0 += BP_SEGMENT, g++) {
        struct tile_segment seg = {.panel = panel + s0 * PANEL, .len = k - s0 < BP_SEGMENT ? k - s0 : BP_SEGMENT};
        int64_t subtrees = tile_subtrees(seg.len);
        for (int r = 0; r < rows; r++)
            seg.x[r] = x[r] + s0;
        for (int64_t b = 0; b < subtrees; b++)
            top[b] = tile_tree_64(&seg, rows, b, subtrees);
        halving_tree_cols((float *)top, subtrees, TILE_ROWS * PANEL);
        partials[g] = top[0];
    }
    combine_partials_cols((float *)partials, g, TILE_ROWS * PANEL);
    return partials[0];
}

/* linear (spec 24.1): out [m, n] = the canonical dots of x [m, k] with weight [n, k] (+ bias [n], one
 * add; no + 0.0).  The weight is packed once into panels of PANEL outputs; (panel, block of TILE_ROWS rows)
 * items are split over threads, rows inner, so a thread reuses its panel from cache.  The last block's
 * rows past m are computed one at a time.  Returns 0, or -1 if scratch could not be allocated. */
int bp_linear(const float *x, const float *weight, const float *bias, int64_t m, int64_t k, int64_t n,
              float *out, int nthreads)
{
    int64_t panels = (n + PANEL - 1) / PANEL, blocks = (m + TILE_ROWS - 1) / TILE_ROWS;
    float *packed = malloc(sizeof(float) * (size_t)(panels * k * PANEL));
    if (packed == NULL)
        return -1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t p = 0; p < panels; p++)
        pack_panel(weight, k, n, p * PANEL, k, 1, packed + p * k * PANEL);
    int64_t scratch_size = tile_scratch_size(k);
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        float *scratch = malloc(sizeof(float) * (size_t)scratch_size);
        failed = scratch == NULL;
        /* every thread reaches the loop: a worksharing loop needs all of them */
#pragma omp for schedule(static)
        for (int64_t item = 0; item < panels * blocks; item++) {
            if (failed)
                continue;
            int64_t p = item / blocks, r0 = item % blocks * TILE_ROWS, c0 = p * PANEL;
            int rows = m - r0 < TILE_ROWS ? (int)(m - r0) : TILE_ROWS;
            const float *xr[TILE_ROWS];
            for (int r = 0; r < rows; r++)
                xr[r] = x + (r0 + r) * k;
            const float *panel = packed + p * k * PANEL;
            struct tile y;
            if (rows == TILE_ROWS)
                y = linear_tile(xr, TILE_ROWS, panel, k, scratch);
            else
                for (int r = 0; r < rows; r++)
                    y.row[r] = linear_tile(xr + r, 1, panel, k, scratch).row[0];
            for (int r = 0; r < rows; r++) {
                float *orow = out + (r0 + r) * n + c0;
                for (int64_t c = 0; c < PANEL && c0 + c < n; c++)
                    orow[c] = bias ? y.row[r][c] + bias[c0 + c] : y.row[r][c];
            }
        }
        free(scratch);
    }
    free(packed);
    return failed ? -1 : 0;
}

/* rms_norm (spec 24.2) of each row of x [rows, d]:
 *   ms = canonical sum of x_i * x_i, times reciprocal(d); r = rsqrt(ms + eps); out_i = (x_i * r) * weight_i.
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_rms_norm(const float *x, const float *weight, int64_t rows, int64_t d, float eps, float *out,
                int nthreads)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float inv_d = canonical_reciprocal((float)d);
    int64_t gp = next_pow2((d + BP_SEGMENT - 1) / BP_SEGMENT);
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        float *lanes = malloc(sizeof(float) * (size_t)(BP_LANES + gp));
        failed = lanes == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (failed)
                continue;
            const float *xr = x + r * d;
            float *orow = out + r * d;
            float ms = row_sum(TERM_SQUARE, xr, NULL, d, &none, lanes, lanes + BP_LANES) * inv_d;
            float rs = canonical_rsqrt(ms + eps);
            for (int64_t i = 0; i < d; i++)
                orow[i] = (xr[i] * rs) * weight[i];
        }
        free(lanes);
    }
    return failed ? -1 : 0;
}

/* rotary (spec 24.3) of each row of x [rows, d], with the row's cos_t and sin_t [rows, d/2]:
 * out_i = x_i * cos_i - x_{i+h} * sin_i, out_{i+h} = x_{i+h} * cos_i + x_i * sin_i, h = d/2. */
void bp_rotary(const float *x, const float *cos_t, const float *sin_t, int64_t rows, int64_t d, float *out,
               int nthreads)
{
    int64_t h = d / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *cr = cos_t + r * h, *sr = sin_t + r * h;
        float *orow = out + r * d;
        for (int64_t i = 0; i < h; i++) {
            orow[i] = xr[i] * cr[i] - xr[i + h] * sr[i];
            orow[i + h] = xr[i + h] * cr[i] + xr[i] * sr[i];
        }
    }
}

/* attention (spec 24.4): q [groups, tq, d], k and v [groups, tk, d] -> out [groups, tq, d].  Query i
 * of group g sees the keys j < limit = min(kv_lengths[g], i + 1 + tk - tq when causal): a prefix, so
 * the keys that do not count (-inf in the softmax, -0.0 in the sums, both identities) are simply not
 * visited, and nothing read past the prefix is ever combined with a number.  Per (g, i):
 *   s_j = dot(q_i, k_j) for j < limit            (PANEL keys per panel_dot)
 *   softmax_stats of w = s * scale over the prefix (spec 8.2), p_j = exp(w_j - shift) * recip (spec 8.3)
 *   out_i[c] = canonical sum over j < limit of p_j * v_j[c]   (PANEL columns per panel_dot)
 * Each group's k is packed into key panels ([d][PANEL]) and v into column panels ([tk][PANEL]) once;
 * (group, query) items are split over threads.  Returns 0, or -1 if scratch could not be allocated. */
int bp_attention(const float *q, const float *k, const float *v, const int64_t *kv_lengths, int64_t groups,
                 int64_t tq, int64_t tk, int64_t d, int causal, float scale, float *out, int nthreads)
{
    int64_t key_panels = (tk + PANEL - 1) / PANEL, col_panels = (d + PANEL - 1) / PANEL;
    int64_t key_size = key_panels * d * PANEL, group_size = key_size + col_panels * tk * PANEL;
    float *packed = malloc(sizeof(float) * (size_t)(groups * group_size));
    if (packed == NULL)
        return -1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; g++) {
        const float *kg = k + g * tk * d, *vg = v + g * tk * d;
        float *keys = packed + g * group_size, *cols = keys + key_size;
        for (int64_t p = 0; p < key_panels; p++)
            pack_panel(kg, d, tk, p * PANEL, d, 1, keys + p * d * PANEL);
        for (int64_t p = 0; p < col_panels; p++)
            pack_panel(vg, tk, d, p * PANEL, 1, d, cols + p * tk * PANEL);
    }
    int64_t gp = next_pow2((tk + BP_SEGMENT - 1) / BP_SEGMENT);
    int64_t dot_size = panel_scratch_size(tk > d ? tk : d);
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        /* softmax_stats' scratch, panel_dot's scratch, PANEL outputs, scores [key_panels * PANEL], p [tk] */
        float *buf = malloc(sizeof(float) * (size_t)(2 * BP_LANES + 3 * gp + dot_size + PANEL
                                                     + key_panels * PANEL + tk));
        failed = buf == NULL;
        struct scratch sc = {buf, buf + 2 * BP_LANES, buf + 2 * BP_LANES + gp, buf + 2 * BP_LANES + 2 * gp};
        float *dot_scratch = buf + 2 * BP_LANES + 3 * gp, *y = dot_scratch + dot_size;
        float *scores = y + PANEL, *probs = scores + key_panels * PANEL;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < groups * tq; item++) {
            if (failed)
                continue;
            int64_t g = item / tq, i = item % tq;
            int64_t limit = kv_lengths[g];
            if (causal && i + 1 + tk - tq < limit)
                limit = i + 1 + tk - tq;
            const float *keys = packed + g * group_size, *cols = keys + key_size;
            for (int64_t p = 0; p * PANEL < limit; p++)
                panel_dot(q + item * d, keys + p * d * PANEL, d, dot_scratch, scores + p * PANEL);
            struct stats st = softmax_stats(scores, NULL, limit, scale, &sc);
            for (int64_t j = 0; j < limit; j++)
                probs[j] = canonical_exp(scaled(scores, NULL, j, scale) - st.shift) * st.recip;
            float *orow = out + item * d;
            for (int64_t p = 0; p < col_panels; p++) {
                panel_dot(probs, cols + p * tk * PANEL, limit, dot_scratch, y);
                for (int64_t c = 0; c < PANEL && p * PANEL + c < d; c++)
                    orow[p * PANEL + c] = y[c];
            }
        }
        free(buf);
    }
    free(packed);
    return failed ? -1 : 0;
}

/* silu_mul (spec 24.5), element-wise: e = exp(-|g|), r = reciprocal(1 + e) (1 + e in [1, 2]),
 * sigmoid = g >= 0 ? r : e * r, out = (g * sigmoid) * up. */
void bp_silu_mul(const float *gate, const float *up, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        float e = canonical_exp(-abs_f32(g));
        float r = canonical_reciprocal(1.0f + e);
        float sigmoid = g >= 0.0f ? r : e * r;
        out[i] = (g * sigmoid) * up[i];
    }
}
