/* masked_mean (spec 15.1) and masked_whiten (spec 15.3) for the `cpu` backend,
 * and their backward (spec 26.7, 26.8).  canonical.h says why the bits cannot
 * depend on the build. */

#include "canonical.h"

int bp_masked_mean(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float *out, int nthreads)
{
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    int status = counts ? masked_mean_rows(x, mask, rows, n, out, counts, nthreads) : -1;
    free(counts);
    return status;
}

/* The masked mean's backward (spec 26.7): dx = select(m, g * R, +0.0), R the forward's
 * count_reciprocal of each row's exact count.  The counts are taken over (row, segment) items, and
 * the per-row weight g * R is formed once, then written by one select pass. */
struct weight_pass {
    const uint8_t *mask;
    const float *weight;     /* [rows] */
    int64_t n;
    float *out;
};

static void weight_span(const void *ctx, int64_t r, int64_t start, int64_t end)
{
    const struct weight_pass *c = ctx;
    const uint8_t *mr = c->mask + r * c->n;
    float *orow = c->out + r * c->n;
    float w = c->weight[r];
    for (int64_t i = start; i < end; i++)
        orow[i] = counted(mr, i, w);
}

int bp_masked_mean_backward(const uint8_t *mask, const float *g, int64_t rows, int64_t n, float *out,
                            int nthreads)
{
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    float *weight = malloc(sizeof(float) * (size_t)rows);
    int status = counts && weight ? masked_row_sums(TERM_MASKED_X, NULL, NULL, mask, rows, n, NULL, NULL, counts,
                                                    nthreads)
                                  : -1;
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++)
            weight[r] = g[r] * count_reciprocal(counts[r]);
        const struct weight_pass c = {mask, weight, n, out};
        run_row_segments(weight_span, &c, rows, n, nthreads);
    }
    free(counts);
    free(weight);
    return status;
}

/* Whitening's statistics of each row of x [rows, n] (spec 15.3), which the forward and the backward
 * share: mean (the masked mean), the exact count, rk = reciprocal(max(n - 1, 1)) (max(n, 1) when
 * biased), ss = canonical sum of (mask ? (x - mean)^2 : -0.0), var = ss * rk, and
 * inv = rsqrt(var + eps) (eps_clamp = 0: eps_mode "add") or rsqrt(max_prop(var, eps)) (eps_clamp = 1:
 * "clamp", a NaN-propagating max that keeps eps when var == eps, as numpy's maximum does); args[r]
 * carries mean[r] to the _DEV sums. */
struct whiten_stats {
    float *mean, *rk, *var, *inv;
    int64_t *counts;
    struct term_args *args;
};

static void whiten_free(struct whiten_stats *w)
{
    free(w->mean);
    free(w->counts);
    free(w->args);
}

