/* The softmax family (spec 8) for the `cpu` backend: logsumexp, log_softmax,
 * softmax, entropy and token_logprobs, each from softmax_stats, and their
 * backward (spec 26.2-26.6).  Every op takes one scale per row, f32[rows]
 * (spec 8.1: w = x * scale[r]).  canonical.h says why the bits cannot depend
 * on the build. */

#include "softmax_stats.h"

/* run_rows' arguments (their scalar scale unused) and the per-row scales.  rows is
 * the first member, so the pointer run_rows hands back to softmax_row is this struct's. */
struct softmax_args {
    struct row_args rows;
    const float *scale;
};

enum op {
    OP_LOGSUMEXP, OP_LOG_SOFTMAX, OP_SOFTMAX, OP_ENTROPY, OP_TOKEN_LOGPROBS,
    /* the backward of each, in the same order */
    OP_LOGSUMEXP_BACKWARD, OP_LOG_SOFTMAX_BACKWARD, OP_SOFTMAX_BACKWARD, OP_ENTROPY_BACKWARD,
    OP_TOKEN_LOGPROBS_BACKWARD,
};

/* One row of op.  xr, mr: the row's n values and mask (NULL: none); orow: its
 * n outputs (log_softmax, softmax); *oval: its one output (the reductions). */
ALWAYS_INLINE void row_op(enum op op, const float *xr, const uint8_t *mr, int64_t n, float scale,
                          int64_t token, float *orow, float *oval, const struct scratch *sc)
{
    struct stats st = softmax_stats(xr, mr, n, scale, sc);
    switch (op) {
    case OP_LOGSUMEXP:
        *oval = st.shift + st.log_total;
        break;
    case OP_LOG_SOFTMAX:
        /* (w - shift) - log_total, or -inf for every entry where the total is 0 */
        for (int64_t i = 0; i < n; i++)
            orow[i] = log_prob(scaled(xr, mr, i, scale), st);
        break;
    case OP_SOFTMAX:
        for (int64_t i = 0; i < n; i++)
            orow[i] = canonical_exp(scaled(xr, mr, i, scale) - st.shift) * st.recip;
        break;
    case OP_ENTROPY: {
        /* canonical sum of p_i * (log S - (w_i - shift)), zero-probability terms -0.0, then + 0.0 */
        const struct term_args a = {scale, st.shift, st.recip, st.log_total, 0.0f};
        *oval = row_sum(TERM_ENTROPY, xr, NULL, mr, n, &a, sc->lanes, sc->seg_rest) + 0.0f;
        break;
    }
    case OP_TOKEN_LOGPROBS:
        /* log_softmax's entry at the token, without writing the row */
        *oval = log_prob(xr[token] * scale, st);
        break;
    default:
        break;
    }
}

/* One row of the backward of op (spec 26), into its n gradients orow.  xr, mr: the row's n values
 * (x, or the forward's output y or p) and mask (NULL: none); gr: the row's upstream gradient (n values
 * for log_softmax and softmax, else one); h: the forward's entropy.  Every loop is one pass of
 * element-wise selects over the row after its statistics, so it vectorises with exp inlined:
 *  - logsumexp:      statistics, then dx = select(m, (g * P) * scale, +0.0), P = exp(log_prob);
 *  - log_softmax:    G = canonical sum of select(m, g, -0.0), then dx = select(m, (g - exp(y) * G) * scale, +0.0);
 *  - softmax:        G = canonical sum of select(m, g * p, -0.0), then dx = select(m, (p * (g - G)) * scale, +0.0);
 *  - entropy:        statistics, then dx = select(m, select(e == 0, +0.0, ((q * (a - H)) * g) * scale), +0.0);
 *  - token_logprobs: statistics, then dx = (+0.0 - P * g) * scale, and at the token (g - P * g) * scale.
 * The statistics are softmax_stats' (the forward's bits, recomputed from the same x); the log family's
 * P is exp of the forward's log-probability, bit for bit (spec 26.1). */
