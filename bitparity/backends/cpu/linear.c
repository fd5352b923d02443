/* linear (spec 24.1) for the `cpu` backend, and its weight's gradient (spec 29.2; its input's gradient is
 * linear itself, of g by the transposed weight).  canonical.h says why the bits cannot depend on the build. */

#include "dot_panels.h"
#include "row_fold.h"

/* linear's kernel: a tile of TILE_ROWS rows of x by one panel's PANEL outputs, each output its own canonical
 * sum, held in registers as one PANEL-wide vector per row (gcc's vector extension: element-wise IEEE ops,
 * uncontracted under -ffp-contract=off, split into narrower registers on narrower ISAs).  Instead of the
 * halving tree's level order the tree is evaluated depth first, which needs log2(W) + 1 live vectors per
 * row instead of W: the tree over lanes base + stride * t, t < w, is
 *   T(base, stride, w) = T(base, 2 stride, w/2) + T(base + stride, 2 stride, w/2)
 * (its last level, h = 1, adds the sum of the even positions to the sum of the odd ones; each of those is
 * the same tree over half the lanes).  A subtree whose lanes all lie past the data is -0.0, so its add is
 * the identity and is skipped.  A lane (leaf) is its chunk accumulation: the terms j, j + LANES, ... of
 * the segment in sequence, the first one exact (-0.0 + p = p). */
#define TILE_ROWS 4
#define TILE_TREE_LEAVES 64

/* aligned(4): scratch comes from malloc, which guarantees less than the vector's own 64 bytes */
typedef float panel_vec __attribute__((vector_size(PANEL * sizeof(float)), aligned(4)));

struct tile {
    panel_vec row[TILE_ROWS];
};

/* One segment of the tile's sums: x[r] + s (r < rows) and panel + s * PANEL, len terms. */
struct tile_segment {
    const float *x[TILE_ROWS];
    const float *panel;
    int64_t len;
};

ALWAYS_INLINE panel_vec load_panel_vec(const float *p)
{
    panel_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Lane j of rows [0:rows): the products of terms j, j + LANES, ... (< len) accumulated in sequence. */
ALWAYS_INLINE struct tile tile_lane(const struct tile_segment *s, int rows, int64_t j)
{
    struct tile t = {{{0}}};   /* rows past `rows` are never read; zero keeps them defined */
    panel_vec wj = load_panel_vec(s->panel + j * PANEL);
    for (int r = 0; r < rows; r++)
        t.row[r] = s->x[r][j] * wj;
    for (int64_t c = j + BP_LANES; c < s->len; c += BP_LANES) {
        panel_vec wc = load_panel_vec(s->panel + c * PANEL);
        for (int r = 0; r < rows; r++)
            t.row[r] = t.row[r] + s->x[r][c] * wc;
    }
    return t;
}

#define TILE_TREE_1(s, rows, base, stride) tile_lane(s, rows, base)

/* T(base, stride, w) for w = 2 * half, as above; defined for w = 2, 4, ..., TILE_TREE_LEAVES. */
#define DEFINE_TILE_TREE(w, half)                                                                             \
    ALWAYS_INLINE struct tile tile_tree_##w(const struct tile_segment *s, int rows, int64_t base, int64_t stride) \
    {                                                                                                         \
        struct tile even = TILE_TREE_##half(s, rows, base, 2 * stride);                                      \
        if (base + stride >= s->len)                                                                          \
            return even;                                                                                      \
        struct tile odd = TILE_TREE_##half(s, rows, base + stride, 2 * stride);                              \
        for (int r = 0; r < rows; r++)                                                                        \
            even.row[r] = even.row[r] + odd.row[r];                                                           \
        return even;                                                                                          \
    }
DEFINE_TILE_TREE(2, 1)
#define TILE_TREE_2 tile_tree_2
DEFINE_TILE_TREE(4, 2)
#define TILE_TREE_4 tile_tree_4
DEFINE_TILE_TREE(8, 4)
#define TILE_TREE_8 tile_tree_8
DEFINE_TILE_TREE(16, 8)
#define TILE_TREE_16 tile_tree_16
DEFINE_TILE_TREE(32, 16)
#define TILE_TREE_32 tile_tree_32
DEFINE_TILE_TREE(64, 32)

/* Depth-first subtrees of a segment of len terms: W / 64 for W = lane_width(len) > 64, else 1. */
static int64_t tile_subtrees(int64_t len)
{
    int64_t w = lane_width(len);
    return w > TILE_TREE_LEAVES ? w / TILE_TREE_LEAVES : 1;
}

/* Floats of scratch linear_tile needs for sums of k terms: the subtrees of one segment, then the segment
 * partials, each a tile. */
static int64_t tile_scratch_size(int64_t k)
{
    return (tile_subtrees(k) + next_pow2((k + BP_SEGMENT - 1) / BP_SEGMENT)) * TILE_ROWS * PANEL;
}

/* The tile's row r, column c: dot(x[r], panel column c), for r < rows.  Per segment of len terms the tree
 * over W = lane_width(len) lanes (the segment's LANES lanes give the same bits, spec 3.2) is the halving
 * tree over its top W / 64 subtrees (lanes b + (W / 64) t), each computed depth first in registers
 * (W <= 64: one subtree over 64 lanes, the top ones empty); then the partial tree over segments.
 * scratch: tile_scratch_size(k) floats. */
ALWAYS_INLINE struct tile linear_tile(const float *const *x, int rows, const float *panel, int64_t k,
                                      float *scratch)
{
    struct tile *top = (struct tile *)scratch;
    struct tile *partials = top + tile_subtrees(k);
    int64_t g = 0;
    for (int64_t s0 = 0; s0 < k; s0 += BP_SEGMENT, g++) {
        struct tile_segment seg = {.panel = panel + s0 * PANEL, .len = k - s0 < BP_SEGMENT ? k - s0 : BP_SEGMENT};
        int64_t subtrees = tile_subtrees(seg.len);
        for (int r = 0; r < rows; r++)
            seg.x[r] = x[r] + s0;
        for (int64_t b = 0; b < subtrees; b++)
            top[b] = tile_tree_64(&seg, rows, b, subtrees);
        halving_tree_cols((float *)top, subtrees, TILE_ROWS * PANEL);
        partials[g] = top[0];
    }
    combine_partials_cols((float *)partials, g, TILE_ROWS * PANEL);
    return partials[0];
}

struct linear_job {
    const float *x, *weight, *bias;
    int64_t m, k, n, blocks;
    float *packed, *out;
};

/* The weight's panels [begin, end), packed. */
static void pack_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct linear_job *c = ctx;
    for (int64_t p = begin; p < end; p++)
        pack_panel(c->weight, c->k, c->n, p * PANEL, c->k, 1, c->packed + p * c->k * PANEL);
}

