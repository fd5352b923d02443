// ppo_token_losses: verl's clipped PPO surrogate per token (spec 17.1) as an Ascend C kernel for Atlas A2.
//
//   logp, oldLogp, advantages: f32[n] (GM, the [B, T] tokens in row-major order);
//   loss: f32[n]; clipped: f32[n], 1.0 where the clipped loss won, else 0.0.
//   ratioLow, ratioHigh: the float32 ratio bounds; dualClip, ratioClamp: float32
//   values, +inf when unset.
//
// Each token is computed on its own, in the spec's order:
//   d = logp - oldLogp; d = min(max(d, -ratioClamp), ratioClamp)    (NaN-propagating)
//   ratio = exp(d); na = -advantages
//   loss1 = na * ratio; loss2 = na * min(max(ratio, ratioLow), ratioHigh)
//   clipped = loss2 > loss1; loss = max(loss1, loss2)               (NaN-propagating)
//   loss = select(advantages < 0, min(na * dualClip, loss), loss)    (NaN-propagating)
// An unset bound is +inf, which changes no bit: a clamp to [-inf, inf] is the
// identity, and where advantages < 0, na > 0 so na * inf = inf and
// min(inf, loss) = loss.  Which zero Max/Min return on a tie never matters:
// loss1 and loss2 both carry na's sign (ratio >= +0, the clipped ratio > 0), and
// so do na * dualClip and loss where advantages < 0.
//
// The aggregation (spec 17.2) is not here: the binding reduces loss and clipped
// with the canonical masked mean and sum kernels (masked.cpp, reduce.cpp).
// Tiling as in elementwise.cpp.
//
// UB budget (bytes): logp, old, adv 3 x 2 x 4096 (VECIN), loss, clipped
// 2 x 2 x 4096 (VECOUT), d, ratio, na, loss1, loss2, tmp 6 x 4096, work 16384,
// bits 128: 82,048 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

class KernelPpoTokens {
public:
    __aicore__ inline KernelPpoTokens() {}

    __aicore__ inline void Init(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR loss, GM_ADDR clipped,
                                uint32_t n, float ratioLow, float ratioHigh, float dualClip, float ratioClamp)
    {
        this->n = n;
        this->ratioLow = ratioLow;
        this->ratioHigh = ratioHigh;
        this->dualClip = dualClip;
        this->ratioClamp = ratioClamp;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        logpGm.SetGlobalBuffer((__gm__ float*)logp, n);
        oldGm.SetGlobalBuffer((__gm__ float*)oldLogp, n);
        advGm.SetGlobalBuffer((__gm__ float*)advantages, n);
        lossGm.SetGlobalBuffer((__gm__ float*)loss, n);
        clippedGm.SetGlobalBuffer((__gm__ float*)clipped, n);
        pipe.InitBuffer(logpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(oldQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(advQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(lossQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(clippedQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(ratioBuf, LANES * sizeof(float));
        pipe.InitBuffer(naBuf, LANES * sizeof(float));
        pipe.InitBuffer(loss1Buf, LANES * sizeof(float));
        pipe.InitBuffer(loss2Buf, LANES * sizeof(float));
        pipe.InitBuffer(tmpBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t t = share.begin; t < share.end; ++t) {
            uint64_t offset = static_cast<uint64_t>(t) * LANES;
            uint32_t len = n - offset < LANES ? static_cast<uint32_t>(n - offset) : LANES;
            CopyIn(offset, len);
            Compute(RoundUp(len, FLOATS_PER_REPEAT));
            CopyOut(offset, len);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> logp = logpQueue.AllocTensor<float>();
        LoadChunk(logp, logpGm[offset], len);
        logpQueue.EnQue(logp);
        LocalTensor<float> old = oldQueue.AllocTensor<float>();
        LoadChunk(old, oldGm[offset], len);
        oldQueue.EnQue(old);
        LocalTensor<float> adv = advQueue.AllocTensor<float>();
        LoadChunk(adv, advGm[offset], len);
        advQueue.EnQue(adv);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> logp = logpQueue.DeQue<float>();
        LocalTensor<float> old = oldQueue.DeQue<float>();
        LocalTensor<float> adv = advQueue.DeQue<float>();
        LocalTensor<float> loss = lossQueue.AllocTensor<float>();
        LocalTensor<float> clipped = clippedQueue.AllocTensor<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> ratio = ratioBuf.Get<float>();
        LocalTensor<float> na = naBuf.Get<float>();
        LocalTensor<float> loss1 = loss1Buf.Get<float>();
        LocalTensor<float> loss2 = loss2Buf.Get<float>();
        LocalTensor<float> tmp = tmpBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();

        AscendC::Sub(d, logp, old, lanes);
        logpQueue.FreeTensor(logp);
        oldQueue.FreeTensor(old);
        NanClamp(d, d, -ratioClamp, ratioClamp, tmp, bits, lanes);
        CanonicalExp(ratio, d, workBuf.Get<float>(), bits, lanes);
        AscendC::Muls(na, adv, -1.0f, lanes);
        AscendC::Mul(loss1, na, ratio, lanes);
        NanClamp(loss2, ratio, ratioLow, ratioHigh, tmp, bits, lanes);
        AscendC::Mul(loss2, na, loss2, lanes);
        // clipped = (loss2 > loss1 ? 1.0 : 0.0)
        AscendC::Compare(bits, loss2, loss1, AscendC::CMPMODE::GT, lanes);
        AscendC::Duplicate(clipped, 1.0f, lanes);
        AscendC::Select(clipped, bits, clipped, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        NanMax(loss, loss1, loss2, tmp, bits, lanes);
        // The dual clip: where advantages < 0, loss = min(na * dualClip, loss).
        AscendC::Muls(d, na, dualClip, lanes);
        NanMin(d, d, loss, tmp, bits, lanes);
        AscendC::Compares(bits, adv, 0.0f, AscendC::CMPMODE::LT, lanes);
        AscendC::Select(loss, bits, d, loss, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        advQueue.FreeTensor(adv);
        lossQueue.EnQue(loss);
        clippedQueue.EnQue(clipped);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> loss = lossQueue.DeQue<float>();
        StoreChunk(lossGm[offset], loss, len);
        lossQueue.FreeTensor(loss);
        LocalTensor<float> clipped = clippedQueue.DeQue<float>();
        StoreChunk(clippedGm[offset], clipped, len);
        clippedQueue.FreeTensor(clipped);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> logpQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> oldQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> advQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> lossQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> clippedQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> ratioBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> naBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss1Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> logpGm;
    AscendC::GlobalTensor<float> oldGm;
    AscendC::GlobalTensor<float> advGm;
    AscendC::GlobalTensor<float> lossGm;
    AscendC::GlobalTensor<float> clippedGm;
    Range share;
    uint32_t n = 0;
    float ratioLow = 0.0f;
    float ratioHigh = 0.0f;
    float dualClip = 0.0f;
    float ratioClamp = 0.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_ppo_token_losses(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages,
                                                                 GM_ADDR loss, GM_ADDR clipped, uint32_t n,
                                                                 float ratioLow, float ratioHigh, float dualClip,
                                                                 float ratioClamp)
{
    bitparity::KernelPpoTokens op;
    op.Init(logp, oldLogp, advantages, loss, clipped, n, ratioLow, ratioHigh, dualClip, ratioClamp);
    op.Process();
}
