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

#include <immintrin.h>

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

/* A row's E (0 for an all-zero or non-finite row) and whether it is finite.  The magnitude patterns of finite
 * values order as the values do, and NaN patterns lie above +inf's: the largest pattern gives E and tells whether
 * the row is finite. */
ALWAYS_INLINE int row_exponent(const float *row, int64_t k, int32_t *finite)
{
    uint32_t top = 0;
    for (int64_t i = 0; i < k; i++) {
        uint32_t a = bits_of(row[i]) & 0x7FFFFFFFu;
        top = a > top ? a : top;
    }
    *finite = top < 0x7F800000u;
    return (top == 0 || !*finite) ? 0 : exponent_of(top);               /* an all-zero row: E = 0, Q = 0 */
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
        int32_t finite;
        int e_row = row_exponent(row, k, &finite);
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

/* ---- The fused product on AVX-512 VNNI (int_linear.linear where bp_linear_vnni() holds) ----
 *
 * The same S without the 20 int32 partial planes in memory: one pass per 16 weight rows and 3 x rows computes all
 * twenty slice products in registers, sums each digit weight's pairs, and rounds.
 *
 *   (pack_x_span)     x's rows as five balanced int8 digits, as bp_linear_quantise's, stored [rows][5][ld] with k
 *                     padded to ld by zeros, and each row's sum_k Q (int64).  ld, a multiple of 4, is k rounded
 *                     up plus 64 bytes: at a multiple of 4096 bytes the kernel's 15 digit streams would share one
 *                     L1 set (the 1.8x slowdown measured at k = 4096);
 *   bp_linear_pack_w  the weight's rows as U = Q + 2^(B-1) in [0, 2^B], four unsigned base-256 digits (B <= 31), in
 *                     VNNI panels: [n/16][kp/4][4 slices][16 rows][4 k], padding zero;
 *   bp_linear_fused   VPDPBUSD multiplies 4 unsigned weight digits by 4 signed x digits (broadcast from memory) and
 *                     adds the 4 products to an int32 lane.  The pairs (i, j) with i + j = d go to one accumulator
 *                     per digit weight d (8 of them): at most four pairs, each product in [-32640, 32385], so 16384
 *                     k-terms stay within int32 (4 * 32640 * 16384 < 2^31) and the lane's wrap-around sum is the
 *                     exact one; longer rows add their 16384-term chunks in int64.  Then
 *                     S = sum_d T_d 2^(8d) - 2^(Bw-1) sum_k Qx, in 128 bits, rounded once by round_scaled.  Exact
 *                     integers again: no bit differs from bp_linear_round's. */

#define FUSED_SX 5                      /* x digits: |Qx| <= 2^38 */
#define FUSED_SW 4                      /* weight digits: U < 2^32 */
#define FUSED_D (FUSED_SX + FUSED_SW - 1)
#define FUSED_COLS 16                   /* weight rows per panel: int32 lanes of a zmm */
#define FUSED_ROWS 3                    /* x rows per register tile: 3 x 8 accumulators + 4 weight vectors */
#define FUSED_CHUNK_Q 4096              /* k-quads per int32 chunk (16384 terms) */

/* 1 if this CPU runs the fused kernel (AVX-512F, DQ and VNNI). */
int bp_linear_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
           && __builtin_cpu_supports("avx512vnni");
}

struct pack_job {
    const float *v;
    int64_t k, kp, n;
    int bits;
    void *packed;
    int64_t *qsum;
    int32_t *exponent;
    uint8_t *finite;
};

static void pack_x_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct pack_job *c = ctx;
    const int64_t k = c->k, ld = c->kp;
    for (int64_t r = begin; r < end; r++) {
        const float *row = c->v + r * k;
        int32_t finite;
        int e_row = row_exponent(row, k, &finite);
        int8_t *d = (int8_t *)c->packed + r * FUSED_SX * ld;
        int64_t sum = 0;
        for (int64_t i = 0; i < k; i++) {
            int64_t v = quantised(row[i], c->bits, e_row, finite);
            sum += v;
            for (int sl = 0; sl < FUSED_SX; sl++) {                     /* balanced base-256 digits */
                int64_t digit = ((v + 128) & 255) - 128;
                d[sl * ld + i] = (int8_t)digit;
                v = (v - digit) >> 8;
            }
        }
        for (int sl = 0; sl < FUSED_SX; sl++)
            memset(d + sl * ld + k, 0, (size_t)(ld - k));
        c->qsum[r] = sum;
        c->exponent[r] = e_row;
        c->finite[r] = (uint8_t)finite;
    }
}