/* A member of linear's job: its own scratch, then the (panel, block) items it claims. */
static int linear_member(const void *ctx, struct bp_job *job)
{
    const struct linear_job *c = ctx;
    int64_t m = c->m, k = c->k, n = c->n, blocks = c->blocks;
    float *scratch = malloc(sizeof(float) * (size_t)tile_scratch_size(k));
    if (scratch == NULL)
        return -1;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t item = begin; item < end; item++) {
            int64_t p = item / blocks, r0 = item % blocks * TILE_ROWS, c0 = p * PANEL;
            int rows = m - r0 < TILE_ROWS ? (int)(m - r0) : TILE_ROWS;
            const float *xr[TILE_ROWS];
            for (int r = 0; r < rows; r++)
                xr[r] = c->x + (r0 + r) * k;
            const float *panel = c->packed + p * k * PANEL;
            struct tile y;
            if (rows == TILE_ROWS)
                y = linear_tile(xr, TILE_ROWS, panel, k, scratch);
            else
                for (int r = 0; r < rows; r++)
                    y.row[r] = linear_tile(xr + r, 1, panel, k, scratch).row[0];
            for (int r = 0; r < rows; r++) {
                float *orow = c->out + (r0 + r) * n + c0;
                for (int64_t col = 0; col < PANEL && c0 + col < n; col++)
                    orow[col] = c->bias ? y.row[r][col] + c->bias[c0 + col] : y.row[r][col];
            }
        }
    free(scratch);
    return 0;
}

/* linear (spec 24.1): out [m, n] = the canonical dots of x [m, k] with weight [n, k] (+ bias [n], one
 * add; no + 0.0).  The weight is packed once into panels of PANEL outputs; (panel, block of TILE_ROWS rows)
 * items are split over threads, rows inner, so a thread reuses its panel from cache.  The last block's
 * rows past m are computed one at a time.  Returns 0, or -1 if scratch could not be allocated. */
int bp_linear(const float *x, const float *weight, const float *bias, int64_t m, int64_t k, int64_t n,
              float *out, int nthreads)
{
    int64_t panels = (n + PANEL - 1) / PANEL, blocks = (m + TILE_ROWS - 1) / TILE_ROWS;
    float *packed = malloc(sizeof(float) * (size_t)(panels * k * PANEL));
    if (packed == NULL)
        return -1;
    const struct linear_job c = {x, weight, bias, m, k, n, blocks, packed, out};
    bp_parallel_for(pack_span, &c, panels, nthreads);
    int status = bp_parallel(linear_member, &c, panels * blocks, nthreads);
    free(packed);
    return status;
}

