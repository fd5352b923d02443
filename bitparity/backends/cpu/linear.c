/* linear (spec 24.1, 2.0.0) for the `cpu` backend: the exact integer product of the rows' fixed-point
 * quantisations, rounded once.  Three steps, the middle one an integer GEMM chosen in int_linear.py:
 *
 *   bp_linear_quantise  rows of binary32 -> Q = RNE(v * 2^(B-2-E)) as `slices` balanced int8 digits per entry,
 *                       sum_s 2^(8s) d_s = Q, each d in [-128, 127] (s slices hold B <= 8s - 1 bits: five for
 *                       x's 39, four for the weight's 29), stored slice-major ([slices][rows][k]), with the row's
 *                       exponent E and whether it is finite;
 *   (the GEMM)          P[i][j] = digits_i(x) . digits_j(w) over k for the 20 slice pairs, int32: exact, since
 *                       |d d'| <= 2^14 and the caller cuts k into chunks of at most 131071 terms;
 *   bp_linear_round     S = sum over chunks and pairs of P[i][j] * 2^(8(i+j)) in a 128-bit integer (exact:
 *                       |S| <= k 2^66), rounded once to binary32 at 2^(Ex + Ew - (Bx-2) - (Bw-2)), pairs with a
 *                       non-finite row given their IEEE value instead, then the bias (one add).
 *
 * Integer addition is associative, so neither the GEMM's order nor the thread split can change a bit. */

#include "canonical.h"

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

/* e(v) = floor(log2 |v|) of a nonzero finite pattern (sign cleared): the exponent field, or for a subnormal
 * the bit length of its fraction minus 150. */
ALWAYS_INLINE int exponent_of(uint32_t a)
{
    int biased = (int)(a >> 23);
    return biased ? biased - 127 : (32 - __builtin_clz(a)) - 150;
}

/* Q = RNE(v 2^(bits-2-e_row)) of one entry, 0 in a non-finite row.  Branch-free, so that gcc vectorises its
 * loops: |v| = m 2^s, |Q| = RNE(m 2^t) < 2^(bits-1) <= 2^38; a right shift by 25 or more leaves 0 (m < 2^24), so
 * the shift is capped there; zeros give m = 0. */
ALWAYS_INLINE int64_t quantised(float value, int bits, int e_row, int32_t finite)
{
    uint32_t u = bits_of(value), a = u & 0x7FFFFFFFu, biased = a >> 23;
    uint32_t m = biased ? (a & 0x7FFFFFu) | 0x800000u : a;
    int32_t s = biased ? (int32_t)biased - 150 : -149;
    int32_t t = s + bits - 2 - e_row;
    uint64_t left = (uint64_t)m << (t > 0 ? (t < 40 ? t : 40) : 0);
    int32_t rs = -t < 1 ? 1 : (-t > 25 ? 25 : -t);
    uint32_t q = m >> rs, rem = m & ((1u << rs) - 1), half = 1u << (rs - 1);
    uint32_t right = q + ((rem > half) | ((rem == half) & (q & 1)));
    int64_t mag = (int64_t)(t >= 0 ? left : right) * finite;
    return (u >> 31) ? -mag : mag;
}

struct quantise_job {
    const float *v;
    int64_t rows, k;
    int bits, slices;
    int8_t *digits;                 /* [slices][rows][k], or NULL: then q */
    int64_t *q;                     /* [rows][k] */
    int32_t *exponent;
    uint8_t *finite;
};

static void quantise_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct quantise_job *c = ctx;
    const int64_t k = c->k, plane = c->rows * c->k;
    for (int64_t r = begin; r < end; r++) {
        const float *row = c->v + r * k;
        /* The magnitude patterns of finite values order as the values do, and NaN patterns lie above +inf's: the
         * largest pattern gives E and tells whether the row is finite. */
        uint32_t top = 0;
        for (int64_t i = 0; i < k; i++) {
            uint32_t a = bits_of(row[i]) & 0x7FFFFFFFu;
            top = a > top ? a : top;
        }
        int32_t finite = top < 0x7F800000u;
        int e_row = (top == 0 || !finite) ? 0 : exponent_of(top);        /* an all-zero row: E = 0, Q = 0 */
        if (c->q) {
            int64_t *qrow = c->q + r * k;
            for (int64_t i = 0; i < k; i++)
                qrow[i] = quantised(row[i], c->bits, e_row, finite);
        } else {
            int8_t *d = c->digits + r * k;
            for (int64_t i = 0; i < k; i++) {
                int64_t v = quantised(row[i], c->bits, e_row, finite);
                for (int sl = 0; sl < c->slices; sl++) {                    /* balanced base-256 digits */
                    int64_t digit = ((v + 128) & 255) - 128;
                    d[sl * plane + i] = (int8_t)digit;
                    v = (v - digit) >> 8;
                }
            }
        }
        c->exponent[r] = e_row;
        c->finite[r] = (uint8_t)finite;
    }
}

