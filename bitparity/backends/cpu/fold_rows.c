/* fold_rows (spec 29.1) for the `cpu` backend: per segment, the row fold of
 * the rows that belong to it (the embedding's gradient, one segment per token
 * id; one segment for a parameter's gradient over all rows).  row_fold.h holds
 * the fold's order; canonical.h says why the bits cannot depend on the build. */

#include "row_fold.h"

/* Columns of one work item: a thread's stack, fold_depth(rows) entries of this many floats, stays in cache. */
#define FOLD_COLS 256

struct leaf {
    int64_t pos, row;
};

static int by_position(const void *a, const void *b)
{
    int64_t pa = ((const struct leaf *)a)->pos, pb = ((const struct leaf *)b)->pos;
    return (pa > pb) - (pa < pb);
}

struct fold_job {
    const float *c;
    int64_t f, blocks, depth;
    const int64_t *start;       /* [n_segments + 1]: segment s's leaves are leaves[start[s] : start[s + 1]] */
    struct leaf *leaves;
    int64_t *pos;               /* the leaves' positions, in their order */
    uint8_t *adds;              /* the leaves' schedule (row_fold.h) */
    float *out;
};

/* The segments [begin, end): each one's leaves sorted by position (where they are not in order already),
 * then its schedule. */
static void schedule_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct fold_job *c = ctx;
    for (int64_t s = begin; s < end; s++) {
        int64_t first = c->start[s], count = c->start[s + 1] - first;
        int sorted = 1;
        for (int64_t i = first + 1; i < first + count; i++)
            sorted = sorted && c->leaves[i - 1].pos < c->leaves[i].pos;
        if (!sorted)
            qsort(c->leaves + first, (size_t)count, sizeof(struct leaf), by_position);
        for (int64_t i = first; i < first + count; i++)
            c->pos[i] = c->leaves[i].pos;
        fold_schedule(c->pos + first, count, c->adds + first);
    }
}

/* A member of the fold's job: its stack, then the (segment, column block) items it claims, each the
 * segment's schedule replayed on its columns (-0.0 for a segment with no leaf). */
static int fold_member(const void *ctx, struct bp_job *job)
{
    const struct fold_job *c = ctx;
    float *stack = malloc(sizeof(float) * (size_t)(c->depth * FOLD_COLS));
    if (stack == NULL)
        return -1;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t item = begin; item < end; item++) {
            int64_t s = item / c->blocks, c0 = item % c->blocks * FOLD_COLS;
            int64_t cols = c->f - c0 < FOLD_COLS ? c->f - c0 : FOLD_COLS;
            float *orow = c->out + s * c->f + c0;
            if (c->start[s] == c->start[s + 1]) {
                for (int64_t k = 0; k < cols; k++)
                    orow[k] = NEG_ZERO;
                continue;
            }
            int64_t top = 0;
            for (int64_t i = c->start[s]; i < c->start[s + 1]; i++) {
                for (int a = 0; a < c->adds[i]; a++, top--)
                    fold_add(stack, top, cols);
                memcpy(stack + top * cols, c->c + c->leaves[i].row * c->f + c0, sizeof(float) * (size_t)cols);
                top++;
            }
            for (; top > 1; top--)
                fold_add(stack, top, cols);
            memcpy(orow, stack, sizeof(float) * (size_t)cols);
        }
    free(stack);
    return 0;
}

/* fold_rows: c [m, f], segments [m] in [0, n_segments), positions [m] in [0, rows) (distinct within a
 * segment, any order) -> out [n_segments, f]: per segment, the row fold of rows leaves holding c[i] at
 * positions[i] and -0.0 elsewhere; -0.0 for a segment with no row.  The rows are grouped by segment (a
 * counting sort, stable), then segments are split over threads to sort their leaves by position and make
 * their schedules (row_fold.h), then (segment, block of FOLD_COLS columns) items to replay them.  Returns
 * 0, or -1 if scratch could not be allocated. */
int bp_fold_rows(const float *c, const int64_t *segments, const int64_t *positions, int64_t m, int64_t f,
                 int64_t rows, int64_t n_segments, float *out, int nthreads)
{
    int64_t *start = calloc((size_t)(n_segments + 1), sizeof(int64_t));
    struct leaf *leaves = malloc(sizeof(struct leaf) * (size_t)m);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)m);
    uint8_t *adds = malloc((size_t)m);
    int status = -1;
    if (start != NULL && (m == 0 || (leaves != NULL && pos != NULL && adds != NULL))) {
        for (int64_t i = 0; i < m; i++)
            start[segments[i] + 1]++;
        for (int64_t s = 0; s < n_segments; s++)
            start[s + 1] += start[s];
        for (int64_t i = 0; i < m; i++)              /* start[s] advances to segment s's end */
            leaves[start[segments[i]]++] = (struct leaf){positions[i], i};
        for (int64_t s = n_segments; s > 0; s--)
            start[s] = start[s - 1];
        start[0] = 0;
        int64_t blocks = (f + FOLD_COLS - 1) / FOLD_COLS;
        const struct fold_job job = {c, f, blocks, fold_depth(rows), start, leaves, pos, adds, out};
        bp_parallel_for(schedule_span, &job, n_segments, nthreads);
        status = bp_parallel(fold_member, &job, n_segments * blocks, nthreads);
    }
    free(start);
    free(leaves);
    free(pos);
    free(adds);
    return status;
}
