/* rotary (spec 24.3) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* rotary (spec 24.3) of each row of x [rows, d], with the row's cos_t and sin_t [rows, d/2]:
 * out_i = x_i * cos_i - x_{i+h} * sin_i, out_{i+h} = x_{i+h} * cos_i + x_i * sin_i, h = d/2. */
void bp_rotary(const float *x, const float *cos_t, const float *sin_t, int64_t rows, int64_t d, float *out,
               int nthreads)
{
    int64_t h = d / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *cr = cos_t + r * h, *sr = sin_t + r * h;
        float *orow = out + r * d;
        for (int64_t i = 0; i < h; i++) {
            orow[i] = xr[i] * cr[i] - xr[i + h] * sr[i];
            orow[i + h] = xr[i + h] * cr[i] + xr[i] * sr[i];
        }
    }
}
