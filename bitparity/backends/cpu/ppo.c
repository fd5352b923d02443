/* ppo_policy_loss (spec 17) for the `cpu` backend, and its backward (spec 26.10).
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* Spec 17.1's pieces of one token, which the loss and its gradient share:
 * d0 = logp - old_logp, d = clamp(d0, ±ratio_clamp), ratio = exp(d), na = -adv (a sign flip),
 * loss1 = na * ratio, loss2 = na * clamp(ratio, lo, hi).  An unset ratio_clamp is +inf. */
struct ppo_token {
    float d0, na, loss1, loss2;
};

ALWAYS_INLINE struct ppo_token ppo_token(float logp, float old_logp, float adv, float ratio_low, float ratio_high,
                                         float ratio_clamp)
{
    struct ppo_token t;
    t.d0 = logp - old_logp;
    float ratio = canonical_exp(clamp_prop(t.d0, -ratio_clamp, ratio_clamp));
    t.na = -adv;
    t.loss1 = t.na * ratio;
    t.loss2 = t.na * clamp_prop(ratio, ratio_low, ratio_high);
    return t;
}

/* verl's clipped surrogate of one token (spec 17.1); *clipped = 1.0 where
 * loss2 > loss1, else 0.0.  An unset dual_clip is +inf, for which
 * min_prop(na * c, loss) leaves loss unchanged. */
ALWAYS_INLINE float ppo_token_loss(float logp, float old_logp, float adv, float ratio_low, float ratio_high,
                                   float dual_clip, float ratio_clamp, float *clipped)
{
    struct ppo_token t = ppo_token(logp, old_logp, adv, ratio_low, ratio_high, ratio_clamp);
    *clipped = t.loss2 > t.loss1 ? 1.0f : 0.0f;
    float loss = max_prop(t.loss1, t.loss2);
    return adv < 0.0f ? min_prop(t.na * dual_clip, loss) : loss;
}

enum ppo_agg { AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM_NORM };

/* The token losses [B, T] aggregated by agg (spec 17.2) into *total, with n_b the exact count of
 * sequence b and e_b = (n_b > 0) (the sequence modes average over the E non-empty sequences only):
 *   token-mean:              masked mean of the losses as one row [1, B*T];
 *   seq-mean-token-sum:      s_b = canonical sum of the counted losses of row b, then the masked mean of
 *                            s [1, B] under e: canonical sum of select(e, s, -0.0) * R(E) + 0.0;
 *   seq-mean-token-mean:     m_b = masked mean of row b, then the masked mean of m [1, B] under e;
 *   seq-mean-token-sum-norm: seq-mean-token-sum's result * reciprocal(float(T)).
 * per_seq: scratch of B floats; counts: of B int64; non_empty: of B uint8. */
static int ppo_aggregate(enum ppo_agg agg, const float *loss, const uint8_t *mask, int64_t b, int64_t t_len,
                         float *per_seq, int64_t *counts, uint8_t *non_empty, float *total, int nthreads)
{
    if (agg == AGG_TOKEN_MEAN)
        return masked_mean_rows(loss, mask, 1, b * t_len, total, counts, nthreads);
    int status = agg == AGG_SEQ_MEAN_TOKEN_MEAN
        ? masked_mean_rows(loss, mask, b, t_len, per_seq, counts, nthreads)
        : masked_row_sums(TERM_MASKED_X, loss, NULL, mask, b, t_len, NULL, per_seq, counts, nthreads);
    if (status != 0)
        return status;
    for (int64_t r = 0; r < b; r++)
        non_empty[r] = counts[r] > 0;
    status = masked_mean_rows(per_seq, non_empty, 1, b, total, counts, nthreads);
    if (status == 0 && agg == AGG_SEQ_MEAN_TOKEN_SUM_NORM)
        *total = *total * canonical_reciprocal((float)t_len);
    return status;
}

struct ppo_token_pass {
    const float *logp, *old_logp, *advantages;
    float ratio_low, ratio_high, dual_clip, ratio_clamp;
    float *loss, *clipped;
};

/* The tokens [begin, end): their losses and clip flags.  The fields are read into locals first: a store
 * through loss or clipped could otherwise alias the float fields, which would be reloaded every token. */
static void ppo_token_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct ppo_token_pass *c = ctx;
    const float *logp = c->logp, *old_logp = c->old_logp, *advantages = c->advantages;
    float ratio_low = c->ratio_low, ratio_high = c->ratio_high, dual_clip = c->dual_clip;
    float ratio_clamp = c->ratio_clamp, *loss = c->loss, *clipped = c->clipped;
    for (int64_t i = begin; i < end; i++)
        loss[i] = ppo_token_loss(logp[i], old_logp[i], advantages[i], ratio_low, ratio_high, dual_clip, ratio_clamp,
                                 &clipped[i]);
}

