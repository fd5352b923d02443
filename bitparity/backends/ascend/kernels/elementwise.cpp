// exp and log (spec 5, 6) as Ascend C kernels for Atlas A2.
//
//   x: f32[n] (GM), y: f32[n]
//
// Each element is computed on its own, so the only structure is the tiling:
// the n elements are tiles of LANES floats, split into contiguous runs of
// tiles, one run per AI core.  A ragged last tile is computed over its length
// rounded up to whole 64-float repeats; the lanes past the row are discarded.
//
// UB budget (bytes): x 2 x 4096 (VECIN), y 2 x 4096 (VECOUT), work 16384,
// bits 128: 32,896 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

enum class ElementwiseOp { EXP, LOG };

template <ElementwiseOp OP>
class KernelElementwise {
public:
    __aicore__ inline KernelElementwise() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, uint32_t n)
    {
        this->n = n;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        xGm.SetGlobalBuffer((__gm__ float*)x, n);
        yGm.SetGlobalBuffer((__gm__ float*)y, n);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(yQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t t = share.begin; t < share.end; ++t) {
            uint64_t offset = static_cast<uint64_t>(t) * LANES;
            uint32_t len = n - offset < LANES ? static_cast<uint32_t>(n - offset) : LANES;
            CopyIn(offset, len);
            Compute(len);
            CopyOut(offset, len);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> x = xQueue.AllocTensor<float>();
        LoadChunk(x, xGm[offset], len);
        xQueue.EnQue(x);
    }

    __aicore__ inline void Compute(uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> y = yQueue.AllocTensor<float>();
        uint32_t lanes = RoundUp(len, FLOATS_PER_REPEAT);
        if constexpr (OP == ElementwiseOp::EXP) {
            CanonicalExp(y, x, workBuf.Get<float>(), bitsBuf.Get<uint8_t>(), lanes);
        } else {
            CanonicalLog(y, x, workBuf.Get<float>(), bitsBuf.Get<uint8_t>(), lanes);
        }
        yQueue.EnQue(y);
        xQueue.FreeTensor(x);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> y = yQueue.DeQue<float>();
        StoreChunk(yGm[offset], y, len);
        yQueue.FreeTensor(y);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> yQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> yGm;
    Range share;
    uint32_t n = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_exp(GM_ADDR x, GM_ADDR y, uint32_t n)
{
    bitparity::KernelElementwise<bitparity::ElementwiseOp::EXP> op;
    op.Init(x, y, n);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_log(GM_ADDR x, GM_ADDR y, uint32_t n)
{
    bitparity::KernelElementwise<bitparity::ElementwiseOp::LOG> op;
    op.Init(x, y, n);
    op.Process();
}
