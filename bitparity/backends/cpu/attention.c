/* attention (spec 24.4) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "softmax_stats.h"
#include "dot_panels.h"

/* attention (spec 24.4): q [groups, tq, d], k and v [groups, tk, d] -> out [groups, tq, d].  Query i
 * of group g sees the keys j < limit = min(kv_lengths[g], i + 1 + tk - tq when causal): a prefix, so
 * the keys that do not count (-inf in the softmax, -0.0 in the sums, both identities) are simply not
 * visited, and nothing read past the prefix is ever combined with a number.  Per (g, i):
 *   s_j = dot(q_i, k_j) for j < limit            (PANEL keys per panel_dot)
 *   softmax_stats of w = s * scale over the prefix (spec 8.2), p_j = exp(w_j - shift) * recip (spec 8.3)
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
            int64_t limit = kv_lengths[g];
            if (causal && i + 1 + tk - tq < limit)
                limit = i + 1 + tk - tq;
            const float *keys = packed + g * group_size, *cols = keys + key_size;
            for (int64_t p = 0; p * PANEL < limit; p++)
                panel_dot(q + item * d, keys + p * d * PANEL, d, dot_scratch, scores + p * PANEL);
            struct stats st = softmax_stats(scores, NULL, limit, scale, &sc);
            for (int64_t j = 0; j < limit; j++)
                probs[j] = canonical_exp(scaled(scores, NULL, j, scale) - st.shift) * st.recip;
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
