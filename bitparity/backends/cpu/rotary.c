/* rotary (spec 24.3) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* rotary (spec 24.3) of each row of x [rows, d], with the row's cos_t and sin_t [rows, d/2]:
 * out_i = x_i * cos_i - x_{i+h} * sin_i, out_{i+h} = x_{i+h} * cos_i + x_i * sin_i, h = d/2. */
struct rotary_job {
    const float *x, *cos_t, *sin_t;
    int64_t d;
    float *out;
};

/* The rows [begin, end). */
static void rotary_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct rotary_job *c = ctx;
    const float *x = c->x, *cos_t = c->cos_t, *sin_t = c->sin_t;
    float *out = c->out;
    int64_t d = c->d, h = d / 2;
    for (int64_t r = begin; r < end; r++) {
        const float *xr = x + r * d, *cr = cos_t + r * h, *sr = sin_t + r * h;
        float *orow = out + r * d;
        for (int64_t i = 0; i < h; i++) {
            orow[i] = xr[i] * cr[i] - xr[i + h] * sr[i];
            orow[i + h] = xr[i + h] * cr[i] + xr[i] * sr[i];
        }
    }
}

void bp_rotary(const float *x, const float *cos_t, const float *sin_t, int64_t rows, int64_t d, float *out,
               int nthreads)
{
    const struct rotary_job c = {x, cos_t, sin_t, d, out};
    bp_parallel_for(rotary_span, &c, rows, nthreads);
}
