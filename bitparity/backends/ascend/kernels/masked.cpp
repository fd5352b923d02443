// masked_mean and masked_whiten (spec 15) as Ascend C kernels for Atlas A2.
//
//   x: f32[rows, cols] (GM); mask: bool[rows, cols] (masked_mean may run without one:
//   then every entry counts, which the PPO aggregation uses for its mean over
//   sequences); out: f32[rows] (mean) or f32[rows, cols] (whiten).
//
// Both start from the masked mean of a row (RowMean), in the spec's order:
//   sum = canonical sum (spec 3) of select(m, x, -0.0), by segments and chunks as
//     in reduce.cpp; n = the number of counted entries, summed as 1.0 / -0.0 in
//     float32 lanes beside it: every partial count is an integer <= cols <= 2^24
//     (host_emulation.MAX_ROW), so each float addition is exact and n is the
//     integer count, whose one rounding to float32 is exact too;
//   R = (n == 0 ? 0 : reciprocal(n)); mean = sum * R + 0.0.
// masked_whiten then makes two more passes over the row:
//   ss = canonical sum of select(m, (x - mean) * (x - mean), -0.0);
//   var = ss * reciprocal(max(n - 1, 1)) (unbiased) or ss * reciprocal(max(n, 1));
//   inv = rsqrt(var + eps) (canonical.h, spec 15.2);
//   out = (x - mean) * inv, + mean when !shiftMean; 0.0 where m is False.
// The scalar steps (sum * R + 0.0, n - 1, ss * R', var + eps) run on the scalar
// unit; the reciprocals and the rsqrt on a 64-lane vector holding the scalar in
// every lane.  Rows are spread over AI cores as in reduce.cpp; the ops pass one
// row (the whole tensor) to whiten, which one core then computes.
//
// UB budget (bytes): x 2 x 4096 + mask 2 x 1024 (VECIN), out 2 x 4096 (VECOUT,
// whiten), acc, count, value, term, ones 5 x 4096, laneIndex 4096, maskHalf 2048,
// bits 128, sum and count partials 2 x 4096, results 4096 (mean), scalar lanes
// 2 x 256, scalar work 1792: at most 55,680 B (whiten) of the 188,416 B
// (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

enum class MaskedOp { MEAN, WHITEN };

// The canonical masked sum of a row and its count.
struct MaskedSums {
    float sum;
    float count;
};

