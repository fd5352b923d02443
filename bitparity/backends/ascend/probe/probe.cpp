// One vector instruction per element, for `bitparity probe --backend ascend`
// (bitparity/compare/probe.py).  Not part of the canonical path: the probe runs
// the instructions the canonical kernels are built from (Add, Mul) on crafted
// operands to test their rounding and subnormal handling.
//
//   a, b: f32[n] (GM); out: f32[n]; op: a ProbeOp.
//
// Tiles of LANES floats on one core; a ragged last tile is computed over whole
// 64-float repeats and only its length stored.
//
// UB budget (bytes): a, b 2 x 2 x 4096 (VECIN), out 2 x 4096 (VECOUT): 24,576 B.

#include "kernel_operator.h"
#include "tiling.h"

namespace bitparity {

enum class ProbeOp : uint32_t { ADD = 0, MUL = 1 };

class KernelProbe {
public:
    __aicore__ inline KernelProbe() {}

    __aicore__ inline void Init(GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t n, uint32_t op)
    {
        this->n = n;
        this->op = static_cast<ProbeOp>(op);
        aGm.SetGlobalBuffer((__gm__ float*)a, n);
        bGm.SetGlobalBuffer((__gm__ float*)b, n);
        outGm.SetGlobalBuffer((__gm__ float*)out, n);
        pipe.InitBuffer(aQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(bQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        for (uint64_t offset = 0; offset < n; offset += LANES) {
            uint32_t len = n - offset < LANES ? static_cast<uint32_t>(n - offset) : LANES;
            CopyIn(offset, len);
            Compute(RoundUp(len, FLOATS_PER_REPEAT));
            CopyOut(offset, len);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> a = aQueue.AllocTensor<float>();
        LoadChunk(a, aGm[offset], len);
        aQueue.EnQue(a);
        LocalTensor<float> b = bQueue.AllocTensor<float>();
        LoadChunk(b, bGm[offset], len);
        bQueue.EnQue(b);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> a = aQueue.DeQue<float>();
        LocalTensor<float> b = bQueue.DeQue<float>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        if (op == ProbeOp::ADD) {
            AscendC::Add(out, a, b, lanes);
        } else {
            AscendC::Mul(out, a, b, lanes);
        }
        outQueue.EnQue(out);
        aQueue.FreeTensor(a);
        bQueue.FreeTensor(b);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> aQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> bQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::GlobalTensor<float> aGm;
    AscendC::GlobalTensor<float> bGm;
    AscendC::GlobalTensor<float> outGm;
    uint32_t n = 0;
    ProbeOp op = ProbeOp::ADD;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_probe(GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t n, uint32_t op)
{
    bitparity::KernelProbe kernel;
    kernel.Init(a, b, out, n, op);
    kernel.Process();
}

// The host emulation's ctypes entry point (as emulation/launch.cpp's for the canonical kernels).
extern "C" int bp_probe(GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t n, uint32_t op)
{
    return bp_emulation::Launch(1, [&] { bitparity_probe(a, b, out, n, op); });
}
