/* Counter-based random numbers (spec 19, 20), filter_logits (spec 21) and
 * sample (spec 22) for the `cpu` backend: philox, the race noise, min-p,
 * top-k and top-p, the race.
 * canonical.h says why the bits cannot depend on the build. */

#include "selection.h"

/* -- Counter-based random numbers (spec 19, 20) ------------------------------ */

/* Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1), in
 * place.  Each round: (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2),
 * hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)), then the key is bumped by (W0, W1); the
 * 32 x 32-bit products are exact in uint64_t, the key sums wrap modulo 2^32. */
ALWAYS_INLINE void philox(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < BP_PHILOX_ROUNDS; r++) {
        uint64_t p0 = (uint64_t)BP_PHILOX_M0 * *c0;
        uint64_t p1 = (uint64_t)BP_PHILOX_M1 * *c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ *c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ *c3 ^ k1;
        *c0 = n0;
        *c1 = (uint32_t)p1;
        *c2 = n2;
        *c3 = (uint32_t)p0;
        k0 += BP_PHILOX_W0;
        k1 += BP_PHILOX_W1;
    }
}

struct philox_job {
    const int64_t *counters, *keys;
    int64_t *out;
};

/* The counters [begin, end). */
static void philox_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct philox_job *c = ctx;
    for (int64_t i = begin; i < end; i++) {
        uint32_t c0 = (uint32_t)c->counters[4 * i], c1 = (uint32_t)c->counters[4 * i + 1];
        uint32_t c2 = (uint32_t)c->counters[4 * i + 2], c3 = (uint32_t)c->counters[4 * i + 3];
        philox(&c0, &c1, &c2, &c3, (uint32_t)c->keys[2 * i], (uint32_t)c->keys[2 * i + 1]);
        c->out[4 * i] = c0;
        c->out[4 * i + 1] = c1;
        c->out[4 * i + 2] = c2;
        c->out[4 * i + 3] = c3;
    }
}

/* counters u32[n, 4] and keys u32[n, 2], held in int64 -> out int64[n, 4]. */
void bp_philox(const int64_t *counters, const int64_t *keys, int64_t n, int64_t *out, int nthreads)
{
    const struct philox_job c = {counters, keys, out};
    bp_parallel_for(philox_span, &c, n, nthreads);
}

/* The Exp(1) variate E made from the words (a, b) (spec 20):
 * V = (a >> 8) * 2^-24 where that is >= 2^-8, else with the 23 bits b >> 9
 * below it; E = -log(1 - V), or its series V + V^2/2 + V^3/3 for small V. */
ALWAYS_INLINE float exponential(uint32_t a, uint32_t b)
{
    int32_t ha = (int32_t)(a >> 8), hb = (int32_t)(b >> 9);
    float coarse_v = (float)ha * float_of(BP_TWO_M24_BITS);              /* exact */
    int coarse = ha >= BP_UNIFORM_COARSE_MIN;
    float v = coarse ? coarse_v : coarse_v + (float)(2 * hb + 1) * float_of(BP_TWO_M48_BITS);
    float big = -canonical_log(1.0f - v);
    float s = v * float_of(BP_THIRD_BITS);
    s = s + float_of(BP_HALF_BITS);
    s = (v * v) * s;
    float small = v + s;
    return coarse ? big : small;
}

/* Tokens whose noise one noise_block call computes (even, a few vectors wide). */
#define NOISE_BLOCK 32

/* The noise of tokens i0 .. i0 + NOISE_BLOCK - 1 (i0 even) of the stream
 * (seed, position) (spec 19) into noise[]: token i0 + 2m at noise[m] from words
 * (0, 1), token i0 + 2m + 1 at noise[NOISE_BLOCK / 2 + m] from words (2, 3) of
 * philox(i >> 1, position lo, hi, SAMPLE_STREAM; seed lo, hi).  Tokens past a
 * row's end are computed too and never read.  Three loops, so that each
 * vectorises: the words, the variates E, their logs. */
