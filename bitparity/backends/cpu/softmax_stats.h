/* The softmax row statistics (spec 8.2) for the `cpu` backend: what softmax.c
 * (the softmax family's rows) and attention.c (its score rows) share, so the
 * order is written once.  See canonical.h for why the bits cannot depend on the
 * build. */

#ifndef BP_CPU_SOFTMAX_STATS_H
#define BP_CPU_SOFTMAX_STATS_H

#include "canonical.h"

/* -- Softmax statistics (spec 8.2) ----------------------------------------- */

/* One segment's exponentials e = exp(w - shift), split: *count = canonical sum
 * of (e == 1 ? 1 : -0.0), *rest = canonical sum of (e == 1 ? -0.0 : e), in one
 * pass with two sets of lanes.
 *
 * Padding: reference/canonical.py pads w with -inf, so its padded terms are
 * -0.0 in the count and exp(-inf) = +0.0 in the rest; here both start at -0.0.
 * The sign of a zero term can only change the sign of a zero sum (x + y for
 * nonzero x + y does not see zero signs), and a zero rest or count enters
 * total and err below only through two_sum with the other, where both signs
 * give the same total up to the sign of a zero total and err = +0.0; log and
 * the selects treat -0.0 and +0.0 alike.  So the bits of every result agree.
 * lanes_count, lanes_rest: scratch of W floats each. */
ALWAYS_INLINE void segment_exp_sums(const float *x, const uint8_t *mask, int64_t len, int64_t w,
                                    float scale, float shift, float *lanes_count, float *lanes_rest,
                                    float *count, float *rest)
{
    for (int64_t j = 0; j < w; j++) {
        lanes_count[j] = NEG_ZERO;
        lanes_rest[j] = NEG_ZERO;
    }
    for (int64_t c = 0; c < len; c += w) {
        int64_t m = len - c < w ? len - c : w;
        const float *xc = x + c;
        const uint8_t *mc = mask ? mask + c : NULL;
        for (int64_t j = 0; j < m; j++) {
            float e = canonical_exp(scaled(xc, mc, j, scale) - shift);
            int one = e == 1.0f;
            lanes_count[j] = lanes_count[j] + (one ? 1.0f : NEG_ZERO);
            lanes_rest[j] = lanes_rest[j] + (one ? NEG_ZERO : e);
        }
    }
    *count = halving_tree(lanes_count, w);
    *rest = halving_tree(lanes_rest, w);
}

/* (s, err): s = RN(a + b) and its exact rounding error (Knuth's TwoSum). */
ALWAYS_INLINE float two_sum(float a, float b, float *err)
{
    float s = a + b;
    float bb = s - a;
    *err = (a - (s - bb)) + (b - bb);
    return s;
}

struct stats {
    float shift, total, log_total, recip;
};

/* Per segment g: m_g = max, shift_g = m_g (0 if -inf), count_g and rest_g of
 * exp(w - shift_g).  Row: shift = max_g m_g (0 if -inf), c_g = exp(m_g - shift);
 * a segment with c_g == 1 keeps its count and rest apart, any other folds
 * c_g * (count_g + rest_g) into the rest; count and rest are combined by the
 * partial tree, total = two_sum(count, rest), log_total = log(total) + err * recip.
 * Each segment is read twice back to back, so the second read hits cache. */
ALWAYS_INLINE struct stats softmax_stats(const float *x, const uint8_t *mask, int64_t n, float scale,
                                         const struct scratch *sc)
{
    int64_t w = lane_width(n);
    int64_t g = 0;
    float row_max = NEG_INF;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        const uint8_t *ms = mask ? mask + s : NULL;
        float m = segment_max(x + s, ms, len, w, scale, sc->lanes);
        segment_exp_sums(x + s, ms, len, w, scale, m == NEG_INF ? 0.0f : m, sc->lanes,
                         sc->lanes + BP_LANES, &sc->seg_count[g], &sc->seg_rest[g]);
        sc->seg_max[g] = m;
        row_max = max_nan(row_max, m);
    }
    struct stats st;
    row_max = row_max + 0.0f;
    st.shift = row_max == NEG_INF ? 0.0f : row_max;
    for (int64_t i = 0; i < g; i++) {
        float c = canonical_exp(sc->seg_max[i] - st.shift);
        int top = c == 1.0f;
        float folded = c * (sc->seg_count[i] + sc->seg_rest[i]);
        sc->seg_count[i] = top ? sc->seg_count[i] : NEG_ZERO;
        sc->seg_rest[i] = top ? sc->seg_rest[i] : folded;
    }
    float count = combine_partials(sc->seg_count, g);
    float rest = combine_partials(sc->seg_rest, g);
    float err;
    st.total = two_sum(count, rest, &err);
    float recip = canonical_reciprocal(st.total);
    st.recip = st.total == 0.0f ? 0.0f : recip;       /* 0 for an empty row */
    st.log_total = canonical_log(st.total) + err * st.recip;
    return st;
}

/* Spec 8.3's log-probability of an entry whose scaled logit is w: (w - shift) - log_total, or -inf in a
 * row whose total is 0.  It is log_softmax's output and token_logprobs', and the log family's backward
 * takes its probability P = exp(log_prob) (spec 26.1), so all three read these bits. */
ALWAYS_INLINE float log_prob(float w, struct stats st)
{
    float lp = (w - st.shift) - st.log_total;
    return st.total == 0.0f ? NEG_INF : lp;
}

#endif /* BP_CPU_SOFTMAX_STATS_H */
