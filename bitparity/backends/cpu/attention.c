/* attention (spec 24.4) for the `cpu` backend, and its backward (spec 29.6).
 * canonical.h says why the bits cannot depend on the build. */

#include "softmax_stats.h"
#include "dot_panels.h"

/* How many keys query i sees: the prefix j < min(kv_length, i + 1 + tk - tq when causal). */
static inline int64_t key_limit(int64_t kv_length, int64_t i, int64_t tq, int64_t tk, int causal)
{
    return causal && i + 1 + tk - tq < kv_length ? i + 1 + tk - tq : kv_length;
}

/* Query qi [d]'s probabilities over its first `limit` keys (spec 24.4), the forward's bits, which the
 * backward recomputes:  s_j = dot(q_i, k_j) (PANEL keys per panel_dot, from keys: k packed as
 * [key panel][d][PANEL]), the softmax statistics of w = s * scale (spec 8.2), p_j = exp(w_j - shift) * recip
 * (spec 8.3).  scores: key_panels * PANEL floats; probs: limit floats. */
ALWAYS_INLINE void query_probs(const float *qi, const float *keys, int64_t d, int64_t limit, float scale,
                               const struct scratch *sc, float *dot_scratch, float *scores, float *probs)
{
    for (int64_t p = 0; p * PANEL < limit; p++)
        panel_dot(qi, keys + p * d * PANEL, d, dot_scratch, scores + p * PANEL);
    struct stats st = softmax_stats(scores, NULL, limit, scale, sc);
    for (int64_t j = 0; j < limit; j++)
        probs[j] = canonical_exp(scaled(scores, NULL, j, scale) - st.shift) * st.recip;
}

/* attention (spec 24.4): q [groups, tq, d], k and v [groups, tk, d] -> out [groups, tq, d].  Query i
 * of group g sees the keys j < key_limit: a prefix, so the keys that do not count (-inf in the softmax,
 * -0.0 in the sums, both identities) are simply not visited, and nothing read past the prefix is ever
 * combined with a number.  Per (g, i): p = query_probs, then
 *   out_i[c] = canonical sum over j < limit of p_j * v_j[c]   (PANEL columns per panel_dot)
 * Each group's k is packed into key panels ([d][PANEL]) and v into column panels ([tk][PANEL]) once;
 * (group, query) items are split over threads.  Returns 0, or -1 if scratch could not be allocated. */
int bp_attention(const float *q, const float *k, const float *v, const int64_t *kv_lengths, int64_t groups,
                 int64_t tq, int64_t tk, int64_t d, int causal, float scale, float *out, int nthreads)
{
    int64_t key_panels = (tk + PANEL - 1) / PANEL, col_panels = (d + PANEL - 1) / PANEL;
    int64_t key_size = key_panels * d * PANEL, group_size = key_size + col_panels * tk * PANEL;
    float *packed = malloc(sizeof(float) * (size_t)(groups * group_size));
    if (packed == NULL)
        return -1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; g++) {
        const float *kg = k + g * tk * d, *vg = v + g * tk * d;
        float *keys = packed + g * group_size, *cols = keys + key_size;
        for (int64_t p = 0; p < key_panels; p++)
            pack_panel(kg, d, tk, p * PANEL, d, 1, keys + p * d * PANEL);
        for (int64_t p = 0; p < col_panels; p++)
            pack_panel(vg, tk, d, p * PANEL, 1, d, cols + p * tk * PANEL);
    }
    int64_t gp = next_pow2((tk + BP_SEGMENT - 1) / BP_SEGMENT);
    int64_t dot_size = panel_scratch_size(tk > d ? tk : d);
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|:failed)
    {
        /* softmax_stats' scratch, panel_dot's scratch, PANEL outputs, scores [key_panels * PANEL], p [tk] */
        float *buf = malloc(sizeof(float) * (size_t)(2 * BP_LANES + 3 * gp + dot_size + PANEL
                                                     + key_panels * PANEL + tk));
        failed = buf == NULL;
        struct scratch sc = {buf, buf + 2 * BP_LANES, buf + 2 * BP_LANES + gp, buf + 2 * BP_LANES + 2 * gp};
        float *dot_scratch = buf + 2 * BP_LANES + 3 * gp, *y = dot_scratch + dot_size;
        float *scores = y + PANEL, *probs = scores + key_panels * PANEL;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < groups * tq; item++) {
            if (failed)
                continue;
            int64_t g = item / tq, i = item % tq;
            int64_t limit = key_limit(kv_lengths[g], i, tq, tk, causal);
            const float *keys = packed + g * group_size, *cols = keys + key_size;
            query_probs(q + item * d, keys, d, limit, scale, &sc, dot_scratch, scores, probs);
            float *orow = out + item * d;
            for (int64_t p = 0; p < col_panels; p++) {
                panel_dot(probs, cols + p * tk * PANEL, limit, dot_scratch, y);
                for (int64_t c = 0; c < PANEL && p * PANEL + c < d; c++)
                    orow[p * PANEL + c] = y[c];
            }
        }
        free(buf);
    }
    free(packed);
    return failed ? -1 : 0;
}