ALWAYS_INLINE void row_backward(enum op op, const float *xr, const uint8_t *mr, int64_t n, float scale,
                                int64_t token, const float *gr, float h, float *orow, const struct scratch *sc)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    switch (op) {
    case OP_LOGSUMEXP_BACKWARD: {
        struct stats st = softmax_stats(xr, mr, n, scale, sc);
        float g = gr[0];
        for (int64_t i = 0; i < n; i++)
            orow[i] = counted(mr, i, (g * canonical_exp(log_prob(scaled(xr, mr, i, scale), st))) * scale);
        break;
    }
    case OP_LOG_SOFTMAX_BACKWARD: {
        float big_g = row_sum(TERM_MASKED_X, gr, NULL, mr, n, &none, sc->lanes, sc->seg_rest);
        for (int64_t i = 0; i < n; i++)
            orow[i] = counted(mr, i, (gr[i] - canonical_exp(xr[i]) * big_g) * scale);
        break;
    }
    case OP_SOFTMAX_BACKWARD: {
        float big_g = row_sum(TERM_MASKED_YX, xr, gr, mr, n, &none, sc->lanes, sc->seg_rest);
        for (int64_t i = 0; i < n; i++)
            orow[i] = counted(mr, i, (xr[i] * (gr[i] - big_g)) * scale);
        break;
    }
    case OP_ENTROPY_BACKWARD: {
        /* A masked entry has e = 0 already, except in a row whose shift is NaN: counted keeps it +0.0. */
        struct stats st = softmax_stats(xr, mr, n, scale, sc);
        float g = gr[0];
        for (int64_t i = 0; i < n; i++) {
            struct entropy_parts p = entropy_parts(scaled(xr, mr, i, scale), st.shift, st.recip, st.log_total);
            float v = ((p.q * (p.a - h)) * g) * scale;
            orow[i] = counted(mr, i, p.e == 0.0f ? 0.0f : v);
        }
        break;
    }
    case OP_TOKEN_LOGPROBS_BACKWARD: {
        /* select(i == t, g, +0.0) - P * g: the loop writes every entry as i != t, then the token's
         * entry is rewritten, which keeps the compare out of the vector loop. */
        struct stats st = softmax_stats(xr, NULL, n, scale, sc);
        float g = gr[0];
        for (int64_t i = 0; i < n; i++)
            orow[i] = (0.0f - canonical_exp(log_prob(xr[i] * scale, st)) * g) * scale;
        orow[token] = (g - canonical_exp(log_prob(xr[token] * scale, st)) * g) * scale;
        break;
    }
    default:
        break;
    }
}

/* Row r of a->op (run_rows' row function), with its own scale. */
static void softmax_row(const struct row_args *a, int64_t r, const struct scratch *sc)
{
    float scale = ((const struct softmax_args *)a)->scale[r];
    int64_t n = a->n;
    const float *xr = a->x + r * n;
    const uint8_t *mr = a->mask ? a->mask + r * n : NULL;
    int64_t token = a->tokens ? a->tokens[r] : 0;
    if (a->op >= OP_LOGSUMEXP_BACKWARD) {
        int per_entry = a->op == OP_LOG_SOFTMAX_BACKWARD || a->op == OP_SOFTMAX_BACKWARD;
        const float *gr = a->g + (per_entry ? r * n : r);
        float h = a->h ? a->h[r] : 0.0f;
        /* two inlined copies, so each inner loop is compiled knowing whether a mask exists */
        if (mr)
            row_backward(a->op, xr, mr, n, scale, token, gr, h, a->out + r * n, sc);
        else
            row_backward(a->op, xr, NULL, n, scale, token, gr, h, a->out + r * n, sc);
        return;
    }
    float *orow = a->op == OP_LOG_SOFTMAX || a->op == OP_SOFTMAX ? a->out + r * n : NULL;
    if (mr)
        row_op(a->op, xr, mr, n, scale, token, orow, a->out + r, sc);
    else
        row_op(a->op, xr, NULL, n, scale, token, orow, a->out + r, sc);
}

