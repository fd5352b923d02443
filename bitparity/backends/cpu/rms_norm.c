/* rms_norm (spec 24.2) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* rms_norm (spec 24.2) of each row of x [rows, d]:
 *   ms = canonical sum of x_i * x_i, times reciprocal(d); r = rsqrt(ms + eps); out_i = (x_i * r) * weight_i.
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_rms_norm(const float *x, const float *weight, int64_t rows, int64_t d, float eps, float *out,
                int nthreads)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
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
            float ms = row_sum(TERM_SQUARE, xr, NULL, NULL, d, &none, lanes, lanes + BP_LANES) * inv_d;
            float rs = canonical_rsqrt(ms + eps);
            for (int64_t i = 0; i < d; i++)
                orow[i] = (xr[i] * rs) * weight[i];
        }
        free(lanes);
    }
    return failed ? -1 : 0;
}
