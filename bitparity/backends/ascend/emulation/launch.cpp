// ctypes entry points of the host emulation: each runs one kernel of
// kernels/*.cpp on `blocks` emulated AI cores (bp_emulation::Launch).  The NPU
// build launches the same kernels with <<<blocks, nullptr, stream>>> instead
// (npu/bitparity_npu.cpp).  A test double, not an NPU.  Each returns 0, or 1
// with the reason in bp_emulation_last_error().

#include "kernel_operator.h"

extern "C" {

void bitparity_sum(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t hasMask);
void bitparity_logsumexp(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                         uint32_t hasMask);
void bitparity_log_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                           uint32_t hasMask);
void bitparity_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                       uint32_t hasMask);
void bitparity_entropy(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                       uint32_t hasMask);
void bitparity_token_logprobs(GM_ADDR x, GM_ADDR tokens, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols);
void bitparity_exp(GM_ADDR x, GM_ADDR y, uint32_t n);
void bitparity_log(GM_ADDR x, GM_ADDR y, uint32_t n);
void bitparity_masked_mean(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t hasMask);
void bitparity_masked_whiten(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t shiftMean,
                             uint32_t unbiased, float eps, uint32_t epsMode);
void bitparity_kl_penalty(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR out, uint32_t n, uint32_t kind, float clamp,
                          float logRatioClamp);
void bitparity_gae(GM_ADDR rewards, GM_ADDR values, GM_ADDR mask, GM_ADDR bootstrap, GM_ADDR advantages,
                   GM_ADDR returns, uint32_t rows, uint32_t cols, float gamma, float gammaLambda, uint32_t zeroMode);
void bitparity_ppo_token_losses(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR loss, GM_ADDR clipped,
                                uint32_t n, float ratioLow, float ratioHigh, float dualClip, float ratioClamp);
void bitparity_philox(GM_ADDR counters, GM_ADDR keys, GM_ADDR out, uint32_t n);
void bitparity_topk(GM_ADDR x, GM_ADDR values, GM_ADDR indices, uint32_t rows, uint32_t cols, uint32_t k);
void bitparity_filter_logits(GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP, GM_ADDR minP, GM_ADDR out,
                             uint32_t rows, uint32_t cols);
void bitparity_sample(GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP, GM_ADDR minP, GM_ADDR greedy,
                      GM_ADDR seeds, GM_ADDR positions, GM_ADDR tokens, uint32_t rows, uint32_t cols);
void bitparity_linear_quantise(GM_ADDR v, GM_ADDR digits, GM_ADDR meta, uint32_t rows, uint32_t cols,
                               uint32_t rowsPadded, uint32_t colsPadded, uint32_t isWeight);
void bitparity_linear_digits(GM_ADDR a, GM_ADDR b, GM_ADDR t, uint32_t mPad, uint32_t nPad, uint32_t kPad);
void bitparity_linear_round(GM_ADDR t, GM_ADDR metaX, GM_ADDR metaW, GM_ADDR x, GM_ADDR w, GM_ADDR bias, GM_ADDR y,
                            uint32_t m, uint32_t n, uint32_t k, uint32_t mPad, uint32_t nPad, uint32_t hasBias);
void bitparity_rms_norm(GM_ADDR x, GM_ADDR weight, GM_ADDR y, uint32_t rows, uint32_t cols, float eps);
void bitparity_rotary(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR y, uint32_t rows, uint32_t cols);
void bitparity_attention(GM_ADDR q, GM_ADDR kT, GM_ADDR v, GM_ADDR kvLengths, GM_ADDR out, uint32_t groups,
                         uint32_t tq, uint32_t tk, uint32_t d, uint32_t causal, float scale);
void bitparity_silu_mul(GM_ADDR gate, GM_ADDR up, GM_ADDR out, uint32_t n);
void bitparity_logsumexp_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out, uint32_t rows,
                                  uint32_t cols, uint32_t hasMask);
void bitparity_log_softmax_backward(GM_ADDR y, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out, uint32_t rows,
                                    uint32_t cols, uint32_t hasMask);
void bitparity_softmax_backward(GM_ADDR p, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out, uint32_t rows,
                                uint32_t cols, uint32_t hasMask);
void bitparity_entropy_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR h, GM_ADDR g, GM_ADDR out,
                                uint32_t rows, uint32_t cols, uint32_t hasMask);