static int whiten_stats(const float *x, const uint8_t *mask, int64_t rows, int64_t n, int unbiased, float eps,
                        int eps_clamp, struct whiten_stats *w, int nthreads)
{
    w->mean = malloc(sizeof(float) * (size_t)(4 * rows));
    w->counts = malloc(sizeof(int64_t) * (size_t)rows);
    w->args = malloc(sizeof(struct term_args) * (size_t)rows);
    if (!w->mean || !w->counts || !w->args)
        return -1;
    w->rk = w->mean + rows;
    w->var = w->rk + rows;              /* each row's sum of squares, then ss * rk */
    w->inv = w->var + rows;
    if (masked_mean_rows(x, mask, rows, n, w->mean, w->counts, nthreads) != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        w->args[r] = (struct term_args){0.0f, 0.0f, 0.0f, 0.0f, w->mean[r]};
    if (masked_row_sums(TERM_SQ_DEV, x, NULL, mask, rows, n, w->args, w->var, NULL, nthreads) != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t divisor = unbiased ? w->counts[r] - 1 : w->counts[r];
        w->rk[r] = canonical_reciprocal((float)(divisor > 1 ? divisor : 1));
        w->var[r] = w->var[r] * w->rk[r];
        w->inv[r] = canonical_rsqrt(eps_clamp ? max_prop(w->var[r], eps) : w->var[r] + eps);
    }
    return 0;
}

/* One (row, segment) span of whitening's forward or backward output. */
struct whiten_pass {
    const float *x, *g;       /* g NULL: the forward */
    const uint8_t *mask;
    const float *mean, *inv, *g_bar, *c;
    int64_t n;
    int shift_mean;
    float *out;
};

/* Forward:  out = (x - mean) * inv, + mean when !shift_mean; 0 where not counted.
 * Backward (spec 26.8): d = x - mean, z = d * inv (the forward's output before the mask),
 *   dx = ((g - gbar) - z * c) * inv, + gbar when !shift_mean; +0.0 where not counted. */
static void whiten_span(const void *ctx, int64_t r, int64_t start, int64_t end)
{
    const struct whiten_pass *p = ctx;
    const float *xr = p->x + r * p->n;
    const uint8_t *mr = p->mask + r * p->n;
    float *orow = p->out + r * p->n;
    float m = p->mean[r], k = p->inv[r];
    if (p->g == NULL) {
        for (int64_t i = start; i < end; i++) {
            float o = (xr[i] - m) * k;
            o = p->shift_mean ? o : o + m;
            orow[i] = counted(mr, i, o);
        }
        return;
    }
    const float *gr = p->g + r * p->n;
    float gb = p->g_bar[r], c = p->c[r];
    for (int64_t i = start; i < end; i++) {
        float z = (xr[i] - m) * k;
        float o = ((gr[i] - gb) - z * c) * k;
        o = p->shift_mean ? o : o + gb;
        orow[i] = counted(mr, i, o);
    }
}

/* Whitening of each row of x [rows, n] (spec 15.3), the output pass over (row, segment) items. */
int bp_masked_whiten(const float *x, const uint8_t *mask, int64_t rows, int64_t n, int shift_mean,
                     int unbiased, float eps, int eps_clamp, float *out, int nthreads)
{
    struct whiten_stats w;
    int status = whiten_stats(x, mask, rows, n, unbiased, eps, eps_clamp, &w, nthreads);
    if (status == 0) {
        const struct whiten_pass p = {x, NULL, mask, w.mean, w.inv, NULL, NULL, n, shift_mean, out};
        run_row_segments(whiten_span, &p, rows, n, nthreads);
    }
    whiten_free(&w);
    return status;
}

/* Whitening's backward (spec 26.8), g [rows, n]: the forward's statistics, then
 *   gbar = masked mean of g; gd = canonical sum of (mask ? g * (x - mean) : -0.0); c = (gd * rk) * inv,
 * and with eps_clamp (eps_mode "clamp") c = select(var < eps, +0.0, c): where the variance is held at
 * eps it does not depend on x.  Each sum over (row, segment) items, then one output pass. */
int bp_masked_whiten_backward(const float *x, const uint8_t *mask, const float *g, int64_t rows, int64_t n,
                              int shift_mean, int unbiased, float eps, int eps_clamp, float *out, int nthreads)
{
    struct whiten_stats w;
    float *g_bar = malloc(sizeof(float) * (size_t)(2 * rows));   /* g_bar [rows], then gd -> c [rows] */
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    int status = whiten_stats(x, mask, rows, n, unbiased, eps, eps_clamp, &w, nthreads);
    if (status == 0 && (!g_bar || !counts))
        status = -1;
    if (status == 0)
        status = masked_mean_rows(g, mask, rows, n, g_bar, counts, nthreads);
    float *c = g_bar ? g_bar + rows : NULL;
    if (status == 0)
        status = masked_row_sums(TERM_MASKED_Y_DEV, x, g, mask, rows, n, w.args, c, NULL, nthreads);
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++) {
            c[r] = (c[r] * w.rk[r]) * w.inv[r];
            c[r] = eps_clamp && w.var[r] < eps ? 0.0f : c[r];
        }
        const struct whiten_pass p = {x, g, mask, w.mean, w.inv, g_bar, c, n, shift_mean, out};
        run_row_segments(whiten_span, &p, rows, n, nthreads);
    }
    whiten_free(&w);
    free(g_bar);
    free(counts);
    return status;
}
