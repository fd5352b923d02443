/* silu_mul (spec 24.5) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

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
