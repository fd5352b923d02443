/* AdamW and SGD steps (spec 29.12) for the `cpu` backend, element-wise, with
 * the square root of spec 29.10 and the general reciprocal of spec 29.11.  The
 * host values (step, ibc2, decay, ...) arrive as binary32 numbers made by the
 * caller.  canonical.h says why the bits cannot depend on the build. */

#include "canonical.h"

/* sqrt for y >= 0 (spec 29.10): s = y * rsqrt(y), then one correction by the residual y - s * s, whose
 * rounding error err the split makes exact; +0.0 below the smallest normal, +inf at +inf, NaN propagates. */
ALWAYS_INLINE float sqrt32(float y)
{
    int small = y < float_of(BP_MIN_NORMAL_BITS);
    float safe = small ? 1.0f : y;
    float r = canonical_rsqrt(safe);
    float s = safe * r;
    float p = s * s;
    float sh, sl;
    veltkamp_split(s, &sh, &sl);
    float err = ((sh * sh - p) + (sh * sl + sh * sl)) + sl * sl;      /* s*s - p, exactly */
    s = s + ((safe - p) - err) * (float_of(BP_HALF_BITS) * r);
    s = y == POS_INF ? POS_INF : s;
    return small ? 0.0f : s;
}

/* 1/d for d in [2^-126, +inf] or NaN (spec 29.11): with d = m * 2^e, m in [1, 2), reciprocal(m) (spec 7) times
 * 2^-e, an exact scaling; for e = 127, 2^-127 is not normal and the scaling is by 0.5, then 2^-126.  +inf gives
 * +0.0 (its e = 128 would scale by -inf) and NaN propagates.  The scale's bits are (127 - e) << 23 in uint32. */
ALWAYS_INLINE float recip(float d)
{
    int32_t e = ((int32_t)bits_of(d) >> 23) - 127;
    float mantissa = float_of((bits_of(d) & 0x007FFFFFu) | BP_ONE_BITS);
    float r = canonical_reciprocal(mantissa);
    int low = e == 127;
    float scale = float_of((uint32_t)(127 - (low ? 126 : e)) << 23);
    float out = low ? (r * float_of(BP_HALF_BITS)) * scale : r * scale;
    out = d != d ? d : out;
    return d == POS_INF ? 0.0f : out;
}

/* c2 * (g * g) as if g * g had an unbounded exponent (spec 29.12): where g * g overflows (|g| >= 2^64),
 * ((c2 * (h * h)) * 2^64) * 2^64 with h = g * 2^-64, the same roundings scaled by exact powers of two. */
ALWAYS_INLINE float scaled_square_term(float g, float c2)
{
    float gg = g * g;
    float h = g * float_of(BP_TWO_M64_BITS);
    float scaled = ((c2 * (h * h)) * float_of(BP_TWO_P64_BITS)) * float_of(BP_TWO_P64_BITS);
    return gg == POS_INF ? scaled : c2 * gg;
}

struct adamw_job {
    const float *w, *g, *m, *v;
    int decayed;
    float decay, b1, c1, b2, c2, ibc2, eps, step;
    float *w_out, *m_out, *v_out;
};

/* Elements [begin, end) of one AdamW step (spec 29.12), in this order:
 *   w = w * decay (decayed != 0: weight_decay != 0);  m = b1 * m + c1 * g;  v = b2 * v + c2 * (g * g) (the
 *   square scaled where it overflows: scaled_square_term);
 *   den = sqrt32(v) * ibc2 + eps;  w = w - (m * recip(den)) * step.
 * The outputs are restrict (new tensors, apart from the inputs and each other): with seven arrays gcc would
 * need more run-time overlap tests than it makes (10) and leave the loop scalar. */
static void adamw_elements(const struct adamw_job *job, float *restrict w_out, float *restrict m_out,
                           float *restrict v_out, int64_t begin, int64_t end)
{
    /* a local copy: decay read under the condition per element would be a masked load, which gcc leaves scalar */
    const struct adamw_job c = *job;
    for (int64_t i = begin; i < end; i++) {
        float w = c.w[i], g = c.g[i];
        w = c.decayed ? w * c.decay : w;
        float m = c.b1 * c.m[i] + c.c1 * g;
        float v = c.b2 * c.v[i] + scaled_square_term(g, c.c2);
        float den = sqrt32(v) * c.ibc2 + c.eps;
        w_out[i] = w - (m * recip(den)) * c.step;
        m_out[i] = m;
        v_out[i] = v;
    }
}

/* adamw_elements into the job's outputs. */
static void adamw_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct adamw_job *c = ctx;
    adamw_elements(c, c->w_out, c->m_out, c->v_out, begin, end);
}

/* One AdamW step over w, g, m, v [n] into w_out, m_out, v_out [n]: independent elements, split over threads. */
void bp_adamw_step(const float *w, const float *g, const float *m, const float *v, int64_t n, int decayed,
                   float decay, float b1, float c1, float b2, float c2, float ibc2, float eps, float step,
                   float *w_out, float *m_out, float *v_out, int nthreads)
{
    const struct adamw_job c = {w, g, m, v, decayed, decay, b1, c1, b2, c2, ibc2, eps, step, w_out, m_out, v_out};
    bp_parallel_for(adamw_span, &c, n, nthreads);
}

struct sgd_job {
    const float *w, *g, *buf;       /* buf NULL: the first step */
    float lr, momentum, one_minus_dampening, weight_decay;
    int nesterov;
    float *w_out, *buf_out;         /* buf_out written when momentum != 0 */
};

/* Elements [begin, end) of one SGD step (spec 29.12), in this order:
 *   g = g + weight_decay * w (weight_decay != 0);
 *   buf = g on the first step, else momentum * buf + one_minus_dampening * g;  g = nesterov ? g + momentum * buf
 *   : buf (both when momentum != 0);  w = w - lr * g. */
static void sgd_span(const void *ctx, int64_t begin, int64_t end)
{
    const struct sgd_job c = *(const struct sgd_job *)ctx;        /* a local copy: no store can change it */
    for (int64_t i = begin; i < end; i++) {
        float g = c.weight_decay != 0.0f ? c.g[i] + c.weight_decay * c.w[i] : c.g[i];
        if (c.momentum != 0.0f) {
            float b = c.buf ? c.momentum * c.buf[i] + c.one_minus_dampening * g : g;
            c.buf_out[i] = b;
            g = c.nesterov ? g + c.momentum * b : b;
        }
        c.w_out[i] = c.w[i] - c.lr * g;
    }
}

/* One SGD step over w, g [n] and buf [n] (NULL on the first step) into w_out and, when momentum != 0,
 * buf_out [n]: independent elements, split over threads. */
void bp_sgd_step(const float *w, const float *g, const float *buf, int64_t n, float lr, float momentum,
                 float one_minus_dampening, float weight_decay, int nesterov, float *w_out, float *buf_out,
                 int nthreads)
{
    const struct sgd_job c = {w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov, w_out, buf_out};
    bp_parallel_for(sgd_span, &c, n, nthreads);
}
