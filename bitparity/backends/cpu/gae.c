/* gae (spec 14) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* One sequence's GAE (spec 14), t = T-1 down to 0, from next_v = bootstrap, last = +0.0.
 * carry (verl): delta = (r + g * next_v) - v; cand = delta + gl * last;
 *               next_v = m ? v : next_v; last = m ? cand : last; adv = last; ret = last + v.
 * zero (TRL):   r, v = m ? r, v : 0; delta as above; last = delta + gl * last; next_v = v;
 *               adv = m ? last : 0; ret = m ? last + v : 0. */
ALWAYS_INLINE void gae_row(int zero_mode, const float *r, const float *v, const uint8_t *m, int64_t t_len,
                           float bootstrap, float g, float gl, float *adv, float *ret)
{
    float next_v = bootstrap, last = 0.0f;
    for (int64_t t = t_len - 1; t >= 0; t--) {
        if (zero_mode) {
            float rt = m[t] ? r[t] : 0.0f, vt = m[t] ? v[t] : 0.0f;
            float delta = (rt + g * next_v) - vt;
            last = delta + gl * last;
            next_v = vt;
            adv[t] = m[t] ? last : 0.0f;
            ret[t] = m[t] ? last + vt : 0.0f;
        } else {
            float delta = (r[t] + g * next_v) - v[t];
            float cand = delta + gl * last;
            next_v = m[t] ? v[t] : next_v;
            last = m[t] ? cand : last;
            adv[t] = last;
            ret[t] = last + v[t];
        }
    }
}

struct gae_job {
    const float *rewards, *values;
    const uint8_t *mask;
    const float *bootstrap;
    int64_t t_len;
    float g, gl;
    int zero_mode;
    float *adv, *ret;
};

/* The sequences [begin, end). */
static void gae_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct gae_job *c = ctx;
    for (int64_t i = begin; i < end; i++) {
        int64_t o = i * c->t_len;
        if (c->zero_mode)
            gae_row(1, c->rewards + o, c->values + o, c->mask + o, c->t_len, c->bootstrap[i], c->g, c->gl,
                    c->adv + o, c->ret + o);
        else
            gae_row(0, c->rewards + o, c->values + o, c->mask + o, c->t_len, c->bootstrap[i], c->g, c->gl,
                    c->adv + o, c->ret + o);
    }
}

/* GAE of rewards, values, mask [B, T], bootstrap [B] into adv, ret [B, T]:
 * sequences are independent, so they are split over threads; each runs its
 * recurrence alone and in order. */
void bp_gae(const float *rewards, const float *values, const uint8_t *mask, const float *bootstrap,
            int64_t b, int64_t t_len, float g, float gl, int zero_mode, float *adv, float *ret, int nthreads)
{
    const struct gae_job c = {rewards, values, mask, bootstrap, t_len, g, gl, zero_mode, adv, ret};
    bp_parallel_for(gae_span, &c, b, nthreads);
}