static void pack_w_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct pack_job *c = ctx;
    const int64_t k = c->k, kq = c->kp / 4;
    const int64_t offset = (int64_t)1 << (c->bits - 1);
    for (int64_t r = begin; r < end; r++) {
        const float *row = c->v + r * k;
        int32_t finite;
        int e_row = row_exponent(row, k, &finite);
        uint8_t *panel = (uint8_t *)c->packed + (r / FUSED_COLS) * kq * FUSED_SW * FUSED_COLS * 4
                         + (r % FUSED_COLS) * 4;
        /* A k-quad's four digits of each slice are formed in `quad` and stored as 4 bytes: stores at the panels'
         * stride, which gcc otherwise vectorises into scatters (slow on this AMD EPYC). k's padding gets 0. */
        for (int64_t q = 0; q < kq; q++) {
            uint8_t quad[FUSED_SW][4] = {{0}};
            for (int e = 0; e < 4 && 4 * q + e < k; e++) {
                uint64_t u = (uint64_t)(quantised(row[4 * q + e], c->bits, e_row, finite) + offset);
                for (int sl = 0; sl < FUSED_SW; sl++, u >>= 8)
                    quad[sl][e] = (uint8_t)u;
            }
            for (int sl = 0; sl < FUSED_SW; sl++)
                memcpy(panel + (q * FUSED_SW + sl) * FUSED_COLS * 4, quad[sl], 4);
        }
        c->exponent[r] = e_row;
        c->finite[r] = (uint8_t)finite;
    }
}

/* w [n, k] -> packed uint8 [ceil(n/16)][kp/4][4][16][4] (k's padding 0; the caller zeroes the padding rows of the
 * last panel, whose outputs are not stored), exponent, finite; bits <= 31. */
void bp_linear_pack_w(const float *w, int64_t n, int64_t k, int64_t kp, int bits, uint8_t *packed,
                      int32_t *exponent, uint8_t *finite, int nthreads)
{
    const struct pack_job c = {w, k, kp, n, bits, packed, 0, exponent, finite};
    bp_parallel_for(pack_w_span, &c, n, nthreads);
}

struct fused_job {
    const int8_t *xp;
    const uint8_t *wp;
    const int64_t *qsum;            /* per x row */
    int64_t m, n, k, ld, panels, block_rows;       /* ld: x's digit stride */
    int bits_w;
    const int32_t *ex, *ew;
    const uint8_t *x_finite, *w_finite;
    const float *x, *w, *bias;
    int offset;
    float *out;
};

/* T[r][d][col] = sum over pairs i + j = d of x digit i of row `row + r` times weight digit j of panel column col,
 * over all of k, for R rows. */
#define FUSED_TARGET __attribute__((target("avx512f,avx512dq,avx512vnni")))
/* acc += the unsigned bytes of w times the 4 signed bytes at p, broadcast to every lane (VPDPBUSD with an
 * embedded broadcast).  Written in asm: gcc 12 copies and spills the accumulators of the intrinsic. */
#define DPBUSD_BROADCAST(acc, w, p) \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(p)))

/* The four weight digits' products with x digit i of one row go to the accumulators of digit weights i .. i + 3. */
#define FUSED_DIGIT(A, B, C, D, p) \
    do { \
        DPBUSD_BROADCAST(A, w0, p); DPBUSD_BROADCAST(B, w1, p); \
        DPBUSD_BROADCAST(C, w2, p); DPBUSD_BROADCAST(D, w3, p); \
    } while (0)
