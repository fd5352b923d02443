// rms_norm (spec 24.2) as an Ascend C kernel for Atlas A2.
//
//   x: f32[rows, cols] (GM); weight: f32[cols]; y: f32[rows, cols]; eps: a normal float32.
//
// Per row, in the spec's order:
//   ms = canonical sum (spec 3) of x_d * x_d, by segments and chunks as in
//     reduce.cpp (padding lanes -0.0), times reciprocal(float(cols)) (spec 7,
//     computed once per launch; cols <= 2^24 is exact as a float);
//   r = rsqrt(ms + eps) (spec 15.2) on a 64-lane vector holding the scalar;
//   y_d = (x_d * r) * weight_d, a second pass over the row.
// Rows are spread over AI cores.  The weight row stays in UB when it is one chunk.
//
// UB budget (bytes): x 2 x 4096, weight 2 x 4096 (VECIN), y 2 x 4096 (VECOUT),
// acc, square 2 x 4096, laneIndex 4096, bits 128, partials 4096, scalar lanes
// 2 x 256, scalar work 1792: 51,840 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

class KernelRmsNorm {
public:
    __aicore__ inline KernelRmsNorm() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR weight, GM_ADDR y, uint32_t rows, uint32_t cols, float eps)
    {
        this->cols = cols;
        this->eps = eps;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        weightGm.SetGlobalBuffer((__gm__ float*)weight, cols);
        yGm.SetGlobalBuffer((__gm__ float*)y, elements);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(weightQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(yQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(squareBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(scalarInBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarOutBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarWorkBuf, 7 * FLOATS_PER_REPEAT * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
        LocalTensor<float> in = scalarInBuf.Get<float>();
        AscendC::Duplicate(in, static_cast<float>(cols), FLOATS_PER_REPEAT);   // exact: cols <= 2^24
        CanonicalReciprocal(scalarOutBuf.Get<float>(), in, scalarWorkBuf.Get<float>(), FLOATS_PER_REPEAT);
        inverseCols = ScalarResult();
    }

    __aicore__ inline void Process()
    {
        const bool holdWeight = geo.segments == 1 && geo.chunks == 1;
        if (holdWeight) {
            LoadWeight(0, cols);
            heldWeight = weightQueue.DeQue<float>();
        }
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            float ms = SumOfSquares(rowStart) * inverseCols;
            float r = ScalarRsqrt(ms + eps);
            for (uint32_t g = 0; g < geo.segments; ++g) {
                for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                    uint64_t start = geo.ChunkStart(g, c);
                    uint32_t len = geo.ChunkLength(g, c);
                    CopyIn(rowStart + start, len);
                    if (!holdWeight) {
                        LoadWeight(start, len);
                    }
                    ComputeNormalised(r, holdWeight);
                    CopyOut(rowStart + start, len);
                }
            }
        }
        if (holdWeight) {
            weightQueue.FreeTensor(heldWeight);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> x = xQueue.AllocTensor<float>();
        LoadChunk(x, xGm[offset], len);
        xQueue.EnQue(x);
    }

    __aicore__ inline void LoadWeight(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> w = weightQueue.AllocTensor<float>();
        LoadChunk(w, weightGm[offset], len);
        weightQueue.EnQue(w);
    }

    // acc += x * x, lanes >= len being -0.0.
    __aicore__ inline void ComputeSquares(const LocalTensor<float>& acc, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> sq = squareBuf.Get<float>();
        AscendC::Mul(sq, x, x, geo.lanes);
        if (len < geo.lanes) {
            SelectValidLanes(sq, sq, laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes, NegZero());
        }
        AscendC::Add(acc, acc, sq, geo.lanes);
        xQueue.FreeTensor(x);
    }

    // y = (x * r) * weight
    __aicore__ inline void ComputeNormalised(float r, bool holdWeight)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> w = holdWeight ? heldWeight : weightQueue.DeQue<float>();
        LocalTensor<float> y = yQueue.AllocTensor<float>();
        AscendC::Muls(y, x, r, geo.lanes);
        AscendC::Mul(y, y, w, geo.lanes);
        yQueue.EnQue(y);
        if (!holdWeight) {
            weightQueue.FreeTensor(w);
        }
        xQueue.FreeTensor(x);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> y = yQueue.DeQue<float>();
        StoreChunk(yGm[offset], y, len);
        yQueue.FreeTensor(y);
    }

    // The canonical sum (spec 3) of x * x over one row.
    __aicore__ inline float SumOfSquares(uint64_t rowStart)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeSquares(acc, len);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float sum = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return sum;
    }

    // 1/sqrt(y) (spec 15.2) for y > 0, on a 64-lane vector.
    __aicore__ inline float ScalarRsqrt(float y)
    {
        LocalTensor<float> in = scalarInBuf.Get<float>();
        AscendC::Duplicate(in, y, FLOATS_PER_REPEAT);
        CanonicalRsqrt(scalarOutBuf.Get<float>(), in, scalarWorkBuf.Get<float>(), bitsBuf.Get<uint8_t>(),
                       FLOATS_PER_REPEAT);
        return ScalarResult();
    }

    __aicore__ inline float ScalarResult()
    {
        VectorToScalarSync();
        float v = scalarOutBuf.Get<float>().GetValue(0);
        ScalarToVectorSync();
        return v;
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> weightQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> yQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> squareBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarInBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarOutBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarWorkBuf;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> weightGm;
    AscendC::GlobalTensor<float> yGm;
    LocalTensor<float> heldWeight;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    float eps = 0.0f;
    float inverseCols = 0.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_rms_norm(GM_ADDR x, GM_ADDR weight, GM_ADDR y, uint32_t rows,
                                                         uint32_t cols, float eps)
{
    bitparity::KernelRmsNorm op;
    op.Init(x, weight, y, rows, cols, eps);
    op.Process();
}