/* v [rows, k] -> digits int8 [slices][rows][k], exponent int32 [rows], finite uint8 [rows]; bits = B <= 8 slices - 1
 * and <= 39. */
void bp_linear_quantise(const float *v, int64_t rows, int64_t k, int bits, int slices, int8_t *digits,
                        int32_t *exponent, uint8_t *finite, int nthreads)
{
    const struct quantise_job c = {v, rows, k, bits, slices, digits, 0, exponent, finite};
    bp_parallel_for(quantise_span, &c, rows, nthreads);
}

/* The same quantisation, Q as int64 [rows][k] (the weight gradient's binary64 products). */
void bp_linear_quantise_q(const float *v, int64_t rows, int64_t k, int bits, int64_t *q, int32_t *exponent,
                          uint8_t *finite, int nthreads)
{
    const struct quantise_job c = {v, rows, k, bits, 0, 0, q, exponent, finite};
    bp_parallel_for(quantise_span, &c, rows, nthreads);
}

/* The binary32 nearest to S * 2^p, ties to even, on the subnormal grid below 2^-126, +-inf from
 * 2^128 (1 - 2^-25) up; +0.0 for S = 0 (spec 24.1).  One rounding of the exact integer. */
ALWAYS_INLINE float round_scaled(i128 s, int p)
{
    if (s == 0)
        return 0.0f;
    uint32_t sign = s < 0 ? 0x80000000u : 0;
    u128 a = s < 0 ? -(u128)s : (u128)s;
    uint64_t hi = (uint64_t)(a >> 64), lo = (uint64_t)a;
    int length = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll(lo);
    int r = length - 24 > -149 - p ? length - 24 : -149 - p;             /* the result's lsb is 2^(r + p) */
    uint64_t q;
    if (r <= 0) {
        q = (uint64_t)a << -r;
    } else if (r > length) {
        q = 0;                                                             /* below half the smallest step */
    } else {
        u128 kept = a >> r, rem = a - (kept << r), half = (u128)1 << (r - 1);
        q = (uint64_t)kept + (rem > half || (rem == half && (kept & 1)));
    }
    int64_t pattern = ((int64_t)(r + p + 149) << 23) + (int64_t)q;      /* q = 2^24 carries into the exponent */
    if (pattern > 0x7F800000)
        pattern = 0x7F800000;
    return float_of((uint32_t)pattern | sign);
}

/* The IEEE value of the sum of the exact products of x and w (length k), one of them holding NaN or +-inf
 * (spec 24.1): NaN for a NaN product (a NaN factor, or +-inf * +-0) or +inf with -inf, else the infinity. */
ALWAYS_INLINE int is_inf(float v) { return (bits_of(v) & 0x7FFFFFFFu) == 0x7F800000u; }

static float nonfinite_pair(const float *x, const float *w, int64_t k)
{
    int nan = 0, pos = 0, neg = 0;
    for (int64_t i = 0; i < k; i++) {
        float a = x[i], b = w[i];
        if (a != a || b != b || (is_inf(a) && b == 0.0f) || (a == 0.0f && is_inf(b))) {
            nan = 1;
        } else if (is_inf(a) || is_inf(b)) {
            if ((a > 0.0f) == (b > 0.0f))
                pos = 1;
            else
                neg = 1;
        }
    }
    if (nan || (pos && neg))
        return float_of(0x7FC00000u);
    return pos ? float_of(0x7F800000u) : float_of(0xFF800000u);
}

struct round_job {
    const int32_t *partials;        /* [chunks][sx m][sw n] */
    int64_t chunks, m, n, k;
    int sx, sw;                     /* slices of x and of the weight */
    const int32_t *ex, *ew;
    const uint8_t *x_finite, *w_finite;
    const float *x, *w, *bias;
    int offset;                     /* (Bx - 2) + (Bw - 2) */
    float *out;
};