/* All twenty pairs of one row: a0 .. a7 are its accumulators, p its digit 0 at this k-quad (digit i at p + i ld). */
#define FUSED_ROW(a, p) \
    do { \
        FUSED_DIGIT(a##0, a##1, a##2, a##3, (p)); \
        FUSED_DIGIT(a##1, a##2, a##3, a##4, (p) + ld); \
        FUSED_DIGIT(a##2, a##3, a##4, a##5, (p) + 2 * ld); \
        FUSED_DIGIT(a##3, a##4, a##5, a##6, (p) + 3 * ld); \
        FUSED_DIGIT(a##4, a##5, a##6, a##7, (p) + 4 * ld); \
    } while (0)
#define FUSED_ZERO(a) \
    __m512i a##0 = _mm512_setzero_si512(), a##1 = a##0, a##2 = a##0, a##3 = a##0, a##4 = a##0, a##5 = a##0, \
            a##6 = a##0, a##7 = a##0
/* t[r][d] += the int32 lanes of accumulator d, sign-extended to int64. */
#define FUSED_FLUSH(a, r) \
    do { \
        const __m512i flushed[FUSED_D] = {a##0, a##1, a##2, a##3, a##4, a##5, a##6, a##7}; \
        for (int d = 0; d < FUSED_D; d++) { \
            const __m512i low = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(flushed[d])); \
            const __m512i high = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(flushed[d], 1)); \
            _mm512_storeu_si512(&t[r][d][0], _mm512_add_epi64(_mm512_loadu_si512(&t[r][d][0]), low)); \
            _mm512_storeu_si512(&t[r][d][8], _mm512_add_epi64(_mm512_loadu_si512(&t[r][d][8]), high)); \
        } \
    } while (0)

/* T[r][d][col] = sum over pairs i + j = d of x digit i of row `row + r` times weight digit j of panel column col,
 * over all of k, for R (a constant after inlining: 1 .. FUSED_ROWS) rows.  The accumulators are named variables,
 * not an array, so that gcc keeps all 24 in registers. */
FUSED_TARGET ALWAYS_INLINE void fused_tile(const struct fused_job *c, int64_t row, int64_t panel, int R,
                                           int64_t t[FUSED_ROWS][FUSED_D][FUSED_COLS])
{
    const int64_t ld = c->ld, kq = (c->k + 3) / 4;
    const uint8_t *wp = c->wp + panel * kq * FUSED_SW * FUSED_COLS * 4;
    const int8_t *xp = c->xp + row * FUSED_SX * ld;
    for (int r = 0; r < R; r++)
        for (int d = 0; d < FUSED_D; d++)
            for (int l = 0; l < FUSED_COLS; l++)
                t[r][d][l] = 0;
    for (int64_t q0 = 0; q0 < kq; q0 += FUSED_CHUNK_Q) {
        const int64_t q1 = q0 + FUSED_CHUNK_Q < kq ? q0 + FUSED_CHUNK_Q : kq;
        FUSED_ZERO(a);
        FUSED_ZERO(b);
        FUSED_ZERO(e);
        for (int64_t q = q0; q < q1; q++) {
            const uint8_t *wq = wp + q * FUSED_SW * FUSED_COLS * 4;
            const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + 64);
            const __m512i w2 = _mm512_loadu_si512(wq + 128), w3 = _mm512_loadu_si512(wq + 192);
            const int8_t *x0 = xp + 4 * q;
            FUSED_ROW(a, x0);
            if (R > 1)
                FUSED_ROW(b, x0 + FUSED_SX * ld);
            if (R > 2)
                FUSED_ROW(e, x0 + 2 * FUSED_SX * ld);
        }
        FUSED_FLUSH(a, 0);
        if (R > 1)
            FUSED_FLUSH(b, 1);
        if (R > 2)
            FUSED_FLUSH(e, 2);
    }
}

/* One output from T (scalar, 128 bits): any k. */
ALWAYS_INLINE float fused_round_one(const struct fused_job *c, const int64_t t[FUSED_D][FUSED_COLS], int64_t l,
                                    int64_t m, int64_t col)
{
    i128 s = 0;
    for (int d = FUSED_D - 1; d >= 0; d--)
        s = s * 256 + t[d][l];
    s -= (i128)c->qsum[m] << (c->bits_w - 1);
    return round_scaled(s, c->ex[m] + c->ew[col] - c->offset);
}

/* Eight outputs of one row from T (lanes l0 .. l0 + 7), for |S| < 2^85 (k < 2^(48 - Bw): |S| <= k 2^38 2^(Bw-1)):
 * S = hi 2^32 + lo with lo in [0, 2^32) and |hi| < 2^53, so A = hi 2^32 and B = lo are exact binary64 values.
 * s = A + B rounded to nearest and its exact error e (TwoSum) give S rounded to odd at 53 bits: s itself where
 * e = 0 or s's last bit is 1, else s's neighbour towards e.  Rounding to odd at 53 >= 24 + 2 bits and then to
 * nearest at binary32's precision (subnormal grid and overflow included: vcvtpd2ps, round to nearest even) is
 * the correctly rounded binary32 of S 2^p; the scaling by 2^p between them is exact (|p| <= 364, |s| < 2^86: far
 * inside binary64's normal range).  So this is round_scaled's result, bit for bit. */
FUSED_TARGET ALWAYS_INLINE __m256 fused_round_eight(const struct fused_job *c, const int64_t t[FUSED_D][FUSED_COLS],
                                                     int l0, int64_t m, const int32_t *ew, __mmask8 *subnormal)
{
    __m512i lo = _mm512_loadu_si512(&t[0][l0]), hi = _mm512_loadu_si512(&t[4][l0]);
    for (int d = 1; d < 4; d++) {
        lo = _mm512_add_epi64(lo, _mm512_slli_epi64(_mm512_loadu_si512(&t[d][l0]), 8 * d));
        hi = _mm512_add_epi64(hi, _mm512_slli_epi64(_mm512_loadu_si512(&t[4 + d][l0]), 8 * d));
    }
    /* minus sum_k Qx 2^(Bw-1) = (qsum >> (32 - sh)) 2^32 + (qsum mod 2^(32 - sh)) 2^sh, sh = Bw - 1 < 32 */
    const int sh = c->bits_w - 1;
    const int64_t qsum = c->qsum[m];
    hi = _mm512_sub_epi64(hi, _mm512_set1_epi64(qsum >> (32 - sh)));
    lo = _mm512_sub_epi64(lo, _mm512_set1_epi64((qsum & (((int64_t)1 << (32 - sh)) - 1)) << sh));
    const __m512i carry = _mm512_srai_epi64(lo, 32);
    lo = _mm512_sub_epi64(lo, _mm512_slli_epi64(carry, 32));
    hi = _mm512_add_epi64(hi, carry);
    const __m512d a = _mm512_mul_pd(_mm512_cvtepi64_pd(hi), _mm512_set1_pd(4294967296.0));
    const __m512d b = _mm512_cvtepi64_pd(lo);
    const __m512d sum = _mm512_add_pd(a, b), bb = _mm512_sub_pd(sum, a);
    const __m512d err = _mm512_add_pd(_mm512_sub_pd(a, _mm512_sub_pd(sum, bb)), _mm512_sub_pd(b, bb));
    const __m512i bits = _mm512_castpd_si512(sum), err_bits = _mm512_castpd_si512(err);
    const __mmask8 inexact = _mm512_cmp_pd_mask(err, _mm512_setzero_pd(), _CMP_NEQ_UQ);
    const __mmask8 even = _mm512_testn_epi64_mask(bits, _mm512_set1_epi64(1));
    const __mmask8 away = _mm512_testn_epi64_mask(_mm512_xor_si512(bits, err_bits), _mm512_set1_epi64(INT64_MIN));
    __m512i odd = _mm512_mask_add_epi64(bits, inexact & even & away, bits, _mm512_set1_epi64(1));
    odd = _mm512_mask_sub_epi64(odd, inexact & even & (__mmask8)~away, bits, _mm512_set1_epi64(1));
    /* 2^p as a binary64 pattern, p = Ex + Ew - offset */
    const __m512i p = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i *)(ew + l0))),
                                       _mm512_set1_epi64(c->ex[m] - c->offset + 1023));
    const __m512d scaled = _mm512_mul_pd(_mm512_castsi512_pd(odd), _mm512_castsi512_pd(_mm512_slli_epi64(p, 52)));
    /* Results below 2^-126 (subnormal or zero) are left to round_scaled: under FTZ (torch.set_flush_denormal) the
     * conversion would write 0, while the integer rounding never depends on the FPU's modes. */
    *subnormal = _mm512_cmp_pd_mask(_mm512_abs_pd(scaled), _mm512_set1_pd(0x1p-126), _CMP_LT_OQ);
    return _mm512_cvt_roundpd_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

