/* Element-wise exp (spec 5) and log (spec 6) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* Element-wise exp and log of x[0:n]: independent elements, split over threads. */
void bp_exp(const float *x, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++)
        out[i] = canonical_exp(x[i]);
}

void bp_log(const float *x, int64_t n, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; i++)
        out[i] = canonical_log(x[i]);
}