void bitparity_token_logprobs_backward(GM_ADDR x, GM_ADDR tokens, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                                       uint32_t rows, uint32_t cols);
void bitparity_masked_mean_backward(GM_ADDR mask, GM_ADDR g, GM_ADDR out, uint32_t rows, uint32_t cols);
void bitparity_masked_whiten_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR g, GM_ADDR out, uint32_t rows, uint32_t cols,
                                      uint32_t shiftMean, uint32_t unbiased, float eps, uint32_t epsMode);
void bitparity_kl_penalty_backward(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR g, GM_ADDR out, uint32_t n, uint32_t kind,
                                   float clamp, float logRatioClamp);
void bitparity_ppo_token_weights(GM_ADDR mask, GM_ADDR g, GM_ADDR weights, uint32_t rows, uint32_t cols,
                                 uint32_t agg);
void bitparity_ppo_policy_loss_backward(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR mask,
                                        GM_ADDR weights, GM_ADDR out, uint32_t rows, uint32_t cols, float ratioLow,
                                        float ratioHigh, float dualClip, float ratioClamp);
void bitparity_fold_rows(GM_ADDR c, GM_ADDR order, GM_ADDR positions, GM_ADDR starts, GM_ADDR out, uint32_t m,
                         uint32_t f, uint32_t segments, uint32_t rows);
void bitparity_rms_norm_backward(GM_ADDR x, GM_ADDR weight, GM_ADDR g, GM_ADDR dx, GM_ADDR terms, uint32_t rows,
                                 uint32_t cols, float eps);
void bitparity_silu_mul_backward(GM_ADDR gate, GM_ADDR up, GM_ADDR g, GM_ADDR dGate, GM_ADDR dUp, uint32_t n);
void bitparity_adamw_step(GM_ADDR w, GM_ADDR g, GM_ADDR m, GM_ADDR v, GM_ADDR wOut, GM_ADDR mOut, GM_ADDR vOut,
                          uint32_t n, uint32_t hasDecay, float decay, float b1, float c1, float b2, float c2,
                          float ibc2, float eps, float step);
void bitparity_sgd_step(GM_ADDR w, GM_ADDR g, GM_ADDR buffer, GM_ADDR wOut, GM_ADDR bufferOut, uint32_t n, float lr,
                        float momentum, float oneMinusDampening, float weightDecay, uint32_t nesterov,
                        uint32_t hasBuffer);
void bitparity_attention_query_grad(GM_ADDR q, GM_ADDR kT, GM_ADDR k, GM_ADDR vT, GM_ADDR g, GM_ADDR kvLengths,
                                    GM_ADDR dq, GM_ADDR stats, uint32_t groups, uint32_t tq, uint32_t tk, uint32_t d,
                                    uint32_t causal, float scale);
void bitparity_attention_backward(GM_ADDR q, GM_ADDR qT, GM_ADDR k, GM_ADDR v, GM_ADDR g, GM_ADDR gT,
                                  GM_ADDR kvLengths, GM_ADDR stats, GM_ADDR dk, GM_ADDR dv, uint32_t groups,
                                  uint32_t tq, uint32_t tk, uint32_t d, uint32_t causal, float scale);

int bp_sum(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_sum(x, mask, out, rows, cols, hasMask); });
}

int bp_logsumexp(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                 uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_logsumexp(x, mask, scale, out, rows, cols, hasMask); });
}

int bp_log_softmax(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows,
                   uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_log_softmax(x, mask, scale, out, rows, cols, hasMask); });
}

int bp_softmax(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
               uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_softmax(x, mask, scale, out, rows, cols, hasMask); });
}

int bp_entropy(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
               uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_entropy(x, mask, scale, out, rows, cols, hasMask); });
}

int bp_token_logprobs(uint32_t blocks, GM_ADDR x, GM_ADDR tokens, GM_ADDR scale, GM_ADDR out, uint32_t rows,
                      uint32_t cols)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_token_logprobs(x, tokens, scale, out, rows, cols); });
}

int bp_exp(uint32_t blocks, GM_ADDR x, GM_ADDR y, uint32_t n)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_exp(x, y, n); });
}

int bp_log(uint32_t blocks, GM_ADDR x, GM_ADDR y, uint32_t n)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_log(x, y, n); });
}