template <MaskedOp OP>
class KernelMasked {
public:
    __aicore__ inline KernelMasked() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows, uint32_t cols, uint32_t hasMask,
                                uint32_t shiftMean, uint32_t unbiased, float eps)
    {
        this->cols = cols;
        this->hasMask = hasMask != 0;
        this->shiftMean = shiftMean != 0;
        this->unbiased = unbiased != 0;
        this->eps = eps;
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
        if constexpr (OP == MaskedOp::WHITEN) {
            outGm.SetGlobalBuffer((__gm__ float*)out, elements);
            pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        } else {
            results.Init(&pipe, out, rows);
        }
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(countBuf, LANES * sizeof(float));
        pipe.InitBuffer(valueBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(onesBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(countPartialBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(scalarInBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarOutBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarWorkBuf, 7 * FLOATS_PER_REPEAT * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
        AscendC::Duplicate(onesBuf.Get<float>(), 1.0f, LANES);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            MaskedSums s = RowSums(rowStart);
            float r = s.count == 0.0f ? 0.0f : ScalarReciprocal(s.count);
            float mean = s.sum * r + 0.0f;
            if constexpr (OP == MaskedOp::MEAN) {
                results.Put(row, mean);
            } else {
                Whiten(rowStart, s.count, mean);
            }
        }
        if constexpr (OP == MaskedOp::MEAN) {
            results.Flush();
        }
    }

private:
    // ---- Stages of one chunk ------------------------------------------------

    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        EnqueueRowChunk(xQueue, maskQueue, xGm, maskGm, hasMask, offset, len);
    }

    // acc += select(m, x, -0.0) and count += select(m, 1.0, -0.0), lanes >= len being -0.0.
    __aicore__ inline void ComputeSums(const LocalTensor<float>& acc, const LocalTensor<float>& count, uint32_t len)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<float> v = valueBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        if (hasMask) {
            LocalTensor<float> term = termBuf.Get<float>();
            LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
            SelectUnmasked(v, x, m, maskHalfBuf.Get<half>(), bits, lanes, NegZero());
            AscendC::Select(term, bits, onesBuf.Get<float>(), NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE,
                            lanes);
            maskQueue.FreeTensor(m);
            if (len < lanes) {
                SelectValidLanes(v, v, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
                SelectValidLanes(term, term, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
            }
            AscendC::Add(count, count, term, lanes);
            AscendC::Add(acc, acc, v, lanes);
        } else if (len < lanes) {
            SelectValidLanes(v, x, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
            AscendC::Add(acc, acc, v, lanes);
        } else {
            AscendC::Add(acc, acc, x, lanes);
        }
        xQueue.FreeTensor(x);
    }

    // acc += select(m, (x - mean) * (x - mean), -0.0), lanes >= len being -0.0.
    __aicore__ inline void ComputeSquares(const LocalTensor<float>& acc, float mean, uint32_t len)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> v = valueBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Adds(v, x, -mean, lanes);   // x + (-mean) == x - mean in IEEE
        AscendC::Mul(v, v, v, lanes);
        SelectUnmasked(v, v, m, maskHalfBuf.Get<half>(), bits, lanes, NegZero());
        if (len < lanes) {
            SelectValidLanes(v, v, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
        }
        AscendC::Add(acc, acc, v, lanes);
        maskQueue.FreeTensor(m);
        xQueue.FreeTensor(x);
    }

    // out = select(m, (x - mean) * inv [+ mean], 0.0)
    __aicore__ inline void ComputeWhitened(float mean, float inv)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        AscendC::Adds(out, x, -mean, lanes);
        AscendC::Muls(out, out, inv, lanes);
        if (!shiftMean) {
            AscendC::Adds(out, out, mean, lanes);
        }
        SelectUnmasked(out, out, m, maskHalfBuf.Get<half>(), bitsBuf.Get<uint8_t>(), lanes, 0.0f);
        outQueue.EnQue(out);
        maskQueue.FreeTensor(m);
        xQueue.FreeTensor(x);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    // ---- Passes over a row ----------------------------------------------------

    // Pass 1: the canonical masked sum and the count.
    __aicore__ inline MaskedSums RowSums(uint64_t rowStart)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> countPartials = countPartialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> count = countBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        AscendC::Duplicate(countPartials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            if (hasMask) {
                AscendC::Duplicate(count, NegZero(), geo.lanes);
            }
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeSums(acc, count, len);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            if (hasMask) {
                countPartials.SetValue(g, TreeSum(count, geo.treeWidth));
            }
            ScalarToVectorSync();
        }
        MaskedSums s;
        s.sum = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        if (hasMask) {
            s.count = TreeSum(countPartials, NextPow2(geo.segments));
            ScalarToVectorSync();
        } else {
            s.count = static_cast<float>(cols);   // exact: cols <= 2^24
        }
        return s;
    }

    // Passes 2 and 3 of masked_whiten.
    __aicore__ inline void Whiten(uint64_t rowStart, float count, float mean)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeSquares(acc, mean, len);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float ss = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        float divisor = unbiased ? count - 1.0f : count;   // exact: count is an integer <= 2^24
        divisor = divisor > 1.0f ? divisor : 1.0f;
        float var = ss * ScalarReciprocal(divisor);
        float inv = ScalarRsqrt(var + eps);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint64_t offset = rowStart + geo.ChunkStart(g, c);
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(offset, len);
                ComputeWhitened(mean, inv);
                CopyOut(offset, len);
            }
        }
    }

    // ---- Scalar functions computed on a 64-lane vector -----------------------------

    // 1/s (spec 7) for s in [1, 2^24].
    __aicore__ inline float ScalarReciprocal(float s)
    {
        LocalTensor<float> in = scalarInBuf.Get<float>();
        LocalTensor<float> out = scalarOutBuf.Get<float>();
        AscendC::Duplicate(in, s, FLOATS_PER_REPEAT);
        CanonicalReciprocal(out, in, scalarWorkBuf.Get<float>(), FLOATS_PER_REPEAT);
        return ScalarResult(out);
    }

    // 1/sqrt(y) (spec 15.2) for y > 0.
    __aicore__ inline float ScalarRsqrt(float y)
    {
        LocalTensor<float> in = scalarInBuf.Get<float>();
        LocalTensor<float> out = scalarOutBuf.Get<float>();
        AscendC::Duplicate(in, y, FLOATS_PER_REPEAT);
        CanonicalRsqrt(out, in, scalarWorkBuf.Get<float>(), bitsBuf.Get<uint8_t>(), FLOATS_PER_REPEAT);
        return ScalarResult(out);
    }

    __aicore__ inline float ScalarResult(const LocalTensor<float>& out)
    {
        VectorToScalarSync();
        float v = out.GetValue(0);
        ScalarToVectorSync();
        return v;
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> countBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> valueBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> onesBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> countPartialBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarInBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarOutBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarWorkBuf;
    RowResults results;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    bool hasMask = false;
    bool shiftMean = true;
    bool unbiased = true;
    float eps = 0.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_masked_mean(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                            uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelMasked<bitparity::MaskedOp::MEAN> op;
    op.Init(x, mask, out, rows, cols, hasMask, 1, 1, 0.0f);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_masked_whiten(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                              uint32_t cols, uint32_t shiftMean, uint32_t unbiased,
                                                              float eps)
{
    bitparity::KernelMasked<bitparity::MaskedOp::WHITEN> op;
    op.Init(x, mask, out, rows, cols, 1, shiftMean, unbiased, eps);
    op.Process();
}
