// The optimizer steps (spec 29.12), AdamW and SGD, as Ascend C kernels for Atlas A2.
//
//   w, g: f32[n] (GM), with AdamW's m, v: f32[n] or SGD's momentum buffer: f32[n] (absent on the first
//   step); new w, m, v (or buffer): f32[n].  The constants are float32 values the host made once in
//   binary64 and rounded (spec 29.12).
//
// Each element on its own, in the spec's order:
//   AdamW: w = w * decay (only with weight decay); m = (b1 * m) + (c1 * g); v = (b2 * v) + (c2 * (g * g))
//     (where g * g overflows, ((c2 * (h * h)) * 2^64) * 2^64 with h = g * 2^-64);
//     den = (sqrt32(v) * ibc2) + eps (CanonicalSqrt, canonical.h); w = w - (m * recip(den)) * step
//     (GeneralReciprocal, canonical.h).
//   SGD: d = g + weight_decay * w (only with weight decay); with momentum, buffer = d on the first step,
//     else (momentum * buffer) + (one_minus_dampening * d), and d = d + momentum * buffer (nesterov) or
//     buffer; w = w - lr * d.
// A step skipped by a zero hyper-parameter is skipped, not multiplied by 1 or added 0.  Tiling as in
// elementwise.cpp: tiles of LANES floats in contiguous runs, one run per AI core; a ragged last tile is
// computed over whole 64-float repeats and only its length stored.
//
// UB budget (bytes): KernelAdamW: w, g, m, v 4 x 2 x 4096 (VECIN), w, m, v 3 x 2 x 4096 (VECOUT), den,
// t 2 x 4096, work 36864, bits 128: 102,528 B of the 188,416 B (184 KB) InitBuffer may use.
// KernelSgd: w, g, buffer 3 x 2 x 4096 (VECIN), w, buffer 2 x 2 x 4096 (VECOUT), d, t 2 x 4096: 49,152 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

struct AdamWConstants {
    uint32_t hasDecay;
    float decay;
    float b1;
    float c1;
    float b2;
    float c2;
    float ibc2;
    float eps;
    float step;
};

class KernelAdamW {
public:
    __aicore__ inline KernelAdamW() {}

