/* sum (spec 3) for the `cpu` backend: the canonical sum of each masked row.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* Row r of sum (run_rows' row function): the canonical sum of mask ? x : -0.0. */
static void sum_row(const struct row_args *a, int64_t r, const struct scratch *sc)
{
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t n = a->n;
    const float *xr = a->x + r * n;
    /* two inlined copies, so each inner loop is compiled knowing whether a mask exists */
    if (a->mask)
        a->out[r] = row_sum(TERM_MASKED_X, xr, NULL, a->mask + r * n, n, &none, sc->lanes, sc->seg_rest);
    else
        a->out[r] = row_sum(TERM_MASKED_X, xr, NULL, NULL, n, &none, sc->lanes, sc->seg_rest);
}

int bp_sum(const float *x, const uint8_t *mask, int64_t rows, int64_t n, float *out, int nthreads)
{
    const struct row_args a = {.x = x, .mask = mask, .n = n, .out = out};
    return run_rows(sum_row, &a, rows, nthreads);
}
