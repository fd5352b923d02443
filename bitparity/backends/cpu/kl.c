/* kl_penalty (spec 16) for the `cpu` backend, and its backward (spec 26.9).
 * canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* d^2 * phi(d) with phi's Taylor series (Horner from the highest degree): e^d - 1 - d for |d| < 1
 * (spec 16), which k3 and, plus d, its derivative e^d - 1 (spec 26.9) both use. */
ALWAYS_INLINE float k3_series(float d)
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
    return (d * d) * phi;
}

ALWAYS_INLINE int k3_uses_series(float d) { return abs_f32(d) < float_of(BP_K3_SERIES_LIMIT_BITS); }

/* e^d - 1 - d without cancellation (spec 16): the series for |d| < 1, else (exp(d) - 1) - d. */
ALWAYS_INLINE float canonical_k3(float d)
{
    float direct = (canonical_exp(d) - 1.0f) - d;
    float out = k3_uses_series(d) ? k3_series(d) : direct;
    return d == POS_INF ? POS_INF : out;
}

/* k3'(d) = e^d - 1 (spec 26.9): d + d^2 * phi(d) for |d| < 1, else exp(d) - 1 (+inf at +inf, -1 at -inf). */
ALWAYS_INLINE float k3_derivative(float d)
{
    float direct = canonical_exp(d) - 1.0f;
    return k3_uses_series(d) ? d + k3_series(d) : direct;
}

enum kl_kind { KL_K1, KL_K2, KL_K3, KL_ABS };

/* The estimator of kind at d, before the clamp (spec 16). */
ALWAYS_INLINE float kl_estimate(enum kl_kind kind, float d)
{
    switch (kind) {
    case KL_K1: return -d;
    case KL_K2: return (d * d) * float_of(BP_HALF_BITS);
    case KL_K3: return canonical_k3(d);
    default: return abs_f32(d);
    }
}

/* One estimator of d = clamp(ref - logp, ±log_ratio_clamp), clamped to ±clamp (spec 16). */
ALWAYS_INLINE float kl_term(enum kl_kind kind, float logp, float ref, float clamp, float log_ratio_clamp)
{
    float d = clamp_prop(ref - logp, -log_ratio_clamp, log_ratio_clamp);
    return clamp_prop(kl_estimate(kind, d), -clamp, clamp);
}

/* The gradient w.r.t. ref of one estimator, times g (spec 26.9), in this order:
 *   d0 = ref - logp, d = clamp(d0, ±log_ratio_clamp);
 *   k1: -g (sign flip); abs: g * select(d != d, d, sign(d)) (0 at d = ±0); k2: g * d; k3: g * k3'(d);
 *   +0.0 where the estimator (before its clamp) is outside ±clamp, then where d0 is outside
 *   ±log_ratio_clamp.  An unset clamp is +inf, outside of which nothing lies. */
ALWAYS_INLINE float kl_gradient(enum kl_kind kind, float logp, float ref, float g, float clamp,
                                float log_ratio_clamp)
{
    float d0 = ref - logp;
    float d = clamp_prop(d0, -log_ratio_clamp, log_ratio_clamp);
    float gd;
    switch (kind) {
    case KL_K1: gd = -g; break;
    case KL_K2: gd = g * d; break;
    case KL_K3: gd = g * k3_derivative(d); break;
    default: {
        float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
        gd = g * (d != d ? d : sign);
        break;
    }
    }
    gd = outside(kl_estimate(kind, d), clamp) ? 0.0f : gd;
    return outside(d0, log_ratio_clamp) ? 0.0f : gd;
}

/* One block of the forward (g NULL) or of the backward: two loops, each branch-free. */
ALWAYS_INLINE void kl_block(enum kl_kind kind, const float *logp, const float *ref, const float *g, int64_t len,
                            float clamp, float log_ratio_clamp, float *out)
{
    if (g == NULL) {
        for (int64_t i = 0; i < len; i++)
            out[i] = kl_term(kind, logp[i], ref[i], clamp, log_ratio_clamp);
    } else {
        for (int64_t i = 0; i < len; i++)
            out[i] = kl_gradient(kind, logp[i], ref[i], g[i], clamp, log_ratio_clamp);
    }
}

/* Elements per work item of kl_run: the kind is dispatched once per block. */
#define KL_BLOCK 4096

struct kl_job {
    const float *logp, *ref, *g;
    int64_t n;
    int kind;
    float clamp, log_ratio_clamp;
    float *out;
};

/* The blocks [begin, end) of KL_BLOCK elements (the last one shorter). */
static void kl_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct kl_job *c = ctx;
    for (int64_t block = begin; block < end; block++) {
        int64_t s = block * KL_BLOCK;
        int64_t len = c->n - s < KL_BLOCK ? c->n - s : KL_BLOCK;
        const float *logp = c->logp + s, *ref = c->ref + s, *gs = c->g ? c->g + s : NULL;
        float *out = c->out + s;
        switch (c->kind) {
        case KL_K1: kl_block(KL_K1, logp, ref, gs, len, c->clamp, c->log_ratio_clamp, out); break;
        case KL_K2: kl_block(KL_K2, logp, ref, gs, len, c->clamp, c->log_ratio_clamp, out); break;
        case KL_K3: kl_block(KL_K3, logp, ref, gs, len, c->clamp, c->log_ratio_clamp, out); break;
        default: kl_block(KL_ABS, logp, ref, gs, len, c->clamp, c->log_ratio_clamp, out); break;
        }
    }
}

/* Element-wise over logp, ref (and g) [n] into out [n], in blocks over threads; kind is an enum kl_kind;
 * an unset clamp is +inf (see clamp_prop).  Each block runs the loop compiled for its constant kind. */
static void kl_run(const float *logp, const float *ref, const float *g, int64_t n, int kind, float clamp,
                   float log_ratio_clamp, float *out, int nthreads)
{
    const struct kl_job c = {logp, ref, g, n, kind, clamp, log_ratio_clamp, out};
    bp_parallel_for(kl_span, &c, (n + KL_BLOCK - 1) / KL_BLOCK, nthreads);
}

/* The KL estimator of logp, ref [n] into out [n]. */
void bp_kl_penalty(const float *logp, const float *ref, int64_t n, int kind, float clamp,
                   float log_ratio_clamp, float *out, int nthreads)
{
    kl_run(logp, ref, NULL, n, kind, clamp, log_ratio_clamp, out, nthreads);
}

/* Its gradient w.r.t. ref [n] for the upstream gradient g [n] into out [n]; ops.py flips its sign for logp. */
void bp_kl_penalty_backward(const float *logp, const float *ref, const float *g, int64_t n, int kind, float clamp,
                            float log_ratio_clamp, float *out, int nthreads)
{
    kl_run(logp, ref, g, n, kind, clamp, log_ratio_clamp, out, nthreads);
}
