/* silu_mul (spec 24.5) for the `cpu` backend, and its backward (spec 29.5).
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* The sigmoid of silu_mul (spec 24.5), which the backward recomputes: e = exp(-|g|),
 * r = reciprocal(1 + e) (1 + e in [1, 2]), g >= 0 ? r : e * r. */
ALWAYS_INLINE float silu_sigmoid(float g)
{
    float e = canonical_exp(-abs_f32(g));
    float r = canonical_reciprocal(1.0f + e);
    return g >= 0.0f ? r : e * r;
}

/* silu_mul (spec 24.5), element-wise: out = (g * sigmoid) * up. */
void bp_silu_mul(const float *gate, const float *up, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (g * silu_sigmoid(g)) * up[i];
    }
}

struct silu_mul_backward_job {
    const float *gate, *up, *g;
    float *d_gate, *d_up;
};

/* Elements [begin, end) of silu_mul's backward (spec 29.5), with upstream g and the forward's sigmoid s:
 * d_up = g * (gate * s);  d_gate = (g * up) * (s * (1 + gate * (1 - s))). */
static void silu_mul_backward_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct silu_mul_backward_job c = *(const struct silu_mul_backward_job *)ctx;   /* no store can change it */
    for (int64_t i = begin; i < end; i++) {
        float x = c.gate[i], g = c.g[i];
        float s = silu_sigmoid(x);
        c.d_up[i] = g * (x * s);
        c.d_gate[i] = (g * c.up[i]) * (s * (1.0f + x * (1.0f - s)));
    }
}

/* silu_mul's backward over gate, up, g [n]: independent elements, split over threads. */
void bp_silu_mul_backward(const float *gate, const float *up, const float *g, int64_t n, float *d_gate,
                          float *d_up, int nthreads)
{
    const struct silu_mul_backward_job c = {gate, up, g, d_gate, d_up};
    bp_parallel_for(silu_mul_backward_span, &c, n, nthreads);
}