int bp_masked_mean(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols,
                   uint32_t hasMask)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_masked_mean(x, mask, out, rows, cols, hasMask); });
}

int bp_masked_whiten(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols,
                     uint32_t shiftMean, uint32_t unbiased, float eps, uint32_t epsMode)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_masked_whiten(x, mask, out, rows, cols, shiftMean, unbiased, eps, epsMode);
    });
}

int bp_kl_penalty(uint32_t blocks, GM_ADDR logp, GM_ADDR refLogp, GM_ADDR out, uint32_t n, uint32_t kind,
                  float clamp, float logRatioClamp)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_kl_penalty(logp, refLogp, out, n, kind, clamp, logRatioClamp); });
}

int bp_gae(uint32_t blocks, GM_ADDR rewards, GM_ADDR values, GM_ADDR mask, GM_ADDR bootstrap, GM_ADDR advantages,
           GM_ADDR returns, uint32_t rows, uint32_t cols, float gamma, float gammaLambda, uint32_t zeroMode)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_gae(rewards, values, mask, bootstrap, advantages, returns, rows, cols, gamma, gammaLambda, zeroMode);
    });
}

int bp_ppo_token_losses(uint32_t blocks, GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR loss,
                        GM_ADDR clipped, uint32_t n, float ratioLow, float ratioHigh, float dualClip, float ratioClamp)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_ppo_token_losses(logp, oldLogp, advantages, loss, clipped, n, ratioLow, ratioHigh, dualClip,
                                   ratioClamp);
    });
}

int bp_philox(uint32_t blocks, GM_ADDR counters, GM_ADDR keys, GM_ADDR out, uint32_t n)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_philox(counters, keys, out, n); });
}

int bp_topk(uint32_t blocks, GM_ADDR x, GM_ADDR values, GM_ADDR indices, uint32_t rows, uint32_t cols, uint32_t k)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_topk(x, values, indices, rows, cols, k); });
}

int bp_filter_logits(uint32_t blocks, GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP, GM_ADDR minP,
                     GM_ADDR out, uint32_t rows, uint32_t cols)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_filter_logits(x, scale, topK, topP, minP, out, rows, cols); });
}

int bp_sample(uint32_t blocks, GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP, GM_ADDR minP, GM_ADDR greedy,
              GM_ADDR seeds, GM_ADDR positions, GM_ADDR tokens, uint32_t rows, uint32_t cols)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_sample(x, scale, topK, topP, minP, greedy, seeds, positions, tokens, rows, cols);
    });
}

// Four launches, in order on one stream as the binding queues them: x's rows and the weight's rows to digits
// (kernels/linear.cpp pads rows to 16 and K to 32), the digit products on the Cube unit, the rounding.
// Workspaces: digitsX int8 [5, mPad, kPad], digitsW int8 [4, nPad, kPad], metaX int32 [mPad, 8], metaW int32
// [nPad, 8], t int32 [chunks, 8, mPad, nPad] (five digits of x's 39 bits, four of the weight's 29).
int bp_linear(uint32_t blocks, GM_ADDR x, GM_ADDR weight, GM_ADDR bias, GM_ADDR y, GM_ADDR digitsX, GM_ADDR digitsW,
              GM_ADDR metaX, GM_ADDR metaW, GM_ADDR t, uint32_t m, uint32_t k, uint32_t n, uint32_t hasBias)
{
    const uint32_t mPad = (m + 15) / 16 * 16, nPad = (n + 15) / 16 * 16, kPad = (k + 31) / 32 * 32;
    int status = bp_emulation::Launch(blocks, [&] { bitparity_linear_quantise(x, digitsX, metaX, m, k, mPad, kPad, 0); });
    if (status == 0) {
        status = bp_emulation::Launch(blocks,
                                      [&] { bitparity_linear_quantise(weight, digitsW, metaW, n, k, nPad, kPad, 1); });
    }
    if (status == 0) {
        status = bp_emulation::Launch(blocks, [&] { bitparity_linear_digits(digitsX, digitsW, t, mPad, nPad, kPad); });
    }
    if (status == 0) {
        status = bp_emulation::Launch(blocks, [&] {
            bitparity_linear_round(t, metaX, metaW, x, weight, bias, y, m, n, k, mPad, nPad, hasBias);
        });
    }
    return status;
}