FUSED_TARGET static void fused_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct fused_job *c = ctx;
    const int vector = c->k < ((int64_t)1 << (48 - c->bits_w));
    int64_t t[FUSED_ROWS][FUSED_D][FUSED_COLS];
    for (int64_t item = begin; item < end; item++) {
        const int64_t panel = item % c->panels, first = (item / c->panels) * c->block_rows;
        const int64_t last = first + c->block_rows < c->m ? first + c->block_rows : c->m;
        const int64_t col0 = panel * FUSED_COLS, cols = c->n - col0 < FUSED_COLS ? c->n - col0 : FUSED_COLS;
        int32_t ew[FUSED_COLS] = {0};                       /* the panel's exponents, 0 past n */
        memcpy(ew, c->ew + col0, (size_t)cols * sizeof *ew);
        const __mmask16 stored = (__mmask16)((1u << cols) - 1);
        int panel_finite = 1;
        for (int64_t l = 0; l < cols; l++)
            panel_finite &= c->w_finite[col0 + l];
        for (int64_t row = first; row < last; row += FUSED_ROWS) {
            const int R = last - row < FUSED_ROWS ? (int)(last - row) : FUSED_ROWS;
            if (R == 3)
                fused_tile(c, row, panel, 3, t);
            else if (R == 2)
                fused_tile(c, row, panel, 2, t);
            else
                fused_tile(c, row, panel, 1, t);
            for (int r = 0; r < R; r++) {
                const int64_t m = row + r;
                float y[FUSED_COLS];
                __mmask8 low = 0xFF, high = 0xFF;                   /* lanes left to round_scaled */
                if (vector) {
                    const __m256 y0 = fused_round_eight(c, t[r], 0, m, ew, &low);
                    const __m256 y1 = fused_round_eight(c, t[r], 8, m, ew, &high);
                    if (panel_finite && c->x_finite[m] && !low && !high) {   /* y + bias, 16 at once */
                        __m512 y16 = _mm512_insertf32x8(_mm512_castps256_ps512(y0), y1, 1);
                        if (c->bias)
                            y16 = _mm512_add_ps(y16, _mm512_maskz_loadu_ps(stored, c->bias + col0));
                        _mm512_mask_storeu_ps(c->out + m * c->n + col0, stored, y16);
                        continue;
                    }
                    _mm256_storeu_ps(y, y0);
                    _mm256_storeu_ps(y + 8, y1);
                }
                const unsigned scalar = (unsigned)low | (unsigned)high << 8;
                for (int64_t l = 0; l < cols; l++)
                    if (scalar >> l & 1)
                        y[l] = fused_round_one(c, t[r], l, m, col0 + l);
                for (int64_t l = 0; l < cols; l++) {
                    const int64_t col = col0 + l;
                    if (!(c->x_finite[m] && c->w_finite[col]))
                        y[l] = nonfinite_pair(c->x + m * c->k, c->w + col * c->k, c->k);
                    c->out[m * c->n + col] = c->bias ? y[l] + c->bias[col] : y[l];
                }
            }
        }
    }
}

