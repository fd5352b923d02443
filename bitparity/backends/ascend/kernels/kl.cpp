// kl_penalty: the KL estimators (spec 16) as an Ascend C kernel for Atlas A2.
//
//   logp, refLogp: f32[n] (GM); out: f32[n]; kind: a KlKind; clamp, logRatioClamp:
//   float32 bounds, +inf when unset (a clamp to [-inf, inf] changes no bit, NaN included).
//
// Each element is computed on its own, in the spec's order:
//   d = refLogp - logp; d = min(max(d, -logRatioClamp), logRatioClamp) (NaN-propagating);
//   k1: -d;  abs: |d|;  k2: (d * d) * 0.5;  k3: CanonicalK3(d) (canonical.h);
//   out = min(max(k, -clamp), clamp) (NaN-propagating).
// |d| is built from compare/select: select(d < 0, -d, d) + 0.0 (the + 0.0 turns
// |-0.0| into +0.0 and changes nothing else).  Tiling as in elementwise.cpp:
// tiles of LANES floats in contiguous runs, one run per AI core; a ragged last
// tile is computed over whole 64-float repeats and only its length stored.
//
// Backward (spec 26.9, KernelKlGrad), the gradient w.r.t. refLogp (the binding
// flips its sign for logp), element by element:
//   d0 = refLogp - logp; d = the forward's clamp of d0;
//   k1: -g;  abs: g * (NaN d ? d : d > 0 ? 1 : d < 0 ? -1 : 0);  k2: g * d;
//   k3: g * CanonicalK3Derivative(d) (canonical.h);
//   +0.0 where the forward's estimator before its clamp lies outside [-clamp, clamp],
//   and where d0 lies outside [-logRatioClamp, logRatioClamp] (NaN lies inside).
// An unset clamp (+inf) blocks nothing, so its compare is skipped.
//
// UB budget (bytes): logp, ref 2 x 2 x 4096 (VECIN), out 2 x 4096 (VECOUT),
// d 4096, tmp 4096, work 24576, bits 128: 57,472 B of the 188,416 B (184 KB)
// InitBuffer may use.  KernelKlGrad: logp, ref, g 3 x 2 x 4096 (VECIN), out
// 2 x 4096 (VECOUT), d0, d, estimate, tmp, zeros 5 x 4096, work 24576, bits 128:
// 77,952 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

// The values bitparity/backends/ascend passes for ops.KL_KINDS.
enum class KlKind : uint32_t { K1 = 0, K2 = 1, K3 = 2, ABS = 3 };