// The tensor-parallel linear's exact partial (spec 31.1): bp_linear's first three launches, without the
// rounding; the host adds the int32 partials t [chunks, 8, mPad, nPad] into int64 planes and carries them.
int bp_linear_exact(uint32_t blocks, GM_ADDR x, GM_ADDR weight, GM_ADDR digitsX, GM_ADDR digitsW, GM_ADDR metaX,
                    GM_ADDR metaW, GM_ADDR t, uint32_t m, uint32_t k, uint32_t n)
{
    const uint32_t mPad = (m + 15) / 16 * 16, nPad = (n + 15) / 16 * 16, kPad = (k + 31) / 32 * 32;
    int status = bp_emulation::Launch(blocks, [&] { bitparity_linear_quantise(x, digitsX, metaX, m, k, mPad, kPad, 0); });
    if (status == 0) {
        status = bp_emulation::Launch(blocks,
                                      [&] { bitparity_linear_quantise(weight, digitsW, metaW, n, k, nPad, kPad, 1); });
    }
    if (status == 0) {
        status = bp_emulation::Launch(blocks, [&] { bitparity_linear_digits(digitsX, digitsW, t, mPad, nPad, kPad); });
    }
    return status;
}

int bp_rms_norm(uint32_t blocks, GM_ADDR x, GM_ADDR weight, GM_ADDR y, uint32_t rows, uint32_t cols, float eps)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_rms_norm(x, weight, y, rows, cols, eps); });
}

int bp_rotary(uint32_t blocks, GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR y, uint32_t rows, uint32_t cols)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_rotary(x, cos, sin, y, rows, cols); });
}

int bp_attention(uint32_t blocks, GM_ADDR q, GM_ADDR kT, GM_ADDR v, GM_ADDR kvLengths, GM_ADDR out, uint32_t groups,
                 uint32_t tq, uint32_t tk, uint32_t d, uint32_t causal, float scale)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_attention(q, kT, v, kvLengths, out, groups, tq, tk, d, causal, scale);
    });
}

int bp_silu_mul(uint32_t blocks, GM_ADDR gate, GM_ADDR up, GM_ADDR out, uint32_t n)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_silu_mul(gate, up, out, n); });
}

// ---- Backward (spec 26) ----

int bp_logsumexp_backward(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                          uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_logsumexp_backward(x, mask, scale, g, out, rows, cols, hasMask); });
}

int bp_log_softmax_backward(uint32_t blocks, GM_ADDR y, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                            uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_log_softmax_backward(y, mask, scale, g, out, rows, cols, hasMask); });
}

int bp_softmax_backward(uint32_t blocks, GM_ADDR p, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                        uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_softmax_backward(p, mask, scale, g, out, rows, cols, hasMask); });
}

int bp_entropy_backward(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR h, GM_ADDR g, GM_ADDR out,
                        uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_entropy_backward(x, mask, scale, h, g, out, rows, cols, hasMask); });
}

int bp_token_logprobs_backward(uint32_t blocks, GM_ADDR x, GM_ADDR tokens, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                               uint32_t rows, uint32_t cols)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_token_logprobs_backward(x, tokens, scale, g, out, rows, cols); });
}

int bp_masked_mean_backward(uint32_t blocks, GM_ADDR mask, GM_ADDR g, GM_ADDR out, uint32_t rows, uint32_t cols)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_masked_mean_backward(mask, g, out, rows, cols); });
}

int bp_masked_whiten_backward(uint32_t blocks, GM_ADDR x, GM_ADDR mask, GM_ADDR g, GM_ADDR out, uint32_t rows,
                              uint32_t cols, uint32_t shiftMean, uint32_t unbiased, float eps, uint32_t epsMode)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_masked_whiten_backward(x, mask, g, out, rows, cols, shiftMean, unbiased, eps, epsMode);
    });
}

int bp_kl_penalty_backward(uint32_t blocks, GM_ADDR logp, GM_ADDR refLogp, GM_ADDR g, GM_ADDR out, uint32_t n,
                           uint32_t kind, float clamp, float logRatioClamp)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_kl_penalty_backward(logp, refLogp, g, out, n, kind, clamp, logRatioClamp);
    });
}