static void noise_block(uint64_t seed, uint64_t position, int64_t i0, float *noise)
{
    uint32_t a[NOISE_BLOCK], b[NOISE_BLOCK];
    for (int m = 0; m < NOISE_BLOCK / 2; m++) {
        uint32_t c0 = (uint32_t)(i0 / 2 + m), c1 = (uint32_t)position, c2 = (uint32_t)(position >> 32);
        uint32_t c3 = BP_SAMPLE_STREAM;
        philox(&c0, &c1, &c2, &c3, (uint32_t)seed, (uint32_t)(seed >> 32));
        a[m] = c0;
        b[m] = c1;
        a[NOISE_BLOCK / 2 + m] = c2;
        b[NOISE_BLOCK / 2 + m] = c3;
    }
    for (int m = 0; m < NOISE_BLOCK; m++)
        noise[m] = exponential(a[m], b[m]);
    for (int m = 0; m < NOISE_BLOCK; m++)
        noise[m] = canonical_log(noise[m]);
}

/* -- Top-p mass (spec 21) ---------------------------------------------------- */

/* The mass tree: struct mass_tree, SEGMENT_NODES and the MASS_ bucket counts are in selection.h. */

/* The halving tree over the leaves node[0:w] (w a power of two) with every
 * level kept: level h (h nodes) at node[2w - 2h], node[2w - 2] the root. */
static void tree_build(float *node, int64_t w)
{
    for (int64_t h = w / 2; h >= 1; h /= 2) {
        const float *below = node + 2 * w - 4 * h;
        float *level = node + 2 * w - 2 * h;
        for (int64_t i = 0; i < h; i++)
            level[i] = below[i] + below[i + h];
    }
}

/* tree_build's nodes above leaf `leaf`, recomputed after that leaf changed. */
static void tree_path(float *node, int64_t w, int64_t leaf)
{
    for (int64_t h = w / 2; h >= 1; h /= 2) {
        const float *below = node + 2 * w - 4 * h;
        float *level = node + 2 * w - 2 * h;
        int64_t i = leaf & (h - 1);
        level[i] = below[i] + below[i + h];
    }
}

static float *tree_partials(const struct mass_tree *t) { return t->node + t->g * SEGMENT_NODES; }

static float mass_tree_root(const struct mass_tree *t) { return tree_partials(t)[2 * t->gp - 2]; }

/* The tree of the terms e[p] at the positions p of cand[0:nc] (ascending) with f[p] > v. */
static void mass_tree_fill(const struct mass_tree *t, const float *f, const float *e, const int64_t *cand,
                           int64_t nc, float v)
{
    for (int64_t s = 0; s < t->g; s++)
        for (int64_t j = 0; j < BP_LANES; j++)
            t->node[s * SEGMENT_NODES + j] = NEG_ZERO;
    for (int64_t c = 0; c < nc; c++) {
        int64_t p = cand[c];
        float *lane = &t->node[p / BP_SEGMENT * SEGMENT_NODES + p % BP_LANES];
        if (f[p] > v)
            *lane = *lane + e[p];
    }
    float *partials = tree_partials(t);
    for (int64_t s = 0; s < t->gp; s++) {
        if (s < t->g) {
            tree_build(t->node + s * SEGMENT_NODES, BP_LANES);
            partials[s] = t->node[s * SEGMENT_NODES + 2 * BP_LANES - 2];
        } else {
            partials[s] = NEG_ZERO;
        }
    }
    tree_build(partials, t->gp);
}

/* The lane of position p recomputed over the terms e[q] with f[q] >= v, in
 * increasing q, then the paths above it. */
static void mass_tree_lane(const struct mass_tree *t, const float *f, const float *e, int64_t p, float v)
{
    int64_t s = p / BP_SEGMENT, j = p % BP_LANES;
    int64_t end = (s + 1) * BP_SEGMENT < t->n ? (s + 1) * BP_SEGMENT : t->n;
    float acc = NEG_ZERO;
    for (int64_t q = s * BP_SEGMENT + j; q < end; q += BP_LANES)
        if (f[q] >= v)
            acc = acc + e[q];
    float *seg = t->node + s * SEGMENT_NODES;
    seg[j] = acc;
    tree_path(seg, BP_LANES, j);
    float *partials = tree_partials(t);
    partials[s] = seg[2 * BP_LANES - 2];
    tree_path(partials, t->gp, s);
}

/* Searches spec 21's v* (the smallest kept value with A(v) < thr) among the
 * kept values at ranks[0:nr] (sorted here), which lie below every kept value
 * not among them that is above, and above every one that is below (`below`:
 * whether there are any).  The tree starts as A(t1), the kept mass above the
 * largest of them; each value t that passes (A(t) < thr) has its positions'
 * lanes recomputed over f >= t, which makes the tree A(next value).  Returns
 * 1 with *floor = v*, or 0 when v* is not among them: above them when A(t1)
 * fails, below them when every value passes and so does the next one. */
