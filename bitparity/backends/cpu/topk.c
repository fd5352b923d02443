/* topk (spec 21) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "selection.h"

/* topk of row r (spec 21) into values and indices [r, 0:k]: tau = the k-th
 * largest key; the keys above tau (fewer than k) and the first k keys equal to
 * it, by position, are ranked (value descending, position ascending) and the
 * first k taken.  Values are copied, bits unchanged. */
static void topk_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    const float *xr = a->x + r * n;
    int64_t k = a->k;
    for (int64_t i = 0; i < n; i++)
        sc->keys[i] = order_key(xr[i]);
    uint32_t tau = kth_largest_key(sc->keys, n, k, sc->buf, sc->hist);
    int64_t nr = 0, ties = 0;
    for (int64_t i = 0; i < n; i++) {
        if (sc->keys[i] > tau || (sc->keys[i] == tau && ties++ < k))
            sc->ranks[nr++] = rank_of(sc->keys[i], i);
    }
    qsort(sc->ranks, (size_t)nr, sizeof *sc->ranks, compare_u64);
    for (int64_t j = 0; j < k; j++) {
        int64_t i = rank_position(sc->ranks[j]);
        a->values[r * k + j] = xr[i];
        a->indices[r * k + j] = i;
    }
}

/* topk of each row of x [rows, n] into values f32[rows, k], indices i64[rows, k]. */
int bp_topk(const float *x, int64_t rows, int64_t n, int64_t k, float *values, int64_t *indices, int nthreads)
{
    const struct select_args a = {.x = x, .k = k, .values = values, .indices = indices};
    return select_rows(topk_row, &a, rows, n, nthreads);
}