// Two launches, in order on one stream as the binding queues them: the per-row token weights
// (weightBlocks cores), then the per-token gradient (blocks cores).
int bp_ppo_policy_loss_backward(uint32_t weightBlocks, uint32_t blocks, GM_ADDR logp, GM_ADDR oldLogp,
                                GM_ADDR advantages, GM_ADDR mask, GM_ADDR g, GM_ADDR weights, GM_ADDR out,
                                uint32_t rows, uint32_t cols, uint32_t agg, float ratioLow, float ratioHigh,
                                float dualClip, float ratioClamp)
{
    int status = bp_emulation::Launch(weightBlocks,
                                      [&] { bitparity_ppo_token_weights(mask, g, weights, rows, cols, agg); });
    if (status != 0) {
        return status;
    }
    return bp_emulation::Launch(blocks, [&] {
        bitparity_ppo_policy_loss_backward(logp, oldLogp, advantages, mask, weights, out, rows, cols, ratioLow,
                                           ratioHigh, dualClip, ratioClamp);
    });
}

// ---- Training (spec 29) ----

int bp_fold_rows(uint32_t blocks, GM_ADDR c, GM_ADDR order, GM_ADDR positions, GM_ADDR starts, GM_ADDR out,
                 uint32_t m, uint32_t f, uint32_t segments, uint32_t rows)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_fold_rows(c, order, positions, starts, out, m, f, segments, rows); });
}

int bp_rms_norm_backward(uint32_t blocks, GM_ADDR x, GM_ADDR weight, GM_ADDR g, GM_ADDR dx, GM_ADDR terms,
                         uint32_t rows, uint32_t cols, float eps)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_rms_norm_backward(x, weight, g, dx, terms, rows, cols, eps); });
}

int bp_silu_mul_backward(uint32_t blocks, GM_ADDR gate, GM_ADDR up, GM_ADDR g, GM_ADDR dGate, GM_ADDR dUp, uint32_t n)
{
    return bp_emulation::Launch(blocks, [&] { bitparity_silu_mul_backward(gate, up, g, dGate, dUp, n); });
}

int bp_adamw_step(uint32_t blocks, GM_ADDR w, GM_ADDR g, GM_ADDR m, GM_ADDR v, GM_ADDR wOut, GM_ADDR mOut,
                  GM_ADDR vOut, uint32_t n, uint32_t hasDecay, float decay, float b1, float c1, float b2, float c2,
                  float ibc2, float eps, float step)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_adamw_step(w, g, m, v, wOut, mOut, vOut, n, hasDecay, decay, b1, c1, b2, c2, ibc2, eps, step);
    });
}

int bp_sgd_step(uint32_t blocks, GM_ADDR w, GM_ADDR g, GM_ADDR buffer, GM_ADDR wOut, GM_ADDR bufferOut, uint32_t n,
                float lr, float momentum, float oneMinusDampening, float weightDecay, uint32_t nesterov,
                uint32_t hasBuffer)
{
    return bp_emulation::Launch(blocks, [&] {
        bitparity_sgd_step(w, g, buffer, wOut, bufferOut, n, lr, momentum, oneMinusDampening, weightDecay, nesterov,
                           hasBuffer);
    });
}

// Two launches, in order on one stream as the binding queues them: per query, dq and the statistics
// (queryBlocks cores); then per key, dk and dv (keyBlocks cores).
int bp_attention_backward(uint32_t queryBlocks, uint32_t keyBlocks, GM_ADDR q, GM_ADDR kT, GM_ADDR k, GM_ADDR vT,
                          GM_ADDR v, GM_ADDR qT, GM_ADDR g, GM_ADDR gT, GM_ADDR kvLengths, GM_ADDR stats, GM_ADDR dq,
                          GM_ADDR dk, GM_ADDR dv, uint32_t groups, uint32_t tq, uint32_t tk, uint32_t d,
                          uint32_t causal, float scale)
{
    int status = bp_emulation::Launch(queryBlocks, [&] {
        bitparity_attention_query_grad(q, kT, k, vT, g, kvLengths, dq, stats, groups, tq, tk, d, causal, scale);
    });
    if (status != 0) {
        return status;
    }
    return bp_emulation::Launch(keyBlocks, [&] {
        bitparity_attention_backward(q, qT, k, v, g, gT, kvLengths, stats, dk, dv, groups, tq, tk, d, causal, scale);
    });
}

}  // extern "C"
