/* masked_mean (spec 15.1) and masked_whiten (spec 15.3) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

int bp_masked_mean(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float *out, int nthreads)
{
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    int status = counts ? masked_mean_rows(x, mask, rows, n, out, counts, nthreads) : -1;
    free(counts);
    return status;
}

/* Whitening of each row of x [rows, n] (spec 15.3):
 *   mean = masked mean; ss = canonical sum of (mask ? (x - mean)^2 : -0.0)
 *   var = ss * reciprocal(max(n - 1, 1))   (max(n, 1) when biased)
 *   out = (x - mean) * rsqrt(var + eps), + mean when !shift_mean; 0 where not counted.
 * The output pass runs over (row, segment) items like the sums. */
int bp_masked_whiten(const float *x, const uint8_t *mask, int64_t rows, int64_t n, int shift_mean,
                     int unbiased, float eps, float *out, int nthreads)
{
    float *mean = malloc(sizeof(float) * (size_t)rows);
    float *inv = malloc(sizeof(float) * (size_t)rows);      /* each row's sum of squares, then rsqrt(var + eps) */
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)rows);
    struct term_args *args = malloc(sizeof(struct term_args) * (size_t)rows);
    int status = mean && inv && counts && args ? 0 : -1;
    if (status == 0)
        status = masked_mean_rows(x, mask, rows, n, mean, counts, nthreads);
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++)
            args[r] = (struct term_args){0.0f, 0.0f, 0.0f, 0.0f, mean[r]};
        status = masked_row_sums(TERM_SQ_DEV, x, mask, rows, n, args, inv, NULL, nthreads);
    }
    if (status == 0) {
        for (int64_t r = 0; r < rows; r++) {
            int64_t divisor = unbiased ? counts[r] - 1 : counts[r];
            float var = inv[r] * canonical_reciprocal((float)(divisor > 1 ? divisor : 1));
            inv[r] = canonical_rsqrt(var + eps);
        }
        int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t item = 0; item < rows * g; item++) {
            int64_t r = item / g, s = (item % g) * BP_SEGMENT;
            int64_t end = n - s < BP_SEGMENT ? n : s + BP_SEGMENT;
            const float *xr = x + r * n;
            const uint8_t *mr = mask + r * n;
            float *orow = out + r * n;
            float m = mean[r], k = inv[r];
            for (int64_t i = s; i < end; i++) {
                float o = (xr[i] - m) * k;
                o = shift_mean ? o : o + m;
                orow[i] = mr[i] ? o : 0.0f;
            }
        }
    }
    free(mean);
    free(inv);
    free(counts);
    free(args);
    return status;
}