/* op over the rows of x [rows, n] (mask u8[rows, n], tokens i64[rows], g, h or NULL), row r scaled by
 * scale[r], into out. */
static int softmax_rows(enum op op, const float *x, const uint8_t *mask, const int64_t *tokens, const float *g,
                        const float *h, int64_t rows, int64_t n, const float *scale, float *out, int nthreads)
{
    const struct softmax_args a = {
        .rows = {.x = x, .mask = mask, .tokens = tokens, .n = n, .op = op, .out = out, .g = g, .h = h},
        .scale = scale,
    };
    return run_rows(softmax_row, &a.rows, rows, nthreads);
}

int bp_logsumexp(const float *x, const uint8_t *mask, int64_t rows, int64_t n, const float *scale,
                        float *out, int nthreads)
{
    return softmax_rows(OP_LOGSUMEXP, x, mask, NULL, NULL, NULL, rows, n, scale, out, nthreads);
}

int bp_log_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, const float *scale,
                          float *out, int nthreads)
{
    return softmax_rows(OP_LOG_SOFTMAX, x, mask, NULL, NULL, NULL, rows, n, scale, out, nthreads);
}

int bp_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, const float *scale,
                      float *out, int nthreads)
{
    return softmax_rows(OP_SOFTMAX, x, mask, NULL, NULL, NULL, rows, n, scale, out, nthreads);
}

int bp_entropy(const float *x, const uint8_t *mask, int64_t rows, int64_t n, const float *scale,
                      float *out, int nthreads)
{
    return softmax_rows(OP_ENTROPY, x, mask, NULL, NULL, NULL, rows, n, scale, out, nthreads);
}

int bp_token_logprobs(const float *x, const int64_t *tokens, int64_t rows, int64_t n,
                             const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_TOKEN_LOGPROBS, x, NULL, tokens, NULL, NULL, rows, n, scale, out, nthreads);
}

/* -- Backward (spec 26.2-26.6): out [rows, n], the gradient of x ------------------------------ */

/* x, mask [rows, n]; g [rows]. */
int bp_logsumexp_backward(const float *x, const uint8_t *mask, const float *g, int64_t rows, int64_t n,
                          const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_LOGSUMEXP_BACKWARD, x, mask, NULL, g, NULL, rows, n, scale, out, nthreads);
}

/* y: the forward's output, mask, g [rows, n]. */
int bp_log_softmax_backward(const float *y, const uint8_t *mask, const float *g, int64_t rows, int64_t n,
                            const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_LOG_SOFTMAX_BACKWARD, y, mask, NULL, g, NULL, rows, n, scale, out, nthreads);
}

/* p: the forward's output, mask, g [rows, n]. */
int bp_softmax_backward(const float *p, const uint8_t *mask, const float *g, int64_t rows, int64_t n,
                        const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_SOFTMAX_BACKWARD, p, mask, NULL, g, NULL, rows, n, scale, out, nthreads);
}

/* x, mask [rows, n]; h: the forward's output, g [rows]. */
int bp_entropy_backward(const float *x, const uint8_t *mask, const float *h, const float *g, int64_t rows,
                        int64_t n, const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_ENTROPY_BACKWARD, x, mask, NULL, g, h, rows, n, scale, out, nthreads);
}

/* x [rows, n]; tokens, g [rows]. */
int bp_token_logprobs_backward(const float *x, const int64_t *tokens, const float *g, int64_t rows, int64_t n,
                               const float *scale, float *out, int nthreads)
{
    return softmax_rows(OP_TOKEN_LOGPROBS_BACKWARD, x, NULL, tokens, g, NULL, rows, n, scale, out, nthreads);
}