/* PPO policy loss of logp, old_logp, advantages, mask [B, T] into result[0]
 * (the loss aggregated by agg, an enum ppo_agg) and result[1] (the clip
 * fraction: the masked mean over all B*T tokens of clipped, as one row).
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_ppo_policy_loss(const float *logp, const float *old_logp, const float *advantages, const uint8_t *mask,
                       int64_t b, int64_t t_len, float ratio_low, float ratio_high, float dual_clip,
                       float ratio_clamp, int agg, float *result, int nthreads)
{
    int64_t n = b * t_len;
    float *loss = malloc(sizeof(float) * (size_t)(2 * n));    /* loss [n], then clipped [n] */
    float *per_seq = malloc(sizeof(float) * (size_t)b);
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)b);
    uint8_t *non_empty = malloc((size_t)b);
    int status = -1;
    if (loss && per_seq && counts && non_empty) {
        float *clipped = loss + n;
        const struct ppo_token_pass c = {logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp,
                                         loss, clipped};
        bp_parallel_for(ppo_token_span, &c, n, nthreads);
        status = ppo_aggregate(agg, loss, mask, b, t_len, per_seq, counts, non_empty, &result[0], nthreads);
        if (status == 0)
            status = masked_mean_rows(clipped, mask, 1, n, &result[1], counts, nthreads);
    }
    free(loss);
    free(per_seq);
    free(counts);
    free(non_empty);
    return status;
}

/* The gradient of the aggregated loss w.r.t. logp of one (row, segment) span (spec 26.10):
 *   passes = m and not (loss2 > loss1)                              the clip holds the loss constant
 *            and not (adv < 0 and na * c < max(loss1, loss2))       the dual clip does (c = +inf: never)
 *            and not (d0 outside ±ratio_clamp)                      the ratio clamp does (+inf: never)
 *   dlogp  = select(passes, w_b * loss1, +0.0)                      d loss1 / d logp = na * ratio = loss1
 * NaN compares false in every test, so a NaN logp passes and gives NaN. */
struct ppo_grad_pass {
    const float *logp, *old_logp, *advantages, *weight;     /* weight [B]: w_b */
    const uint8_t *mask;
    int64_t t_len;
    float ratio_low, ratio_high, dual_clip, ratio_clamp;
    float *out;
};

static void ppo_grad_span(const void *ctx, int64_t r, int64_t start, int64_t end)
{
    const struct ppo_grad_pass *c = ctx;
    int64_t o = r * c->t_len;
    const float *lp = c->logp + o, *old = c->old_logp + o, *adv = c->advantages + o;
    const uint8_t *mr = c->mask + o;
    float *orow = c->out + o;
    float w = c->weight[r];
    for (int64_t i = start; i < end; i++) {
        struct ppo_token t = ppo_token(lp[i], old[i], adv[i], c->ratio_low, c->ratio_high, c->ratio_clamp);
        /* bitwise | and &: every test is evaluated, so the loop has no branch to vectorise around */
        int held = t.loss2 > t.loss1;
        held |= (adv[i] < 0.0f) & (t.na * c->dual_clip < max_prop(t.loss1, t.loss2));
        held |= outside(t.d0, c->ratio_clamp);
        orow[i] = counted(mr, i, held ? 0.0f : w * t.loss1);
    }
}

/* The gradient w.r.t. logp [B, T] of the loss aggregated by agg, for its upstream gradient g[0], into
 * out [B, T].  Each counted token of sequence b weighs w_b = d loss / d token loss, with
 * R(k) = count_reciprocal(k) (spec 15.1's factor: 0 for k = 0), n the count of all counted tokens,
 * n_b that of sequence b, E the number of non-empty sequences (n_b > 0):
 *   token-mean: g * R(n);  seq-mean-token-sum: g * R(E);  seq-mean-token-mean: (g * R(E)) * R(n_b);
 *   seq-mean-token-sum-norm: (g * reciprocal(float(T))) * R(E).
 * The exact counts are taken over (row, segment) items, then one pass per token.
 * Returns 0, or -1 if scratch could not be allocated. */
int bp_ppo_policy_loss_backward(const float *logp, const float *old_logp, const float *advantages,
                                const uint8_t *mask, const float *g, int64_t b, int64_t t_len, float ratio_low,
                                float ratio_high, float dual_clip, float ratio_clamp, int agg, float *out,
                                int nthreads)
{
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)b);
    float *weight = malloc(sizeof(float) * (size_t)b);
    int status = counts && weight ? masked_row_sums(TERM_MASKED_X, NULL, NULL, mask, b, t_len, NULL, NULL, counts,
                                                    nthreads)
                                  : -1;
    if (status == 0) {
        int64_t n = 0, e = 0;
        for (int64_t r = 0; r < b; r++) {
            n += counts[r];
            e += counts[r] > 0;
        }
        float per_seq = g[0] * count_reciprocal(e);
        float per_token = g[0] * count_reciprocal(n);
        float per_seq_norm = (g[0] * canonical_reciprocal((float)t_len)) * count_reciprocal(e);
        for (int64_t r = 0; r < b; r++)
            weight[r] = agg == AGG_TOKEN_MEAN ? per_token
                      : agg == AGG_SEQ_MEAN_TOKEN_SUM ? per_seq
                      : agg == AGG_SEQ_MEAN_TOKEN_SUM_NORM ? per_seq_norm
                      : per_seq * count_reciprocal(counts[r]);
        const struct ppo_grad_pass c = {logp, old_logp, advantages, weight, mask, t_len, ratio_low, ratio_high,
                                        dual_clip, ratio_clamp, out};
        run_row_segments(ppo_grad_span, &c, b, t_len, nthreads);
    }
    free(counts);
    free(weight);
    return status;
}
