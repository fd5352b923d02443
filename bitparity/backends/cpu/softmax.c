/* The softmax family (spec 8) for the `cpu` backend: logsumexp, log_softmax,
 * softmax, entropy and token_logprobs, each from softmax_stats.
 * canonical.h says why the bits cannot depend on the build. */

#include "softmax_stats.h"

enum op { OP_LOGSUMEXP, OP_LOG_SOFTMAX, OP_SOFTMAX, OP_ENTROPY, OP_TOKEN_LOGPROBS };

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
    }
}

/* Row r of a->op (run_rows' row function). */
static void softmax_row(const struct row_args *a, int64_t r, const struct scratch *sc)
{
    int64_t n = a->n;
    const float *xr = a->x + r * n;
    int64_t token = a->tokens ? a->tokens[r] : 0;
    float *orow = a->op == OP_LOG_SOFTMAX || a->op == OP_SOFTMAX ? a->out + r * n : NULL;
    /* two inlined copies, so each inner loop is compiled knowing whether a mask exists */
    if (a->mask)
        row_op(a->op, xr, a->mask + r * n, n, a->scale, token, orow, a->out + r, sc);
    else
        row_op(a->op, xr, NULL, n, a->scale, token, orow, a->out + r, sc);
}

/* op over the rows of x [rows, n] (mask u8[rows, n], tokens i64[rows] or NULL) into out. */
static int softmax_rows(enum op op, const float *x, const uint8_t *mask, const int64_t *tokens, int64_t rows,
                        int64_t n, float scale, float *out, int nthreads)
{
    const struct row_args a = {x, mask, tokens, n, scale, op, out};
    return run_rows(softmax_row, &a, rows, nthreads);
}

int bp_logsumexp(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                        float *out, int nthreads)
{
    return softmax_rows(OP_LOGSUMEXP, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_log_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                          float *out, int nthreads)
{
    return softmax_rows(OP_LOG_SOFTMAX, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_softmax(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                      float *out, int nthreads)
{
    return softmax_rows(OP_SOFTMAX, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_entropy(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float scale,
                      float *out, int nthreads)
{
    return softmax_rows(OP_ENTROPY, x, mask, NULL, rows, n, scale, out, nthreads);
}

int bp_token_logprobs(const float *x, const int64_t *tokens, int64_t rows, int64_t n,
                             float scale, float *out, int nthreads)
{
    return softmax_rows(OP_TOKEN_LOGPROBS, x, NULL, tokens, rows, n, scale, out, nthreads);
}
