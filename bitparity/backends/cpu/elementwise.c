/* Element-wise exp (spec 5) and log (spec 6) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

struct elementwise {
    const float *x;
    float *out;
};

static void exp_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct elementwise *c = ctx;
    const float *x = c->x;
    float *out = c->out;
    for (int64_t i = begin; i < end; i++)
        out[i] = canonical_exp(x[i]);
}

static void log_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct elementwise *c = ctx;
    const float *x = c->x;
    float *out = c->out;
    for (int64_t i = begin; i < end; i++)
        out[i] = canonical_log(x[i]);
}

/* Element-wise exp and log of x[0:n]: independent elements, split over threads. */
void bp_exp(const float *x, int64_t n, float *out, int nthreads)
{
    const struct elementwise c = {x, out};
    bp_parallel_for(exp_span, &c, n, nthreads);
}

void bp_log(const float *x, int64_t n, float *out, int nthreads)
{
    const struct elementwise c = {x, out};
    bp_parallel_for(log_span, &c, n, nthreads);
}