// out = the estimator of d (before the clamp): k1 -d; abs |d| as select(d < 0, -d, d) + 0.0;
// k2 (d * d) * 0.5; k3 CanonicalK3.  tmp: lanes floats; work: 6 x lanes floats.
__aicore__ inline void KlEstimator(KlKind kind, const LocalTensor<float>& out, const LocalTensor<float>& d,
                                   const LocalTensor<float>& tmp, const LocalTensor<float>& work,
                                   const LocalTensor<uint8_t>& bits, uint32_t lanes)
{
    if (kind == KlKind::K1) {
        AscendC::Muls(out, d, -1.0f, lanes);
    } else if (kind == KlKind::ABS) {
        AscendC::Muls(tmp, d, -1.0f, lanes);
        AscendC::Compares(bits, d, 0.0f, AscendC::CMPMODE::LT, lanes);
        AscendC::Select(out, bits, tmp, d, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        AscendC::Adds(out, out, 0.0f, lanes);
    } else if (kind == KlKind::K2) {
        AscendC::Mul(out, d, d, lanes);
        AscendC::Muls(out, out, FloatFromBits(HALF_BITS), lanes);
    } else {
        CanonicalK3(out, d, work, bits, lanes);
    }
}

class KernelKl {
public:
    __aicore__ inline KernelKl() {}

    __aicore__ inline void Init(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR out, uint32_t n, uint32_t kind, float clamp,
                                float logRatioClamp)
    {
        this->n = n;
        this->kind = static_cast<KlKind>(kind);
        this->clamp = clamp;
        this->logRatioClamp = logRatioClamp;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        logpGm.SetGlobalBuffer((__gm__ float*)logp, n);
        refGm.SetGlobalBuffer((__gm__ float*)refLogp, n);
        outGm.SetGlobalBuffer((__gm__ float*)out, n);
        pipe.InitBuffer(logpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(refQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(tmpBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 6 * LANES * sizeof(float));
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
        LocalTensor<float> ref = refQueue.AllocTensor<float>();
        LoadChunk(ref, refGm[offset], len);
        refQueue.EnQue(ref);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> logp = logpQueue.DeQue<float>();
        LocalTensor<float> ref = refQueue.DeQue<float>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> tmp = tmpBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Sub(d, ref, logp, lanes);
        logpQueue.FreeTensor(logp);
        refQueue.FreeTensor(ref);
        NanClamp(d, d, -logRatioClamp, logRatioClamp, tmp, bits, lanes);
        KlEstimator(kind, out, d, tmp, workBuf.Get<float>(), bits, lanes);
        NanClamp(out, out, -clamp, clamp, tmp, bits, lanes);
        outQueue.EnQue(out);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> logpQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> refQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> logpGm;
    AscendC::GlobalTensor<float> refGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t n = 0;
    KlKind kind = KlKind::K1;
    float clamp = 0.0f;
    float logRatioClamp = 0.0f;
};

// The backward (spec 26.9): the gradient w.r.t. refLogp.
class KernelKlGrad {
public:
    __aicore__ inline KernelKlGrad() {}

    __aicore__ inline void Init(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR g, GM_ADDR out, uint32_t n, uint32_t kind,
                                float clamp, float logRatioClamp)
    {
        this->n = n;
        this->kind = static_cast<KlKind>(kind);
        this->clamp = clamp;
        this->logRatioClamp = logRatioClamp;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        logpGm.SetGlobalBuffer((__gm__ float*)logp, n);
        refGm.SetGlobalBuffer((__gm__ float*)refLogp, n);
        gGm.SetGlobalBuffer((__gm__ float*)g, n);
        outGm.SetGlobalBuffer((__gm__ float*)out, n);
        pipe.InitBuffer(logpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(refQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(d0Buf, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(estimateBuf, LANES * sizeof(float));
        pipe.InitBuffer(tmpBuf, LANES * sizeof(float));
        pipe.InitBuffer(zerosBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 6 * LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        AscendC::Duplicate(zerosBuf.Get<float>(), 0.0f, LANES);
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
        LocalTensor<float> ref = refQueue.AllocTensor<float>();
        LoadChunk(ref, refGm[offset], len);
        refQueue.EnQue(ref);
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LoadChunk(g, gGm[offset], len);
        gQueue.EnQue(g);
    }

    // gd = +0.0 where v < -bound or v > bound (NaN passes).
    __aicore__ inline void ZeroOutside(const LocalTensor<float>& gd, const LocalTensor<float>& v, float bound,
                                       const LocalTensor<uint8_t>& bits, uint32_t lanes)
    {
        LocalTensor<float> zeros = zerosBuf.Get<float>();
        AscendC::Compares(bits, v, -bound, AscendC::CMPMODE::LT, lanes);
        AscendC::Select(gd, bits, zeros, gd, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        AscendC::Compares(bits, v, bound, AscendC::CMPMODE::GT, lanes);
        AscendC::Select(gd, bits, zeros, gd, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> logp = logpQueue.DeQue<float>();
        LocalTensor<float> ref = refQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> gd = outQueue.AllocTensor<float>();
        LocalTensor<float> d0 = d0Buf.Get<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> slope = estimateBuf.Get<float>();
        LocalTensor<float> tmp = tmpBuf.Get<float>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Sub(d0, ref, logp, lanes);
        logpQueue.FreeTensor(logp);
        refQueue.FreeTensor(ref);
        NanClamp(d, d0, -logRatioClamp, logRatioClamp, tmp, bits, lanes);
        if (kind == KlKind::K1) {
            AscendC::Muls(gd, g, -1.0f, lanes);
        } else if (kind == KlKind::ABS) {
            // slope = NaN d ? d : (d > 0 ? 1 : (d < 0 ? -1 : 0))
            AscendC::Duplicate(slope, 1.0f, lanes);
            AscendC::Compares(bits, d, 0.0f, AscendC::CMPMODE::GT, lanes);
            AscendC::Select(slope, bits, slope, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
            AscendC::Duplicate(tmp, -1.0f, lanes);
            AscendC::Compares(bits, d, 0.0f, AscendC::CMPMODE::LT, lanes);
            AscendC::Select(slope, bits, tmp, slope, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
            AscendC::Compare(bits, d, d, AscendC::CMPMODE::NE, lanes);
            AscendC::Select(slope, bits, d, slope, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
            AscendC::Mul(gd, g, slope, lanes);
        } else if (kind == KlKind::K2) {
            AscendC::Mul(gd, g, d, lanes);
        } else {
            CanonicalK3Derivative(slope, d, work, bits, lanes);
            AscendC::Mul(gd, g, slope, lanes);
        }
        gQueue.FreeTensor(g);
        if (clamp != PosInf()) {
            LocalTensor<float> estimate = estimateBuf.Get<float>();   // the slope is consumed
            KlEstimator(kind, estimate, d, tmp, work, bits, lanes);
            ZeroOutside(gd, estimate, clamp, bits, lanes);
        }
        if (logRatioClamp != PosInf()) {
            ZeroOutside(gd, d0, logRatioClamp, bits, lanes);
        }
        outQueue.EnQue(gd);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> logpQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> refQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> d0Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> estimateBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> zerosBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> logpGm;
    AscendC::GlobalTensor<float> refGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t n = 0;
    KlKind kind = KlKind::K1;
    float clamp = 0.0f;
    float logRatioClamp = 0.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_kl_penalty(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR out, uint32_t n,
                                                           uint32_t kind, float clamp, float logRatioClamp)
{
    bitparity::KernelKl op;
    op.Init(logp, refLogp, out, n, kind, clamp, logRatioClamp);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_kl_penalty_backward(GM_ADDR logp, GM_ADDR refLogp, GM_ADDR g,
                                                                    GM_ADDR out, uint32_t n, uint32_t kind,
                                                                    float clamp, float logRatioClamp)
{
    bitparity::KernelKlGrad op;
    op.Init(logp, refLogp, g, out, n, kind, clamp, logRatioClamp);
    op.Process();
}
