// silu_mul (spec 24.5) as an Ascend C kernel for Atlas A2.
//
//   gate, up: f32[n] (GM); out: f32[n]
//
// Each element on its own, in the spec's order:
//   e = exp(-|g|) (canonical.h); r = reciprocal(1 + e) (1 + e in [1, 2]);
//   sig = (g >= 0 ? r : e * r); out = (g * sig) * u.
// -|g| is min(g, -g): the same value for every g but a zero (either zero gives
// exp = 1) and NaN (NaN either way: both operands are NaN, so Min's NaN rule
// does not matter).  Tiling as in elementwise.cpp.
//
// UB budget (bytes): gate, up 2 x 2 x 4096 (VECIN), out 2 x 4096 (VECOUT),
// e, t, r 3 x 4096, work 28672, bits 128: 53,376 B of the 188,416 B (184 KB)
// InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

class KernelSiluMul {
public:
    __aicore__ inline KernelSiluMul() {}

    __aicore__ inline void Init(GM_ADDR gate, GM_ADDR up, GM_ADDR out, uint32_t n)
    {
        this->n = n;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        gateGm.SetGlobalBuffer((__gm__ float*)gate, n);
        upGm.SetGlobalBuffer((__gm__ float*)up, n);
        outGm.SetGlobalBuffer((__gm__ float*)out, n);
        pipe.InitBuffer(gateQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(upQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(tBuf, LANES * sizeof(float));
        pipe.InitBuffer(rBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 7 * LANES * sizeof(float));
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
        LocalTensor<float> g = gateQueue.AllocTensor<float>();
        LocalTensor<float> u = upQueue.AllocTensor<float>();
        LoadChunk(g, gateGm[offset], len);
        LoadChunk(u, upGm[offset], len);
        gateQueue.EnQue(g);
        upQueue.EnQue(u);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> g = gateQueue.DeQue<float>();
        LocalTensor<float> u = upQueue.DeQue<float>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> t = tBuf.Get<float>();
        LocalTensor<float> r = rBuf.Get<float>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Muls(t, g, -1.0f, lanes);
        AscendC::Min(t, g, t, lanes);                    // -|g|
        CanonicalExp(e, t, work, bits, lanes);
        AscendC::Adds(t, e, 1.0f, lanes);                // 1 + e
        CanonicalReciprocal(r, t, work, lanes);
        AscendC::Mul(t, e, r, lanes);                    // e * r
        AscendC::Compares(bits, g, 0.0f, AscendC::CMPMODE::GE, lanes);
        AscendC::Select(t, bits, r, t, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        AscendC::Mul(out, g, t, lanes);
        AscendC::Mul(out, out, u, lanes);
        outQueue.EnQue(out);
        gateQueue.FreeTensor(g);
        upQueue.FreeTensor(u);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gateQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> upQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> gateGm;
    AscendC::GlobalTensor<float> upGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t n = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_silu_mul(GM_ADDR gate, GM_ADDR up, GM_ADDR out, uint32_t n)
{
    bitparity::KernelSiluMul op;
    op.Init(gate, up, out, n);
    op.Process();
}
