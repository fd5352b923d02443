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
// Backward (spec 29.3), beside the forward (RmsNormOp::BACKWARD), with the upstream g: f32[rows, cols]
// (GM) and two outputs, dx (in y's place) and terms: f32[rows, cols].  Per row, after the forward's
// ms and r (the same code, so the same bits):
//   a = canonical sum (spec 3) of u_d * n_d with u_d = g_d * weight_d and n_d = x_d * r, by segments
//     and chunks as ms, times reciprocal(float(cols)); the same pass writes terms_d = g_d * n_d, which
//     the host folds over the rows into the weight's gradient (spec 29.1);
//   dx_d = (u_d - n_d * a) * r, a third pass over the row.
//
// UB budget (bytes): x 2 x 4096, weight 2 x 4096 (VECIN), y 2 x 4096 (VECOUT),
// acc, square 2 x 4096, laneIndex 4096, bits 128, partials 4096, scalar lanes
// 2 x 256, scalar work 1792: 51,840 B of the 188,416 B (184 KB) InitBuffer may use.
// The backward adds g 2 x 4096 (VECIN), terms 2 x 4096 (VECOUT) and n, u 2 x 4096: 76,416 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

enum class RmsNormOp { FORWARD, BACKWARD };

template <RmsNormOp OP>
class KernelRmsNorm {
    static constexpr bool GRAD = OP == RmsNormOp::BACKWARD;

public:
    __aicore__ inline KernelRmsNorm() {}

    // y: the forward's output, or the backward's dx; g and terms: the backward's upstream gradient and
    // g * n (the forward passes neither).
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR weight, GM_ADDR g, GM_ADDR y, GM_ADDR terms, uint32_t rows,
                                uint32_t cols, float eps)
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
        if constexpr (GRAD) {
            gGm.SetGlobalBuffer((__gm__ float*)g, elements);
            termsGm.SetGlobalBuffer((__gm__ float*)terms, elements);
            pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
            pipe.InitBuffer(termsQueue, BUFFER_NUM, LANES * sizeof(float));
            pipe.InitBuffer(nBuf, LANES * sizeof(float));
            pipe.InitBuffer(uBuf, LANES * sizeof(float));
        }
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
            float a = 0.0f;
            if constexpr (GRAD) {
                a = GradientDot(rowStart, r, holdWeight) * inverseCols;
            }
            for (uint32_t g = 0; g < geo.segments; ++g) {
                for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                    uint64_t start = geo.ChunkStart(g, c);
                    uint32_t len = geo.ChunkLength(g, c);
                    CopyIn(rowStart + start, len);
                    if (!holdWeight) {
                        LoadWeight(start, len);
                    }
                    if constexpr (GRAD) {
                        LoadGrad(rowStart + start, len);
                        ComputeInputGrad(r, a, holdWeight);
                    } else {
                        ComputeNormalised(r, holdWeight);
                    }
                    CopyOut(yGm[rowStart + start], yQueue, len);
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

    __aicore__ inline void LoadGrad(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LoadChunk(g, gGm[offset], len);
        gQueue.EnQue(g);
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

    // One chunk of the backward's dot pass: n = x * r, u = g * weight; terms = g * n into the terms queue;
    // acc += u * n, lanes >= len -0.0.
    __aicore__ inline void ComputeGradientTerms(const LocalTensor<float>& acc, float r, bool holdWeight, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> w = holdWeight ? heldWeight : weightQueue.DeQue<float>();
        LocalTensor<float> n = nBuf.Get<float>();
        LocalTensor<float> u = uBuf.Get<float>();
        LocalTensor<float> terms = termsQueue.AllocTensor<float>();
        AscendC::Muls(n, x, r, geo.lanes);
        AscendC::Mul(u, g, w, geo.lanes);
        AscendC::Mul(terms, g, n, geo.lanes);
        termsQueue.EnQue(terms);
        AscendC::Mul(u, u, n, geo.lanes);
        if (len < geo.lanes) {
            SelectValidLanes(u, u, laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes, NegZero());
        }
        AscendC::Add(acc, acc, u, geo.lanes);
        if (!holdWeight) {
            weightQueue.FreeTensor(w);
        }
        xQueue.FreeTensor(x);
        gQueue.FreeTensor(g);
    }

    // dx = (u - n * a) * r with n = x * r, u = g * weight.
    __aicore__ inline void ComputeInputGrad(float r, float a, bool holdWeight)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> w = holdWeight ? heldWeight : weightQueue.DeQue<float>();
        LocalTensor<float> n = nBuf.Get<float>();
        LocalTensor<float> u = uBuf.Get<float>();
        LocalTensor<float> dx = yQueue.AllocTensor<float>();
        AscendC::Muls(n, x, r, geo.lanes);
        AscendC::Mul(u, g, w, geo.lanes);
        AscendC::Muls(n, n, a, geo.lanes);
        AscendC::Sub(u, u, n, geo.lanes);
        AscendC::Muls(dx, u, r, geo.lanes);
        yQueue.EnQue(dx);
        if (!holdWeight) {
            weightQueue.FreeTensor(w);
        }
        xQueue.FreeTensor(x);
        gQueue.FreeTensor(g);
    }

    template <typename Queue>
    __aicore__ inline void CopyOut(const AscendC::GlobalTensor<float>& dst, Queue& queue, uint32_t len)
    {
        LocalTensor<float> out = queue.template DeQue<float>();
        StoreChunk(dst, out, len);
        queue.FreeTensor(out);
    }

    // The backward's a before its 1/cols: the canonical sum (spec 3) of u * n over one row, by segments and chunks
    // as SumOfSquares; writes the row's terms = g * n on the way.
    __aicore__ inline float GradientDot(uint64_t rowStart, float r, bool holdWeight)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint64_t start = geo.ChunkStart(g, c);
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + start, len);
                if (!holdWeight) {
                    LoadWeight(start, len);
                }
                LoadGrad(rowStart + start, len);
                ComputeGradientTerms(acc, r, holdWeight, len);
                CopyOut(termsGm[rowStart + start], termsQueue, len);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float sum = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return sum;
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
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> termsQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> nBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> uBuf;
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
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> termsGm;
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
    bitparity::KernelRmsNorm<bitparity::RmsNormOp::FORWARD> op;
    op.Init(x, weight, nullptr, y, nullptr, rows, cols, eps);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_rms_norm_backward(GM_ADDR x, GM_ADDR weight, GM_ADDR g, GM_ADDR dx,
                                                                  GM_ADDR terms, uint32_t rows, uint32_t cols,
                                                                  float eps)
{
    bitparity::KernelRmsNorm<bitparity::RmsNormOp::BACKWARD> op;
    op.Init(x, weight, g, dx, terms, rows, cols, eps);
    op.Process();
}
