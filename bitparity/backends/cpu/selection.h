/* Selection by value (spec 21) for the `cpu` backend: the order keys, the
 * k-th largest key and the ranks that topk.c and sampling.c both select by,
 * and the per-thread scratch and row loop of those ops.  See canonical.h for
 * why the bits cannot depend on the build. */

#ifndef BP_CPU_SELECTION_H
#define BP_CPU_SELECTION_H

#include "canonical.h"

/* -- Selection (spec 21) ----------------------------------------------------- */

/* A uint32 whose unsigned order is spec 21's order of values: numerically,
 * -0.0 == +0.0 (made +0.0 by the add), NaN (0) below -inf (0x007FFFFF). */
ALWAYS_INLINE uint32_t order_key(float v)
{
    uint32_t b = bits_of(v + 0.0f);
    uint32_t k = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);    /* negative: ~b; else b | sign */
    return v != v ? 0u : k;
}

/* Radix digits of a key, most significant first: 11, 11 and 10 bits. */
#define DIGIT_BINS 2048
static const int digit_shift[3] = {21, 10, 0};

/* The k-th largest of keys[0:size] counting repeats (1 <= k <= size), fixing
 * one radix digit at a time.  hist: scratch of DIGIT_BINS. */
static inline uint32_t radix_kth_largest(const uint32_t *keys, int64_t size, int64_t k, int64_t *hist)
{
    uint32_t prefix = 0, fixed = 0;
    for (int level = 0; level < 3; level++) {
        int s = digit_shift[level];
        uint32_t digits = (level == 2 ? 0x3FFu : 0x7FFu);
        memset(hist, 0, sizeof(int64_t) * DIGIT_BINS);
        for (int64_t i = 0; i < size; i++)
            if ((keys[i] & fixed) == prefix)
                hist[(keys[i] >> s) & digits]++;
        uint32_t d = digits;
        while (k > hist[d]) {
            k -= hist[d];
            d--;
        }
        prefix |= d << s;
        fixed |= digits << s;
    }
    return prefix;
}

/* Keys scanned per step of kth_largest_key: one vectorised test, then (rarely) a copy. */
#define SELECT_BLOCK 64

/* Size of kth_largest_key's buffer for k. */
static inline int64_t select_buffer_size(int64_t k) { return 2 * k + 1024 + SELECT_BLOCK; }

/* The k-th largest of keys[0:n] counting repeats (1 <= k <= n): what top-k
 * keeps is every key >= it (spec 21).  Threshold filter: t is a key with at
 * least k keys >= t among those seen, so no key <= t can change the answer;
 * buf holds every seen key > t.  A block of keys is copied only when one of
 * them exceeds t; when buf is full, t becomes the k-th largest of buf and buf
 * keeps the (fewer than k) keys above it.  At the end the answer is the k-th
 * largest of buf if buf holds k keys, else t.  t starts at 0, the least key,
 * and all n >= k keys are >= 0.  buf: select_buffer_size(k) keys.  Kept out
 * of line, as gcc kept it when topk and sampling were one file: inlined into
 * topk_row, its one caller in topk.c, the scan ran ~8% slower.  (unused: no
 * warning in a file that does not call it.) */
static __attribute__((noinline, unused)) uint32_t kth_largest_key(const uint32_t *keys, int64_t n, int64_t k,
                                                                  uint32_t *buf, int64_t *hist)
{
    int64_t cap = select_buffer_size(k), size = 0;
    uint32_t t = 0;
    for (int64_t s = 0; s < n; s += SELECT_BLOCK) {
        int64_t len = n - s < SELECT_BLOCK ? n - s : SELECT_BLOCK;
        int above = 0;
        for (int64_t i = s; i < s + len; i++)
            above |= keys[i] > t;
        if (!above)
            continue;
        if (size + SELECT_BLOCK > cap) {
            t = radix_kth_largest(buf, size, k, hist);
            int64_t kept = 0;
            for (int64_t i = 0; i < size; i++)
                if (buf[i] > t)
                    buf[kept++] = buf[i];
            size = kept;
        }
        for (int64_t i = s; i < s + len; i++)
            if (keys[i] > t)
                buf[size++] = keys[i];
    }
    return size >= k ? radix_kth_largest(buf, size, k, hist) : t;
}

/* A position and its key as one uint64 whose ascending order is spec 21's
 * selection order: value descending, then position ascending (positions < 2^32). */
ALWAYS_INLINE uint64_t rank_of(uint32_t key, int64_t i) { return ((uint64_t)~key << 32) | (uint64_t)i; }
ALWAYS_INLINE int64_t rank_position(uint64_t r) { return (int64_t)(r & 0xFFFFFFFFu); }

static inline int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* -- Selection scratch ------------------------------------------------------ */

/* Sizes of the top-p mass tree (sampling.c), which the scratch holds. */

/* Nodes of one segment's tree: LANES lanes, then the levels of the halving tree. */
#define SEGMENT_NODES (2 * BP_LANES - 1)

