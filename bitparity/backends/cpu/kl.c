/* kl_penalty (spec 16) for the `cpu` backend.
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* e^d - 1 - d without cancellation (spec 16): d^2 * phi(d) by phi's Taylor
 * series (Horner from the highest degree) for |d| < 1, else (exp(d) - 1) - d. */
ALWAYS_INLINE float canonical_k3(float d)
{
    float phi = float_of(BP_K3_P0);
    phi = phi * d + float_of(BP_K3_P1);
    phi = phi * d + float_of(BP_K3_P2);
    phi = phi * d + float_of(BP_K3_P3);
    phi = phi * d + float_of(BP_K3_P4);
    phi = phi * d + float_of(BP_K3_P5);
    phi = phi * d + float_of(BP_K3_P6);
    phi = phi * d + float_of(BP_K3_P7);
    phi = phi * d + float_of(BP_K3_P8);
    phi = phi * d + float_of(BP_K3_P9);
    phi = phi * d + float_of(BP_K3_P10);
    float series = (d * d) * phi;
    float direct = (canonical_exp(d) - 1.0f) - d;
    float out = abs_f32(d) < float_of(BP_K3_SERIES_LIMIT_BITS) ? series : direct;
    return d == POS_INF ? POS_INF : out;
}

enum kl_kind { KL_K1, KL_K2, KL_K3, KL_ABS };

/* One estimator of d = clamp(ref - logp, ±log_ratio_clamp), clamped to ±clamp (spec 16). */
ALWAYS_INLINE float kl_term(enum kl_kind kind, float logp, float ref, float clamp, float log_ratio_clamp)
{
    float d = clamp_prop(ref - logp, -log_ratio_clamp, log_ratio_clamp);
    float k;
    switch (kind) {
    case KL_K1: k = -d; break;
    case KL_K2: k = (d * d) * float_of(BP_HALF_BITS); break;
    case KL_K3: k = canonical_k3(d); break;
    default: k = abs_f32(d); break;
    }
    return clamp_prop(k, -clamp, clamp);
}

ALWAYS_INLINE void kl_block(enum kl_kind kind, const float *logp, const float *ref, int64_t len, float clamp,
                            float log_ratio_clamp, float *out)
{
    for (int64_t i = 0; i < len; i++)
        out[i] = kl_term(kind, logp[i], ref[i], clamp, log_ratio_clamp);
}

/* Elements per work item of bp_kl_penalty: the kind is dispatched once per block. */
#define KL_BLOCK 4096

/* Element-wise KL estimator of logp, ref [n] into out [n]; kind is an enum
 * kl_kind; an unset clamp is +inf (see clamp_prop).  Each block runs the loop
 * compiled for its constant kind, so the loop is branch-free. */
void bp_kl_penalty(const float *logp, const float *ref, int64_t n, int kind, float clamp,
                   float log_ratio_clamp, float *out, int nthreads)
{
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t s = 0; s < n; s += KL_BLOCK) {
        int64_t len = n - s < KL_BLOCK ? n - s : KL_BLOCK;
        switch (kind) {
        case KL_K1: kl_block(KL_K1, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        case KL_K2: kl_block(KL_K2, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        case KL_K3: kl_block(KL_K3, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        default: kl_block(KL_ABS, logp + s, ref + s, len, clamp, log_ratio_clamp, out + s); break;
        }
    }
}
