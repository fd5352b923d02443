/* ppo_policy_loss (spec 17) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* verl's clipped surrogate of one token (spec 17.1); *clipped = 1.0 where
 * loss2 > loss1, else 0.0.  Unset dual_clip and ratio_clamp are +inf, for
 * which min_prop(na * c, loss) and the clamp leave their operand unchanged. */
ALWAYS_INLINE float ppo_token_loss(float logp, float old_logp, float adv, float ratio_low, float ratio_high,
                                   float dual_clip, float ratio_clamp, float *clipped)
{
    float d = clamp_prop(logp - old_logp, -ratio_clamp, ratio_clamp);
    float ratio = canonical_exp(d);
    float na = -adv;
    float loss1 = na * ratio;
    float loss2 = na * clamp_prop(ratio, ratio_low, ratio_high);
    *clipped = loss2 > loss1 ? 1.0f : 0.0f;
    float loss = max_prop(loss1, loss2);
    return adv < 0.0f ? min_prop(na * dual_clip, loss) : loss;
}

enum ppo_agg { AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_MEAN };

/* The token losses [B, T] aggregated by agg (spec 17.2) into *total:
 *   token-mean:          masked mean of the losses as one row [1, B*T];
 *   seq-mean-token-sum:  s_b = canonical sum of the counted losses of row b, then the mean of s [1, B];
 *   seq-mean-token-mean: m_b = masked mean of row b, then the mean of m [1, B].
 * per_seq: scratch of B floats; counts: of B int64. */
static int ppo_aggregate(enum ppo_agg agg, const float *loss, const uint8_t *mask, int64_t b, int64_t t_len,
                         float *per_seq, int64_t *counts, float *total, int nthreads)
{
    if (agg == AGG_TOKEN_MEAN)
        return masked_mean_rows(loss, mask, 1, b * t_len, total, counts, nthreads);
    int status = agg == AGG_SEQ_MEAN_TOKEN_SUM
        ? masked_row_sums(TERM_MASKED_X, loss, mask, b, t_len, NULL, per_seq, NULL, nthreads)
        : masked_mean_rows(loss, mask, b, t_len, per_seq, counts, nthreads);
    return status != 0 ? status : masked_mean_rows(per_seq, NULL, 1, b, total, counts, nthreads);
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
    int status = -1;
    if (loss && per_seq && counts) {
        float *clipped = loss + n;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t i = 0; i < n; i++)
            loss[i] = ppo_token_loss(logp[i], old_logp[i], advantages[i], ratio_low, ratio_high, dual_clip,
                                     ratio_clamp, &clipped[i]);
        status = ppo_aggregate(agg, loss, mask, b, t_len, per_seq, counts, &result[0], nthreads);
        if (status == 0)
            status = masked_mean_rows(clipped, mask, 1, n, &result[1], counts, nthreads);
    }
    free(loss);
    free(per_seq);
    free(counts);
    return status;
}