/* out [m, n] = spec 24.1's linear of x [m, k] (quantised here with bits_x <= 39 into scratch: one call, so that the
 * many small calls of a decode step pay one ctypes call and no tensor allocations) and bp_linear_pack_w's form of
 * the weight (bits_w: its B); x and w [n, k] are read for the digits and for pairs with a non-finite row.  Work
 * items: blocks of block_rows x rows (held in cache while the weight's panels stream past them) times panels.  Only
 * where bp_linear_vnni() holds.  Returns 0, or -1 if the scratch could not be allocated. */
int bp_linear_fused(const float *x, const uint8_t *wp, int64_t m, int64_t n, int64_t k, int64_t ld,
                    int64_t block_rows, int bits_x, int bits_w, const int32_t *ew, const uint8_t *w_finite,
                    const float *w, const float *bias, int offset, float *out, int nthreads)
{
    /* scratch: qsum int64 [m], exponent int32 [m], finite uint8 [m], then the digits int8 [m][5][ld] */
    char *scratch = malloc((size_t)m * (sizeof(int64_t) + sizeof(int32_t) + 1 + FUSED_SX * (size_t)ld));
    if (!scratch)
        return -1;
    int64_t *qsum = (int64_t *)scratch;
    int32_t *ex = (int32_t *)(qsum + m);
    uint8_t *x_finite = (uint8_t *)(ex + m);
    int8_t *xp = (int8_t *)(x_finite + m);
    const struct pack_job pack = {x, k, ld, m, bits_x, xp, qsum, ex, x_finite};
    bp_parallel_for(pack_x_span, &pack, m, nthreads);
    const int64_t panels = (n + FUSED_COLS - 1) / FUSED_COLS, blocks = (m + block_rows - 1) / block_rows;
    const struct fused_job c = {xp, wp, qsum, m, n, k, ld, panels, block_rows, bits_w, ex, ew, x_finite, w_finite,
                                x, w, bias, offset, out};
    bp_parallel_for(fused_span, &c, blocks * panels, nthreads);
    free(scratch);
    return 0;
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