/* Floats of attention_backward's packed inputs and [tk][tq] matrices that one pass may hold. */
#define BACKWARD_PASS_FLOATS (1 << 24)

/* Where one group's packing for the backward lies, in floats from its base: k (at 0) and v as key panels
 * ([key panel][d][PANEL], for the scores and dp), k as column panels ([column panel][tk][PANEL], for dq),
 * q and g as column panels ([column panel][tq][PANEL], for dk and dv), then p and ds transposed ([tk][tq]:
 * key j's column, the queries that see it); size in all. */
struct backward_layout {
    int64_t values, key_cols, query_cols, grad_cols, p_t, ds_t, size;
};

static struct backward_layout backward_layout(int64_t tq, int64_t tk, int64_t d)
{
    int64_t key_size = (tk + PANEL - 1) / PANEL * d * PANEL, col_panels = (d + PANEL - 1) / PANEL;
    struct backward_layout l;
    l.values = key_size;
    l.key_cols = l.values + key_size;
    l.query_cols = l.key_cols + col_panels * tk * PANEL;
    l.grad_cols = l.query_cols + col_panels * tq * PANEL;
    l.p_t = l.grad_cols + col_panels * tq * PANEL;
    l.ds_t = l.p_t + tk * tq;
    l.size = l.ds_t + tk * tq;
    return l;
}

/* One pass of attention's backward: the groups g0 .. g0 + count - 1, packed from `packed` (backward_layout). */
struct attention_backward_job {
    const float *q, *k, *v, *g;
    const int64_t *kv_lengths;
    int64_t g0, tq, tk, d, key_panels, col_panels, dot_size;
    int causal;
    float scale;
    struct backward_layout l;
    float *packed, *dq, *dk, *dv;
};

/* The pass's groups [begin, end), packed. */
static void backward_pack_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct attention_backward_job *c = ctx;
    int64_t tq = c->tq, tk = c->tk, d = c->d;
    for (int64_t b = begin; b < end; b++) {
        int64_t g = c->g0 + b;
        const float *qg = c->q + g * tq * d, *kg = c->k + g * tk * d, *vg = c->v + g * tk * d, *gg = c->g + g * tq * d;
        float *base = c->packed + b * c->l.size;
        for (int64_t p = 0; p < c->key_panels; p++) {
            pack_panel(kg, d, tk, p * PANEL, d, 1, base + p * d * PANEL);
            pack_panel(vg, d, tk, p * PANEL, d, 1, base + c->l.values + p * d * PANEL);
        }
        for (int64_t p = 0; p < c->col_panels; p++) {
            pack_panel(kg, tk, d, p * PANEL, 1, d, base + c->l.key_cols + p * tk * PANEL);
            pack_panel(qg, tq, d, p * PANEL, 1, d, base + c->l.query_cols + p * tq * PANEL);
            pack_panel(gg, tq, d, p * PANEL, 1, d, base + c->l.grad_cols + p * tq * PANEL);
        }
    }
}

/* A member of the query phase: its scratch, then the (group, query i) items it claims.  p = query_probs
 * (the forward's bits) over the keys j < limit;  dp_j = dot(g_i, v_j);  G = canonical sum over j < limit of
 * dp_j * p_j;  ds_j = (p_j * (dp_j - G)) * scale (spec 26.4);  dq_i[c] = canonical sum over j < limit of
 * ds_j * k_j[c].  p_j and ds_j are stored transposed for the key phase. */
static int backward_query_member(const void *ctx, struct bp_job *job)
{
    const struct attention_backward_job *c = ctx;
    int64_t tq = c->tq, tk = c->tk, d = c->d, kp = c->key_panels;
    int64_t gp = next_pow2((tk + BP_SEGMENT - 1) / BP_SEGMENT);
    /* softmax_stats' scratch, panel_dot's scratch, PANEL outputs, scores and dp [kp * PANEL], p and ds [tk] */
    float *buf = malloc(sizeof(float) * (size_t)(2 * BP_LANES + 3 * gp + c->dot_size + PANEL + 2 * kp * PANEL
                                                 + 2 * tk));
    if (buf == NULL)
        return -1;
    struct scratch sc = {buf, buf + 2 * BP_LANES, buf + 2 * BP_LANES + gp, buf + 2 * BP_LANES + 2 * gp};
    float *dot_scratch = buf + 2 * BP_LANES + 3 * gp, *y = dot_scratch + c->dot_size;
    float *scores = y + PANEL, *dp = scores + kp * PANEL, *probs = dp + kp * PANEL, *ds = probs + tk;
    const struct term_args none = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t item = begin; item < end; item++) {
            int64_t b = item / tq, i = item % tq, row = c->g0 * tq + item;
            float *base = c->packed + b * c->l.size, *p_t = base + c->l.p_t, *ds_t = base + c->l.ds_t;
            int64_t limit = key_limit(c->kv_lengths[c->g0 + b], i, tq, tk, c->causal);
            query_probs(c->q + row * d, base, d, limit, c->scale, &sc, dot_scratch, scores, probs);
            for (int64_t p = 0; p * PANEL < limit; p++)
                panel_dot(c->g + row * d, base + c->l.values + p * d * PANEL, d, dot_scratch, dp + p * PANEL);
            /* G's lanes and partials: softmax_stats' scratch, free again */
            float big_g = row_sum(TERM_MASKED_YX, probs, dp, NULL, limit, &none, sc.lanes, sc.seg_max);
            for (int64_t j = 0; j < limit; j++) {
                ds[j] = (probs[j] * (dp[j] - big_g)) * c->scale;
                p_t[j * tq + i] = probs[j];
                ds_t[j * tq + i] = ds[j];
            }
            for (int64_t p = 0; p < c->col_panels; p++) {
                panel_dot(ds, base + c->l.key_cols + p * tk * PANEL, limit, dot_scratch, y);
                for (int64_t col = 0; col < PANEL && p * PANEL + col < d; col++)
                    c->dq[row * d + p * PANEL + col] = y[col];
            }
        }
    free(buf);
    return 0;
}