    __aicore__ inline void Init(GM_ADDR w, GM_ADDR g, GM_ADDR m, GM_ADDR v, GM_ADDR wOut, GM_ADDR mOut, GM_ADDR vOut,
                                uint32_t n, const AdamWConstants& constants)
    {
        this->n = n;
        this->constants = constants;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        wGm.SetGlobalBuffer((__gm__ float*)w, n);
        gGm.SetGlobalBuffer((__gm__ float*)g, n);
        mGm.SetGlobalBuffer((__gm__ float*)m, n);
        vGm.SetGlobalBuffer((__gm__ float*)v, n);
        wOutGm.SetGlobalBuffer((__gm__ float*)wOut, n);
        mOutGm.SetGlobalBuffer((__gm__ float*)mOut, n);
        vOutGm.SetGlobalBuffer((__gm__ float*)vOut, n);
        pipe.InitBuffer(wQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(mQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(vQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(wOutQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(mOutQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(vOutQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(denBuf, LANES * sizeof(float));
        pipe.InitBuffer(tBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 9 * LANES * sizeof(float));
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
        LocalTensor<float> w = wQueue.AllocTensor<float>();
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LocalTensor<float> m = mQueue.AllocTensor<float>();
        LocalTensor<float> v = vQueue.AllocTensor<float>();
        LoadChunk(w, wGm[offset], len);
        LoadChunk(g, gGm[offset], len);
        LoadChunk(m, mGm[offset], len);
        LoadChunk(v, vGm[offset], len);
        wQueue.EnQue(w);
        gQueue.EnQue(g);
        mQueue.EnQue(m);
        vQueue.EnQue(v);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> w = wQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> m = mQueue.DeQue<float>();
        LocalTensor<float> v = vQueue.DeQue<float>();
        LocalTensor<float> wOut = wOutQueue.AllocTensor<float>();
        LocalTensor<float> mOut = mOutQueue.AllocTensor<float>();
        LocalTensor<float> vOut = vOutQueue.AllocTensor<float>();
        LocalTensor<float> den = denBuf.Get<float>();
        LocalTensor<float> t = tBuf.Get<float>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        if (constants.hasDecay != 0) {
            AscendC::Muls(wOut, w, constants.decay, lanes);
        } else {
            CopyFloats(wOut, w, lanes);
        }
        AscendC::Muls(mOut, m, constants.b1, lanes);
        AscendC::Muls(t, g, constants.c1, lanes);
        AscendC::Add(mOut, mOut, t, lanes);
        AscendC::Muls(vOut, v, constants.b2, lanes);
        // t = c2 * (g * g), and where g * g overflows (|g| >= 2^64) den = ((c2 * (h * h)) * 2^64) * 2^64
        // with h = g * 2^-64 instead: the same roundings, scaled by exact powers of two.
        AscendC::Mul(t, g, g, lanes);
        AscendC::Muls(den, g, FloatFromBits(TWO_M64_BITS), lanes);
        AscendC::Mul(den, den, den, lanes);
        AscendC::Muls(den, den, constants.c2, lanes);
        AscendC::Muls(den, den, FloatFromBits(TWO_P64_BITS), lanes);
        AscendC::Muls(den, den, FloatFromBits(TWO_P64_BITS), lanes);
        AscendC::Compares(bits, t, PosInf(), AscendC::CMPMODE::EQ, lanes);
        AscendC::Muls(t, t, constants.c2, lanes);
        AscendC::Select(t, bits, den, t, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        AscendC::Add(vOut, vOut, t, lanes);
        CanonicalSqrt(den, vOut, work, bits, lanes);
        AscendC::Muls(den, den, constants.ibc2, lanes);
        AscendC::Adds(den, den, constants.eps, lanes);
        GeneralReciprocal(t, den, work, bits, lanes);
        AscendC::Mul(t, mOut, t, lanes);
        AscendC::Muls(t, t, constants.step, lanes);
        AscendC::Sub(wOut, wOut, t, lanes);
        wOutQueue.EnQue(wOut);
        mOutQueue.EnQue(mOut);
        vOutQueue.EnQue(vOut);
        wQueue.FreeTensor(w);
        gQueue.FreeTensor(g);
        mQueue.FreeTensor(m);
        vQueue.FreeTensor(v);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> w = wOutQueue.DeQue<float>();
        LocalTensor<float> m = mOutQueue.DeQue<float>();
        LocalTensor<float> v = vOutQueue.DeQue<float>();
        StoreChunk(wOutGm[offset], w, len);
        StoreChunk(mOutGm[offset], m, len);
        StoreChunk(vOutGm[offset], v, len);
        wOutQueue.FreeTensor(w);
        mOutQueue.FreeTensor(m);
        vOutQueue.FreeTensor(v);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> wQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> mQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> vQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> wOutQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> mOutQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> vOutQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> denBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> wGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> mGm;
    AscendC::GlobalTensor<float> vGm;
    AscendC::GlobalTensor<float> wOutGm;
    AscendC::GlobalTensor<float> mOutGm;
    AscendC::GlobalTensor<float> vOutGm;
    AdamWConstants constants{};
    Range share;
    uint32_t n = 0;
};

struct SgdConstants {
    float lr;
    float momentum;
    float oneMinusDampening;
    float weightDecay;
    uint32_t nesterov;
    uint32_t hasBuffer;   // 0 on the first step: the buffer starts as d
};

class KernelSgd {
public:
    __aicore__ inline KernelSgd() {}

    // buffer and bufferOut: GM only with momentum (buffer only when hasBuffer).
    __aicore__ inline void Init(GM_ADDR w, GM_ADDR g, GM_ADDR buffer, GM_ADDR wOut, GM_ADDR bufferOut, uint32_t n,
                                const SgdConstants& constants)
    {
        this->n = n;
        this->constants = constants;
        momentum = constants.momentum != 0.0f;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        wGm.SetGlobalBuffer((__gm__ float*)w, n);
        gGm.SetGlobalBuffer((__gm__ float*)g, n);
        wOutGm.SetGlobalBuffer((__gm__ float*)wOut, n);
        pipe.InitBuffer(wQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(wOutQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(tBuf, LANES * sizeof(float));
        if (momentum) {
            bufferOutGm.SetGlobalBuffer((__gm__ float*)bufferOut, n);
            pipe.InitBuffer(bufferOutQueue, BUFFER_NUM, LANES * sizeof(float));
            if (constants.hasBuffer != 0) {
                bufferGm.SetGlobalBuffer((__gm__ float*)buffer, n);
                pipe.InitBuffer(bufferQueue, BUFFER_NUM, LANES * sizeof(float));
            }
        }
    }

    __aicore__ inline void Process()
    {
        for (uint32_t t = share.begin; t < share.end; ++t) {
            uint64_t offset = static_cast<uint64_t>(t) * LANES;
            uint32_t len = n - offset < LANES ? static_cast<uint32_t>(n - offset) : LANES;
            CopyIn(offset, len);
            Compute(RoundUp(len, FLOATS_PER_BLOCK));
            CopyOut(offset, len);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> w = wQueue.AllocTensor<float>();
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LoadChunk(w, wGm[offset], len);
        LoadChunk(g, gGm[offset], len);
        wQueue.EnQue(w);
        gQueue.EnQue(g);
        if (momentum && constants.hasBuffer != 0) {
            LocalTensor<float> buffer = bufferQueue.AllocTensor<float>();
            LoadChunk(buffer, bufferGm[offset], len);
            bufferQueue.EnQue(buffer);
        }
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> w = wQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> wOut = wOutQueue.AllocTensor<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> t = tBuf.Get<float>();
        if (constants.weightDecay != 0.0f) {
            AscendC::Muls(t, w, constants.weightDecay, lanes);
            AscendC::Add(d, g, t, lanes);
        } else {
            CopyFloats(d, g, lanes);
        }
        if (momentum) {
            LocalTensor<float> bufferOut = bufferOutQueue.AllocTensor<float>();
            if (constants.hasBuffer != 0) {
                LocalTensor<float> buffer = bufferQueue.DeQue<float>();
                AscendC::Muls(bufferOut, buffer, constants.momentum, lanes);
                AscendC::Muls(t, d, constants.oneMinusDampening, lanes);
                AscendC::Add(bufferOut, bufferOut, t, lanes);
                bufferQueue.FreeTensor(buffer);
            } else {
                CopyFloats(bufferOut, d, lanes);
            }
            if (constants.nesterov != 0) {
                AscendC::Muls(t, bufferOut, constants.momentum, lanes);
                AscendC::Add(d, d, t, lanes);
            } else {
                CopyFloats(d, bufferOut, lanes);
            }
            bufferOutQueue.EnQue(bufferOut);
        }
        AscendC::Muls(t, d, constants.lr, lanes);
        AscendC::Sub(wOut, w, t, lanes);
        wOutQueue.EnQue(wOut);
        wQueue.FreeTensor(w);
        gQueue.FreeTensor(g);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> w = wOutQueue.DeQue<float>();
        StoreChunk(wOutGm[offset], w, len);
        wOutQueue.FreeTensor(w);
        if (momentum) {
            LocalTensor<float> buffer = bufferOutQueue.DeQue<float>();
            StoreChunk(bufferOutGm[offset], buffer, len);
            bufferOutQueue.FreeTensor(buffer);
        }
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> wQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> bufferQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> wOutQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> bufferOutQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tBuf;
    AscendC::GlobalTensor<float> wGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> bufferGm;
    AscendC::GlobalTensor<float> wOutGm;
    AscendC::GlobalTensor<float> bufferOutGm;
    SgdConstants constants{};
    Range share;
    uint32_t n = 0;
    bool momentum = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_adamw_step(GM_ADDR w, GM_ADDR g, GM_ADDR m, GM_ADDR v, GM_ADDR wOut,
                                                           GM_ADDR mOut, GM_ADDR vOut, uint32_t n, uint32_t hasDecay,
                                                           float decay, float b1, float c1, float b2, float c2,
                                                           float ibc2, float eps, float step)
{
    bitparity::KernelAdamW op;
    op.Init(w, g, m, v, wOut, mOut, vOut, n,
            bitparity::AdamWConstants{hasDecay, decay, b1, c1, b2, c2, ibc2, eps, step});
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_sgd_step(GM_ADDR w, GM_ADDR g, GM_ADDR buffer, GM_ADDR wOut,
                                                         GM_ADDR bufferOut, uint32_t n, float lr, float momentum,
                                                         float oneMinusDampening, float weightDecay,
                                                         uint32_t nesterov, uint32_t hasBuffer)
{
    bitparity::KernelSgd op;
    op.Init(w, g, buffer, wOut, bufferOut, n,
            bitparity::SgdConstants{lr, momentum, oneMinusDampening, weightDecay, nesterov, hasBuffer});
    op.Process();
}
