// sum: the canonical row sum (spec 3) as an Ascend C kernel for Atlas A2.
//
//   x: f32[rows, cols] (GM), mask: bool[rows, cols] or absent, out: f32[rows]
//
// Evaluation order per row (tiling.h): for each segment g, lane j of acc adds
// element j of chunk 0, 1, ... in order, starting from -0.0 (masked elements
// and the last chunk's padding lanes are -0.0, the exact additive identity);
// the segment's partial is TreeSum(acc) over the spec's lane count W; the
// row's sum is TreeSum over the partials padded with -0.0 to a power of two.
//
// UB budget (bytes): x 2 x 4096 + mask 2 x 1024 (VECIN queues), acc 4096,
// value 4096, laneIndex 4096, maskHalf 2048, bits 128, partials 4096,
// results 4096: 32,896 B with a mask, of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

class KernelSum {
public:
    __aicore__ inline KernelSum() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t hasMask)
    {
        this->cols = cols;
        this->hasMask = hasMask != 0;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        if (this->hasMask) {
            maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
            pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
            pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        }
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(valueBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        results.Init(&pipe, out, rows);
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            results.Put(row, RowSum(static_cast<uint64_t>(row) * cols));
        }
        results.Flush();
    }

private:
    __aicore__ inline float RowSum(uint64_t rowStart)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            LocalTensor<float> acc = accBuf.Get<float>();
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                Compute(acc, len);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float sum = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return sum;
    }

    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        EnqueueRowChunk(xQueue, maskQueue, xGm, maskGm, hasMask, offset, len);
    }

    // acc += the chunk, masked and padded elements being -0.0.
    __aicore__ inline void Compute(const LocalTensor<float>& acc, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        if (!hasMask && len == geo.lanes) {
            AscendC::Add(acc, acc, x, geo.lanes);
        } else {
            LocalTensor<float> v = valueBuf.Get<float>();
            if (hasMask) {
                LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
                SelectUnmasked(v, x, m, maskHalfBuf.Get<half>(), bits, geo.lanes, NegZero());
                maskQueue.FreeTensor(m);
                if (len < geo.lanes) {
                    SelectValidLanes(v, v, laneIndexBuf.Get<float>(), bits, len, geo.lanes, NegZero());
                }
            } else {
                SelectValidLanes(v, x, laneIndexBuf.Get<float>(), bits, len, geo.lanes, NegZero());
            }
            AscendC::Add(acc, acc, v, geo.lanes);
        }
        xQueue.FreeTensor(x);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> valueBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    RowResults results;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    bool hasMask = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_sum(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols,
                                                    uint32_t hasMask)
{
    bitparity::KernelSum op;
    op.Init(x, mask, out, rows, cols, hasMask);
    op.Process();
}
