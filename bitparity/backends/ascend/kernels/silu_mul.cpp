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
// Backward (spec 29.5, KernelSiluMulGrad), with the upstream g: f32[n], element by element, from
// the forward's sig (Sigmoid: the same code, so the same bits):
//   silu = gate * sig; d_up = g * silu;
//   dsilu = sig * (1 + gate * (1 - sig)), as t = 1 - sig, t = gate * t, t = 1 + t, t = sig * t
//     (1 - sig as -sig + 1 and 1 + t as t + 1: the same roundings);
//   d_gate = (g * up) * dsilu.
//
// UB budget (bytes): gate, up 2 x 2 x 4096 (VECIN), out 2 x 4096 (VECOUT),
// e, t, r 3 x 4096, work 28672, bits 128: 53,376 B of the 188,416 B (184 KB)
// InitBuffer may use.  KernelSiluMulGrad: gate, up, g 3 x 2 x 4096 (VECIN), d_gate,
// d_up 2 x 2 x 4096 (VECOUT), e, t, r 3 x 4096, work 28672, bits 128: 82,048 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

// sig = sigmoid(gate) over lanes floats (spec 24.5): e = exp(-|gate|), r = reciprocal(1 + e),
// sig = (gate >= 0 ? r : e * r).  sig, e and t: lanes floats each, none of them gate;
// work: 7 x lanes floats; bits: lanes / 8 bytes.
__aicore__ inline void Sigmoid(const LocalTensor<float>& sig, const LocalTensor<float>& gate,
                               const LocalTensor<float>& e, const LocalTensor<float>& t,
                               const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t lanes)
{
    AscendC::Muls(t, gate, -1.0f, lanes);
    AscendC::Min(t, gate, t, lanes);                 // -|gate|
    CanonicalExp(e, t, work, bits, lanes);
    AscendC::Adds(t, e, 1.0f, lanes);                // 1 + e
    CanonicalReciprocal(sig, t, work, lanes);
    AscendC::Mul(t, e, sig, lanes);                  // e * r
    AscendC::Compares(bits, gate, 0.0f, AscendC::CMPMODE::GE, lanes);
    AscendC::Select(sig, bits, sig, t, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
}

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
        Sigmoid(r, g, e, t, work, bits, lanes);
        AscendC::Mul(out, g, r, lanes);
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

// The backward (spec 29.5): (d_gate, d_up) from gate, up and the upstream g.
class KernelSiluMulGrad {
public:
    __aicore__ inline KernelSiluMulGrad() {}

    __aicore__ inline void Init(GM_ADDR gate, GM_ADDR up, GM_ADDR g, GM_ADDR dGate, GM_ADDR dUp, uint32_t n)
    {
        this->n = n;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        gateGm.SetGlobalBuffer((__gm__ float*)gate, n);
        upGm.SetGlobalBuffer((__gm__ float*)up, n);
        gGm.SetGlobalBuffer((__gm__ float*)g, n);
        dGateGm.SetGlobalBuffer((__gm__ float*)dGate, n);
        dUpGm.SetGlobalBuffer((__gm__ float*)dUp, n);
        pipe.InitBuffer(gateQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(upQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dGateQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dUpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(tBuf, LANES * sizeof(float));
        pipe.InitBuffer(sigBuf, LANES * sizeof(float));
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
        LocalTensor<float> gate = gateQueue.AllocTensor<float>();
        LocalTensor<float> up = upQueue.AllocTensor<float>();
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LoadChunk(gate, gateGm[offset], len);
        LoadChunk(up, upGm[offset], len);
        LoadChunk(g, gGm[offset], len);
        gateQueue.EnQue(gate);
        upQueue.EnQue(up);
        gQueue.EnQue(g);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> gate = gateQueue.DeQue<float>();
        LocalTensor<float> up = upQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> dGate = dGateQueue.AllocTensor<float>();
        LocalTensor<float> dUp = dUpQueue.AllocTensor<float>();
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> t = tBuf.Get<float>();
        LocalTensor<float> sig = sigBuf.Get<float>();
        Sigmoid(sig, gate, e, t, workBuf.Get<float>(), bitsBuf.Get<uint8_t>(), lanes);
        AscendC::Mul(t, gate, sig, lanes);               // silu
        AscendC::Mul(dUp, g, t, lanes);
        AscendC::Muls(t, sig, -1.0f, lanes);
        AscendC::Adds(t, t, 1.0f, lanes);                // 1 - sig
        AscendC::Mul(t, gate, t, lanes);
        AscendC::Adds(t, t, 1.0f, lanes);                // 1 + gate * (1 - sig)
        AscendC::Mul(t, sig, t, lanes);                  // dsilu
        AscendC::Mul(dGate, g, up, lanes);
        AscendC::Mul(dGate, dGate, t, lanes);
        dGateQueue.EnQue(dGate);
        dUpQueue.EnQue(dUp);
        gateQueue.FreeTensor(gate);
        upQueue.FreeTensor(up);
        gQueue.FreeTensor(g);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> dGate = dGateQueue.DeQue<float>();
        LocalTensor<float> dUp = dUpQueue.DeQue<float>();
        StoreChunk(dGateGm[offset], dGate, len);
        StoreChunk(dUpGm[offset], dUp, len);
        dGateQueue.FreeTensor(dGate);
        dUpQueue.FreeTensor(dUp);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gateQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> upQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> dGateQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> dUpQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> sigBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> gateGm;
    AscendC::GlobalTensor<float> upGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> dGateGm;
    AscendC::GlobalTensor<float> dUpGm;
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

extern "C" __global__ __aicore__ void bitparity_silu_mul_backward(GM_ADDR gate, GM_ADDR up, GM_ADDR g, GM_ADDR dGate,
                                                                  GM_ADDR dUp, uint32_t n)
{
    bitparity::KernelSiluMulGrad op;
    op.Init(gate, up, g, dGate, dUp, n);
    op.Process();
}