/* A member of the key phase: its scratch, then the (group, key j) items it claims.  The queries that see
 * key j are a suffix i >= first (first = j - (tk - tq) when causal, else 0), all of them for
 * j < kv_length, none past it:  dk_j[c] = canonical sum over i of ds_ij * q_i[c],
 * dv_j[c] = canonical sum over i of p_ij * g_i[c], the terms i < first absent (-0.0); a key no query sees
 * gets -0.0. */
static int backward_key_member(const void *ctx, struct bp_job *job)
{
    const struct attention_backward_job *c = ctx;
    int64_t tq = c->tq, tk = c->tk, d = c->d;
    float *dot_scratch = malloc(sizeof(float) * (size_t)(c->dot_size + PANEL));
    if (dot_scratch == NULL)
        return -1;
    float *y = dot_scratch + c->dot_size;
    int64_t begin, end;
    while (bp_claim(job, &begin, &end))
        for (int64_t item = begin; item < end; item++) {
            int64_t b = item / tk, j = item % tk, row = c->g0 * tk + item;
            const float *base = c->packed + b * c->l.size;
            float *dk = c->dk + row * d, *dv = c->dv + row * d;
            if (j >= c->kv_lengths[c->g0 + b]) {
                for (int64_t col = 0; col < d; col++) {
                    dk[col] = NEG_ZERO;
                    dv[col] = NEG_ZERO;
                }
                continue;
            }
            int64_t first = c->causal && j > tk - tq ? j - (tk - tq) : 0;
            for (int64_t p = 0; p < c->col_panels; p++) {
                panel_dot_from(base + c->l.ds_t + j * tq, base + c->l.query_cols + p * tq * PANEL, first, tq,
                               dot_scratch, y);
                for (int64_t col = 0; col < PANEL && p * PANEL + col < d; col++)
                    dk[p * PANEL + col] = y[col];
                panel_dot_from(base + c->l.p_t + j * tq, base + c->l.grad_cols + p * tq * PANEL, first, tq,
                               dot_scratch, y);
                for (int64_t col = 0; col < PANEL && p * PANEL + col < d; col++)
                    dv[p * PANEL + col] = y[col];
            }
        }
    free(dot_scratch);
    return 0;
}

/* attention's backward (spec 29.6), upstream g [groups, tq, d] -> dq [groups, tq, d], dk and dv
 * [groups, tk, d].  Groups are taken in passes of as many as BACKWARD_PASS_FLOATS hold (at least one); a
 * pass packs its groups, then runs the query phase (dq, and p and ds for every counted pair) and, once it
 * is done, the key phase (dk, dv), each split over threads.  Returns 0, or -1 if scratch could not be
 * allocated. */
int bp_attention_backward(const float *q, const float *k, const float *v, const int64_t *kv_lengths,
                          int64_t groups, int64_t tq, int64_t tk, int64_t d, int causal, float scale,
                          const float *g, float *dq, float *dk, float *dv, int nthreads)
{
    const struct backward_layout l = backward_layout(tq, tk, d);
    int64_t pass = BACKWARD_PASS_FLOATS / l.size;
    pass = pass < 1 ? 1 : pass > groups ? groups : pass;
    float *packed = malloc(sizeof(float) * (size_t)(pass * l.size));
    if (packed == NULL)
        return -1;
    int64_t longest = tk > tq ? tk : tq;
    struct attention_backward_job c = {q, k, v, g, kv_lengths, 0, tq, tk, d, (tk + PANEL - 1) / PANEL,
                                       (d + PANEL - 1) / PANEL, panel_scratch_size(longest > d ? longest : d),
                                       causal, scale, l, packed, dq, dk, dv};
    int status = 0;
    for (c.g0 = 0; c.g0 < groups && status == 0; c.g0 += pass) {
        int64_t count = groups - c.g0 < pass ? groups - c.g0 : pass;
        bp_parallel_for(backward_pack_span, &c, count, nthreads);
        status = bp_parallel(backward_query_member, &c, count * tq, nthreads);
        if (status == 0)
            status = bp_parallel(backward_key_member, &c, count * tk, nthreads);
    }
    free(packed);
    return status;
}