static int top_p_floor_among(const float *f, const float *e, const int64_t *cand, int64_t nc, uint64_t *ranks,
                             int64_t nr, int below, float thr, const struct mass_tree *t, float *floor)
{
    qsort(ranks, (size_t)nr, sizeof *ranks, compare_u64);
    mass_tree_fill(t, f, e, cand, nc, f[rank_position(ranks[0])]);
    int found = 0;
    for (int64_t i = 0; i < nr;) {
        float v = f[rank_position(ranks[i])];
        if (!(mass_tree_root(t) < thr))
            return found;
        *floor = v;
        found = 1;
        for (; i < nr && f[rank_position(ranks[i])] == v; i++)
            mass_tree_lane(t, f, e, rank_position(ranks[i]), v);
    }
    return !below || !(mass_tree_root(t) < thr);
}

/* Kept tokens above which top-p first narrows its search by bucket masses. */
#define TOP_P_DIRECT 1024
/* Relative margin on the float64 bucket masses, far above the canonical sum's
 * relative error (below 2^-18: every term is >= 0 and no path has 64 adds). */
#define MASS_MARGIN 0x1p-12

ALWAYS_INLINE int64_t mass_bucket(float shift, float w)
{
    float d = shift - w;
    return d < (float)MASS_RANGE ? (int64_t)(d * (float)MASS_PER_UNIT) : MASS_BUCKETS - 1;
}

/* Top-p (spec 21) over the kept positions cand[0:*nc] of f, e their e_i:
 * thr = top_p * Z, Z the canonical sum of the kept e; every kept token below v*
 * gets f = -inf and leaves cand.  A sort of all kept tokens and one lane update
 * per token finds v*; with many kept tokens (top-k off), float64 masses per
 * bucket first pick the few buckets where the mass above crosses thr, and only
 * their tokens are sorted and walked, from the exact canonical sum of the mass
 * above them.  The float64 masses only choose where to look: every decision is
 * the canonical A(v) < thr, and if v* is not where they point, the search falls
 * back to all kept tokens. */
static void top_p_filter(float *f, const float *e, int64_t *cand, int64_t *nc, float shift, float top_p,
                         const struct select_scratch *sc, const struct mass_tree *t)
{
    mass_tree_fill(t, f, e, cand, *nc, NEG_INF);
    float thr = top_p * mass_tree_root(t);
    float floor = NEG_INF;
    int found = 0;
    if (*nc > TOP_P_DIRECT) {
        for (int64_t q = 0; q < MASS_BUCKETS; q++)
            sc->mass[q] = 0.0;
        for (int64_t c = 0; c < *nc; c++)
            sc->mass[mass_bucket(shift, f[cand[c]])] += e[cand[c]];
        /* buckets [qa, qb]: the mass above qa is surely < thr, the mass through qb surely >= thr */
        double low = (double)thr * (1.0 - MASS_MARGIN), high = (double)thr * (1.0 + MASS_MARGIN);
        double above = 0.0;
        int64_t qa = 0;
        while (qa < MASS_BUCKETS - 1 && above + sc->mass[qa] <= low)
            above += sc->mass[qa++];
        int64_t qb = qa;
        double through = above + sc->mass[qb];
        while (qb < MASS_BUCKETS - 1 && through < high)
            through += sc->mass[++qb];
        int64_t nr = 0;
        int below = 0;
        for (int64_t c = 0; c < *nc; c++) {
            int64_t p = cand[c], q = mass_bucket(shift, f[p]);
            if (q >= qa && q <= qb)
                sc->ranks[nr++] = rank_of(order_key(f[p]), p);
            below |= q > qb;
        }
        found = nr > 0 && top_p_floor_among(f, e, cand, *nc, sc->ranks, nr, below, thr, t, &floor);
    }
    if (!found) {
        /* always found: A(max) = -0.0 < thr, and nothing is below */
        for (int64_t c = 0; c < *nc; c++)
            sc->ranks[c] = rank_of(order_key(f[cand[c]]), cand[c]);
        top_p_floor_among(f, e, cand, *nc, sc->ranks, *nc, 0, thr, t, &floor);
    }
    int64_t kept = 0;
    for (int64_t c = 0; c < *nc; c++) {
        int64_t p = cand[c];
        if (f[p] >= floor)
            cand[kept++] = p;
        else
            f[p] = NEG_INF;
    }
    *nc = kept;
}