/* The canonical sum (spec 3) of a row of n terms, kept with every node of its
 * trees, so that changing the terms of one lane costs that lane and its paths:
 * per segment the lanes and the levels of its halving tree, then the partials
 * and the levels of theirs (tree_build's layout).  Positions without a term
 * hold -0.0, the exact identity, so a lane accumulating only the positions
 * that have a term, in increasing order, has the dense lane loop's bits, and so
 * does every node above it, the root included (spec 3.2). */
struct mass_tree {
    float *node;
    int64_t n, g, gp;      /* row length, segments, partial leaves next_pow2(g) */
};

static inline int64_t mass_tree_size(int64_t n)
{
    int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
    return g * SEGMENT_NODES + 2 * next_pow2(g) - 1;
}

/* Buckets of kept mass by d = shift - w: MASS_PER_UNIT per unit of d below
 * MASS_RANGE, then one for the rest (mass_bucket is monotone in w). */
#define MASS_PER_UNIT 32
#define MASS_RANGE 104
#define MASS_BUCKETS (MASS_PER_UNIT * MASS_RANGE + 1)

/* Per-thread scratch of the selection and sampling ops, for rows of n values. */
struct select_scratch {
    float *lanes;        /* 2 LANES: row_max */
    float *f, *e;        /* n each: the filtered row (sample), e_i = exp(w_i - shift) */
    uint32_t *keys;      /* n */
    uint32_t *buf;       /* select_buffer_size(n) */
    int64_t *cand;       /* n: kept positions, ascending */
    uint64_t *ranks;     /* 2n: ranks to sort (topk: at most 2k; top-p: the searched positions) */
    int64_t *hist;       /* DIGIT_BINS */
    float *tree;         /* mass_tree nodes */
    double *mass;        /* MASS_BUCKETS */
};

static inline void select_scratch_free(struct select_scratch *sc)
{
    free(sc->lanes);
    free(sc->f);
    free(sc->e);
    free(sc->keys);
    free(sc->buf);
    free(sc->cand);
    free(sc->ranks);
    free(sc->hist);
    free(sc->tree);
    free(sc->mass);
    *sc = (struct select_scratch){0};
}

/* Scratch for rows of n values; returns 0, or 1 (everything freed) if an allocation failed. */
static inline int select_scratch_alloc(struct select_scratch *sc, int64_t n)
{
    sc->lanes = malloc(sizeof(float) * 2 * BP_LANES);
    sc->f = malloc(sizeof(float) * (size_t)n);
    sc->e = malloc(sizeof(float) * (size_t)n);
    sc->keys = malloc(sizeof(uint32_t) * (size_t)n);
    sc->buf = malloc(sizeof(uint32_t) * (size_t)select_buffer_size(n));
    sc->cand = malloc(sizeof(int64_t) * (size_t)n);
    sc->ranks = malloc(sizeof(uint64_t) * (size_t)(2 * n));
    sc->hist = malloc(sizeof(int64_t) * DIGIT_BINS);
    sc->tree = malloc(sizeof(float) * (size_t)mass_tree_size(n));
    sc->mass = malloc(sizeof(double) * MASS_BUCKETS);
    if (sc->lanes && sc->f && sc->e && sc->keys && sc->buf && sc->cand && sc->ranks && sc->hist && sc->tree
        && sc->mass)
        return 0;
    select_scratch_free(sc);
    return 1;
}

/* The arguments of the selection row ops; each op reads its own. */
struct select_args {
    const float *x;
    int64_t k;                                   /* topk */
    float *values;
    int64_t *indices;
    const float *scale, *top_p, *min_p;          /* filter_logits, sample: one per row */
    const int64_t *top_k;
    float *out;                                  /* filter_logits */
    const uint8_t *greedy;                       /* sample */
    const int64_t *seeds, *positions;
    int64_t *tokens;
};

/* Row r of a selection op, with its thread's scratch. */
typedef void select_row_fn(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc);

struct select_job {
    select_row_fn *row;
    const struct select_args *a;
    int64_t n;
};

/* A member of select_rows' job: its own scratch, then the rows it claims. */
static inline int select_member(const void *ctx, struct bp_job *job)
{
    const struct select_job *c = ctx;
    struct select_scratch sc;
    if (select_scratch_alloc(&sc, c->n) != 0)
        return -1;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t r = begin; r < end; r++)
            c->row(c->a, r, c->n, &sc);
    select_scratch_free(&sc);
    return 0;
}

/* Runs row over rows on bp_parallel's threads: a thread computes whole rows
 * with its own scratch, so no bit depends on which thread or how many.
 * Returns 0, or -1 if scratch could not be allocated. */
static inline int select_rows(select_row_fn *row, const struct select_args *a, int64_t rows, int64_t n,
                              int nthreads)
{
    const struct select_job c = {row, a, n};
    return bp_parallel(select_member, &c, rows, nthreads);
}

#endif /* BP_CPU_SELECTION_H */