struct weight_grad_job {
    const float *x, *g;
    int64_t m, k, n, panels, depth;
    const uint8_t *adds;            /* the fold's schedule (row_fold.h) */
    float *x_packed, *g_packed;     /* [panel][m][PANEL]: x's columns, g's outputs */
    float *out;
};

/* Panels [begin, end) of x's columns, then of g's outputs. */
static void weight_grad_pack_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct weight_grad_job *c = ctx;
    int64_t m = c->m, x_panels = c->panels;
    for (int64_t p = begin; p < end; p++) {
        if (p < x_panels)
            pack_panel(c->x, m, c->k, p * PANEL, 1, c->k, c->x_packed + p * m * PANEL);
        else
            pack_panel(c->g, m, c->n, (p - x_panels) * PANEL, 1, c->n, c->g_packed + (p - x_panels) * m * PANEL);
    }
}

/* A member of weight_grad's job: its stack of tiles, then the (output block, column panel) items it claims:
 * TILE_ROWS outputs o by PANEL columns c, the schedule replayed over the m rows, row i's leaf holding
 * g[i][o] * x[i][c] (one PANEL-wide vector of x's row by one g each). */
static int weight_grad_member(const void *ctx, struct bp_job *job)
{
    const struct weight_grad_job *c = ctx;
    int64_t m = c->m, k = c->k, n = c->n, panels = c->panels;
    struct tile *stack = malloc(sizeof(struct tile) * (size_t)c->depth);
    if (stack == NULL)
        return -1;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t item = begin; item < end; item++) {
            int64_t o0 = item / panels * TILE_ROWS, c0 = item % panels * PANEL;
            const float *xp = c->x_packed + c0 * m;
            const float *gp = c->g_packed + o0 / PANEL * m * PANEL + o0 % PANEL;
            int64_t top = 0;
            for (int64_t i = 0; i < m; i++) {
                for (int a = 0; a < c->adds[i]; a++, top--)
                    fold_add((float *)stack, top, TILE_ROWS * PANEL);
                panel_vec xi = load_panel_vec(xp + i * PANEL);
                for (int r = 0; r < TILE_ROWS; r++)
                    stack[top].row[r] = gp[i * PANEL + r] * xi;
                top++;
            }
            for (; top > 1; top--)
                fold_add((float *)stack, top, TILE_ROWS * PANEL);
            for (int r = 0; r < TILE_ROWS && o0 + r < n; r++)
                for (int64_t col = 0; col < PANEL && c0 + col < k; col++)
                    c->out[(o0 + r) * k + c0 + col] = m > 0 ? stack[0].row[r][col] : NEG_ZERO;
        }
    free(stack);
    return 0;
}

/* weight_grad (spec 29.1, 29.2): x [m, k], g [m, n], positions [m] strictly increasing in [0, rows) ->
 * out [n, k], out[o][c] = the row fold over the rows at positions[i] of g[i][o] * x[i][c], each product
 * rounded once.  The fold's schedule (row_fold.h) is made once from the positions, x and g are packed into
 * panels ([m][PANEL], zeros past k and n), and tiles of TILE_ROWS outputs by PANEL columns are split over
 * threads, each replaying the schedule with a stack of tiles.  No [m, n, k] product is formed: the work is a
 * GEMM's, plus the fold's one add per product.  Products of the zeros past k and n are dropped.  Returns 0,
 * or -1 if scratch could not be allocated. */
int bp_weight_grad(const float *x, const float *g, const int64_t *positions, int64_t m, int64_t k, int64_t n,
                   int64_t rows, float *out, int nthreads)
{
    int64_t x_panels = (k + PANEL - 1) / PANEL, g_panels = (n + PANEL - 1) / PANEL;
    uint8_t *adds = malloc((size_t)m + 1);
    float *packed = malloc(sizeof(float) * (size_t)((x_panels + g_panels) * m * PANEL + 1));
    int status = -1;
    if (adds != NULL && packed != NULL) {
        fold_schedule(positions, m, adds);
        const struct weight_grad_job c = {x, g, m, k, n, x_panels, fold_depth(rows), adds, packed,
                                          packed + x_panels * m * PANEL, out};
        bp_parallel_for(weight_grad_pack_span, &c, x_panels + g_panels, nthreads);
        status = bp_parallel(weight_grad_member, &c, (n + TILE_ROWS - 1) / TILE_ROWS * x_panels, nthreads);
    }
    free(adds);
    free(packed);
    return status;
}