/* -- Filtering and sampling (spec 21, 22) ------------------------------------- */

struct filter_params {
    float scale;
    int64_t top_k;
    float top_p, min_p;
};

/* Max of w = x * scale over a row, NaN-propagating, + 0.0 (spec 4). */
static float row_max(const float *x, int64_t n, float scale, float *lanes)
{
    int64_t w = lane_width(n);
    float m = NEG_INF;
    for (int64_t s = 0; s < n; s += BP_SEGMENT)
        m = max_nan(m, segment_max(x + s, NULL, n - s < BP_SEGMENT ? n - s : BP_SEGMENT, w, scale, lanes));
    return m + 0.0f;
}

/* f_i = w_i = x_i * scale where kept, else -inf.  Kept: w_i != -inf and, with
 * with_exp, e_i = exp(w_i - shift) >= min_p (min-p), e_i stored; min_p = 0
 * keeps every e_i (never NaN on a row without NaN and +inf). */
ALWAYS_INLINE void keep_pass(int with_exp, const float *x, int64_t n, float scale, float shift, float min_p,
                             float *f, float *e)
{
    for (int64_t i = 0; i < n; i++) {
        float w = x[i] * scale;
        int keep = w != NEG_INF;
        if (with_exp) {
            float ei = canonical_exp(w - shift);
            e[i] = ei;
            keep &= ei >= min_p;
        }
        f[i] = keep ? w : NEG_INF;
    }
}

/* Positions i of f[0:n] with f_i != -inf, ascending, into cand; returns how many.
 * A block is tested in one vectorised pass and copied only when it holds one. */
static int64_t kept_positions(const float *f, int64_t n, int64_t *cand)
{
    int64_t nc = 0;
    for (int64_t s = 0; s < n; s += SELECT_BLOCK) {
        int64_t end = n - s < SELECT_BLOCK ? n : s + SELECT_BLOCK;
        int any = 0;
        for (int64_t i = s; i < end; i++)
            any |= f[i] != NEG_INF;
        if (!any)
            continue;
        for (int64_t i = s; i < end; i++)
            if (f[i] != NEG_INF)
                cand[nc++] = i;
    }
    return nc;
}

/* One row of filter_logits (spec 21), in its order: w = x * scale, then min-p,
 * top-k, top-p, into f[0:n] (w where kept, -inf where removed) and sc->cand,
 * the kept positions ascending (*nc of them).  Returns 1, writing nothing, when
 * w holds a NaN or +inf (no distribution), else 0.  top-k: tau by selection on
 * order keys (kth_largest_key); every f_i >= tau stays, ties included. */
static int filter_row(const float *x, int64_t n, struct filter_params p, float *f, int64_t *nc,
                      const struct select_scratch *sc)
{
    float m = row_max(x, n, p.scale, sc->lanes);
    if (m != m || m == POS_INF)
        return 1;
    float shift = m == NEG_INF ? 0.0f : m;
    int top_k = p.top_k > 0 && p.top_k < n, top_p = p.top_p < 1.0f;
    /* after top-k, top-p needs e only at the ~k tokens left: computed there below */
    int dense_e = p.min_p > 0.0f || (top_p && !top_k);
    if (dense_e)
        keep_pass(1, x, n, p.scale, shift, p.min_p, f, sc->e);
    else
        keep_pass(0, x, n, p.scale, shift, p.min_p, f, sc->e);
    if (top_k) {
        for (int64_t i = 0; i < n; i++)
            sc->keys[i] = order_key(f[i]);
        uint32_t tau = kth_largest_key(sc->keys, n, p.top_k, sc->buf, sc->hist);
        for (int64_t i = 0; i < n; i++)
            f[i] = sc->keys[i] >= tau ? f[i] : NEG_INF;
    }
    *nc = kept_positions(f, n, sc->cand);
    if (top_p && *nc > 0) {
        if (!dense_e)
            for (int64_t c = 0; c < *nc; c++)
                sc->e[sc->cand[c]] = canonical_exp(f[sc->cand[c]] - shift);
        int64_t g = (n + BP_SEGMENT - 1) / BP_SEGMENT;
        const struct mass_tree t = {sc->tree, n, g, next_pow2(g)};
        top_p_filter(f, sc->e, sc->cand, nc, shift, p.top_p, sc, &t);
    }
    return 0;
}

