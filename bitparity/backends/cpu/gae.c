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

/* GAE of rewards, values, mask [B, T], bootstrap [B] into adv, ret [B, T]:
 * sequences are independent, so they are split over threads; each runs its
 * recurrence alone and in order. */
void bp_gae(const float *rewards, const float *values, const uint8_t *mask, const float *bootstrap,
            int64_t b, int64_t t_len, float g, float gl, int zero_mode, float *adv, float *ret, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < b; i++) {
        int64_t o = i * t_len;
        if (zero_mode)
            gae_row(1, rewards + o, values + o, mask + o, t_len, bootstrap[i], g, gl, adv + o, ret + o);
        else
            gae_row(0, rewards + o, values + o, mask + o, t_len, bootstrap[i], g, gl, adv + o, ret + o);
    }
}
