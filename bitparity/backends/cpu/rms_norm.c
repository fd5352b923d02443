/* rms_norm (spec 24.2) for the `cpu` backend, and its backward (spec 29.3).
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* rsqrt(ms + eps) of one row xr [d], ms = the canonical sum of x_i * x_i times inv_d = reciprocal(d): the
 * forward's r, which the backward recomputes.  lanes: BP_LANES + next_pow2(segments) floats. */
ALWAYS_INLINE float rms_inverse(const float *xr, int64_t d, float inv_d, float eps, float *lanes)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float ms = row_sum(TERM_SQUARE, xr, NULL, NULL, d, &none, lanes, lanes + BP_LANES) * inv_d;
    return canonical_rsqrt(ms + eps);
}

/* rms_norm (spec 24.2) of each row of x [rows, d]:
 *   ms = canonical sum of x_i * x_i, times reciprocal(d); r = rsqrt(ms + eps); out_i = (x_i * r) * weight_i.
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_rms_norm(const float *x, const float *weight, int64_t rows, int64_t d, float eps, float *out,
                int nthreads)
{
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
            float rs = rms_inverse(xr, d, inv_d, eps, lanes);
            for (int64_t i = 0; i < d; i++)
                orow[i] = (xr[i] * rs) * weight[i];
        }
        free(lanes);
    }
    return failed ? -1 : 0;
}

struct rms_norm_backward_job {
    const float *x, *weight, *g;
    int64_t d;
    float eps, inv_d;
    float *dx, *terms;
};

/* A member of rms_norm_backward's job: its lanes, then the rows it claims.  Per row, with the forward's r
 * and n_i = x_i * r:  u_i = g_i * weight_i;  a = canonical sum of u_i * n_i, times reciprocal(d);
 * dx_i = (u_i - n_i * a) * r;  terms_i = g_i * n_i.  The products u_i * n_i are written to dx's row first,
 * summed from there, then overwritten. */
static int rms_norm_backward_member(const void *ctx, struct bp_job *job)
{
    const struct rms_norm_backward_job *c = ctx;
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t d = c->d;
    float *lanes = malloc(sizeof(float) * (size_t)(BP_LANES + next_pow2((d + BP_SEGMENT - 1) / BP_SEGMENT)));
    if (lanes == NULL)
        return -1;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t r = begin; r < end; r++) {
            const float *xr = c->x + r * d, *gr = c->g + r * d, *w = c->weight;
            float *dxr = c->dx + r * d, *tr = c->terms + r * d;
            float rs = rms_inverse(xr, d, c->inv_d, c->eps, lanes);
            for (int64_t i = 0; i < d; i++)
                dxr[i] = (gr[i] * w[i]) * (xr[i] * rs);
            float a = row_sum(TERM_MASKED_X, dxr, NULL, NULL, d, &none, lanes, lanes + BP_LANES) * c->inv_d;
            for (int64_t i = 0; i < d; i++) {
                float n = xr[i] * rs;
                dxr[i] = (gr[i] * w[i] - n * a) * rs;
                tr[i] = gr[i] * n;
            }
        }
    free(lanes);
    return 0;
}

/* rms_norm's backward (spec 29.3), g [rows, d] -> dx and terms [rows, d] (the weight's gradient is the row
 * fold of terms, made by the caller); rows split over threads.  Returns 0, or -1 if scratch could not be
 * allocated. */
int bp_rms_norm_backward(const float *x, const float *weight, const float *g, int64_t rows, int64_t d, float eps,
                         float *dx, float *terms, int nthreads)
{
    const struct rms_norm_backward_job c = {x, weight, g, d, eps, canonical_reciprocal((float)d), dx, terms};
    return bp_parallel(rms_norm_backward_member, &c, rows, nthreads);
}