static struct filter_params params_of(const struct select_args *a, int64_t r)
{
    return (struct filter_params){a->scale[r], a->top_k[r], a->top_p[r], a->min_p[r]};
}

/* filter_logits of row r into out [r, 0:n]; all NaN without a distribution. */
static void filter_logits_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    float *orow = a->out + r * n;
    int64_t nc;
    if (filter_row(a->x + r * n, n, params_of(a, r), orow, &nc, sc))
        for (int64_t i = 0; i < n; i++)
            orow[i] = NAN_F32;
}

/* The lowest-index maximum of (f_i - shift) - noise_i over the kept positions
 * cand[0:nc] (ascending; spec 22), shift the largest kept value (the row
 * maximum, which every filter keeps), or -1 if there are none.  Only blocks
 * holding a kept token get noise; every score is finite, so the first one is
 * taken. */
static int64_t race_winner(const float *f, const int64_t *cand, int64_t nc, int64_t seed, int64_t position)
{
    float noise[NOISE_BLOCK];
    float best = NEG_INF, shift = NEG_INF;
    int64_t token = -1;
    for (int64_t c = 0; c < nc; c++)
        shift = f[cand[c]] > shift ? f[cand[c]] : shift;   /* a zero's sign cannot change a comparison below */
    for (int64_t c = 0; c < nc;) {
        int64_t b = cand[c] - cand[c] % NOISE_BLOCK;
        noise_block((uint64_t)seed, (uint64_t)position, b, noise);
        for (; c < nc && cand[c] < b + NOISE_BLOCK; c++) {
            int64_t i = cand[c], r = i - b;
            float score = (f[i] - shift) - noise[(r & 1) * (NOISE_BLOCK / 2) + (r >> 1)];
            if (score > best) {
                best = score;
                token = i;
            }
        }
    }
    return token;
}

/* Lowest index of the maximum of x[0:n] (no NaN or +inf), -1 if all are -inf. */
static int64_t first_argmax(const float *x, int64_t n, float *lanes)
{
    float m = row_max(x, n, 1.0f, lanes);
    if (m == NEG_INF)
        return -1;
    int64_t i = 0;
    while (x[i] != m)
        i++;
    return i;
}

/* sample (spec 22) of row r into tokens[r]: a greedy row takes first_argmax of
 * x, any other the race winner over filter_logits' kept tokens; -1 where
 * w = x * scale holds a NaN or +inf. */
static void sample_row(const struct select_args *a, int64_t r, int64_t n, const struct select_scratch *sc)
{
    const float *xr = a->x + r * n;
    const struct filter_params p = params_of(a, r);
    int64_t nc;
    if (a->greedy[r]) {
        float m = row_max(xr, n, p.scale, sc->lanes);
        a->tokens[r] = m != m || m == POS_INF ? -1 : first_argmax(xr, n, sc->lanes);
    } else if (filter_row(xr, n, p, sc->f, &nc, sc)) {
        a->tokens[r] = -1;
    } else {
        a->tokens[r] = race_winner(sc->f, sc->cand, nc, a->seeds[r], a->positions[r]);
    }
}

/* filter_logits of each row of x [rows, n] with per-row parameters into out [rows, n]. */
int bp_filter_logits(const float *x, int64_t rows, int64_t n, const float *scale, const int64_t *top_k,
                     const float *top_p, const float *min_p, float *out, int nthreads)
{
    const struct select_args a = {.x = x, .scale = scale, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                  .out = out};
    return select_rows(filter_logits_row, &a, rows, n, nthreads);
}

/* sample of each row of x [rows, n] with per-row parameters into tokens i64[rows]. */
int bp_sample(const float *x, int64_t rows, int64_t n, const float *scale, const int64_t *top_k,
              const float *top_p, const float *min_p, const uint8_t *greedy, const int64_t *seeds,
              const int64_t *positions, int64_t *tokens, int nthreads)
{
    const struct select_args a = {.x = x, .scale = scale, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                                  .greedy = greedy, .seeds = seeds, .positions = positions, .tokens = tokens};
    return select_rows(sample_row, &a, rows, n, nthreads);
}