static void round_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct round_job *c = ctx;
    const int64_t m = c->m, n = c->n, ld = c->sw * n, chunk = c->sx * c->sw * m * n;
    for (int64_t r = begin; r < end; r++) {
        for (int64_t col = 0; col < n; col++) {
            float y;
            if (c->x_finite[r] && c->w_finite[col]) {
                /* The pairs of one weight 2^(8w) first (at most 5 int32 each per chunk: within int64), then
                 * S = sum_w T_w 2^(8w) by Horner from the top, in 128 bits. */
                int64_t t[16] = {0};
                for (int64_t ch = 0; ch < c->chunks; ch++) {
                    const int32_t *p = c->partials + ch * chunk + r * ld + col;
                    for (int i = 0; i < c->sx; i++)
                        for (int j = 0; j < c->sw; j++)
                            t[i + j] += p[i * m * ld + j * n];
                }
                i128 s = 0;
                for (int w = c->sx + c->sw - 2; w >= 0; w--)
                    s = s * 256 + t[w];
                y = round_scaled(s, c->ex[r] + c->ew[col] - c->offset);
            } else {
                y = nonfinite_pair(c->x + r * c->k, c->w + col * c->k, c->k);
            }
            c->out[r * n + col] = c->bias ? y + c->bias[col] : y;
        }
    }
}

/* partials int32 [chunks][sx m][sw n] (x slice i, row r at row i*m + r; weight slice j, row col at column
 * j*n + col) -> out [m, n]; x [m, k] and w [n, k] are read only for pairs with a non-finite row. */
void bp_linear_round(const int32_t *partials, int64_t chunks, int64_t m, int64_t n, int64_t k, int sx, int sw,
                     const int32_t *ex, const int32_t *ew, const uint8_t *x_finite, const uint8_t *w_finite,
                     const float *x, const float *w, const float *bias, int offset, float *out, int nthreads)
{
    const struct round_job c = {partials, chunks, m, n, k, sx, sw, ex, ew, x_finite, w_finite, x, w, bias, offset,
                                out};
    bp_parallel_for(round_span, &c, m, nthreads);
}

struct round_f64_job {
    const double *high, *low;       /* [m][n], exact integers: S = high 2^20 + low */
    int64_t n, k;
    const int32_t *ex, *ew;
    const uint8_t *x_finite, *w_finite;
    const float *x, *w;
    int offset;
    float *out;
};

static void round_f64_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct round_f64_job *c = ctx;
    for (int64_t r = begin; r < end; r++)
        for (int64_t col = 0; col < c->n; col++) {
            int64_t at = r * c->n + col;
            c->out[at] = (c->x_finite[r] && c->w_finite[col])
                ? round_scaled((i128)(int64_t)c->high[at] * ((i128)1 << 20) + (int64_t)c->low[at],
                               c->ex[r] + c->ew[col] - c->offset)
                : nonfinite_pair(c->x + r * c->k, c->w + col * c->k, c->k);
        }
}

/* out [m, n] from S = high 2^20 + low, each an exact integer below 2^53 held in binary64 (linear's products for
 * short k, int_linear.weight_grad), as bp_linear_round without a bias. */
void bp_linear_round_f64(const double *high, const double *low, int64_t m, int64_t n, int64_t k,
                         const int32_t *ex, const int32_t *ew, const uint8_t *x_finite, const uint8_t *w_finite,
                         const float *x, const float *w, int offset, float *out, int nthreads)
{
    const struct round_f64_job c = {high, low, n, k, ex, ew, x_finite, w_finite, x, w, offset, out};
    bp_parallel_for(round_f64_span, &c, m, nthreads);
}

struct gemm_job {
    const int8_t *a, *b;
    int64_t n, k;
    int32_t *out;
};

static void gemm_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct gemm_job *c = ctx;
    for (int64_t r = begin; r < end; r++) {
        const int8_t *ar = c->a + r * c->k;
        for (int64_t col = 0; col < c->n; col++) {
            const int8_t *bc = c->b + col * c->k;
            int32_t acc = 0;
            for (int64_t i = 0; i < c->k; i++)
                acc += (int32_t)ar[i] * (int32_t)bc[i];
            c->out[r * c->n + col] = acc;
        }
    }
}

/* The fallback where no vendor int8 GEMM is proven exact: out [m, n] = a [m, k] . b [n, k]^T in int32,
 * exact for |a b| <= 2^14 and k <= LINEAR_CHUNK_K (the caller's chunks). */
void bp_int8_gemm(const int8_t *a, const int8_t *b, int64_t m, int64_t n, int64_t k, int32_t *out, int nthreads)
{
    const struct gemm_job c = {a, b, n, k, out};
    bp_parallel_for(gemm_span, &c, m, nthreads);
}
