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
//   inv = rsqrt(floored(var)) (canonical.h, spec 15.2), floored(var) = var + eps
//     (epsMode ADD) or max(var, eps) (epsMode CLAMP, NaN-propagating: numpy's
//     maximum, var where var >= eps or var is NaN, else eps);
//   out = (x - mean) * inv, + mean when !shiftMean; 0.0 where m is False.
//
// Backward (spec 26.7, 26.8), beside the forwards:
//   masked_mean (KernelMaskedMeanGrad): n counted from the mask alone (exact, as
//     above), R = (n == 0 ? 0 : reciprocal(n)); dx = select(m, g * R, +0.0).
//   masked_whiten (KernelMasked<WHITEN_BACKWARD>): pass 1 is the forward's (sum, n,
//     R, mean); pass 2 reads x, m and g once for three canonical sums side by side:
//     ss of select(m, d * d, -0.0) (the forward's), gs of select(m, g, -0.0) and gd
//     of select(m, g * d, -0.0), d = x - mean; then rk = reciprocal(max(n - 1, 1))
//     (or max(n, 1)), var = ss * rk, inv = rsqrt(floored(var)), gbar = gs * R + 0.0,
//     c = (gd * rk) * inv, or +0.0 under CLAMP where var < eps (the clamp holds the
//     variance at eps, so it passes no gradient); pass 3: z = d * inv,
//     dx = select(m, ((g - gbar) - z * c) * inv [+ gbar when !shiftMean], +0.0).
// The scalar steps (sum * R + 0.0, n - 1, ss * R', var + eps or max(var, eps)) run on the scalar
// unit; the reciprocals and the rsqrt on a 64-lane vector holding the scalar in
// every lane.  Rows are spread over AI cores as in reduce.cpp; the ops pass one
// row (the whole tensor) to whiten, which one core then computes.
//
// UB budget (bytes): x 2 x 4096 + mask 2 x 1024 (VECIN), out 2 x 4096 (VECOUT,
// whiten), acc, count, value, term, ones 5 x 4096, laneIndex 4096, maskHalf 2048,
// bits 128, sum and count partials 2 x 4096, results 4096 (mean), scalar lanes
// 2 x 256, scalar work 1792: at most 55,680 B (whiten) of the 188,416 B
// (184 KB) InitBuffer may use.  whiten's backward adds g 2 x 4096 (VECIN), two
// accumulators, two terms and two partials 6 x 4096: 88,448 B.  mean's backward:
// mask 2 x 1024 (VECIN), out 2 x 4096 (VECOUT), count, term, ones 3 x 4096,
// laneIndex 4096, maskHalf 2048, bits 128, scalar lanes and work 2304: 31,104 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

enum class MaskedOp { MEAN, WHITEN, WHITEN_BACKWARD };

// The values bitparity/backends/ascend passes for masked_whiten's eps_mode.
enum class EpsMode : uint32_t { ADD = 0, CLAMP = 1 };

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
                                uint32_t shiftMean, uint32_t unbiased, float eps, uint32_t epsMode)
    {
        this->cols = cols;
        this->hasMask = hasMask != 0;
        this->shiftMean = shiftMean != 0;
        this->unbiased = unbiased != 0;
        this->eps = eps;
        this->epsMode = static_cast<EpsMode>(epsMode);
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
        if constexpr (OP != MaskedOp::MEAN) {
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

    // WHITEN_BACKWARD's upstream gradient g: f32[rows, cols], and its buffers.
    __aicore__ inline void InitGradient(GM_ADDR g, uint32_t rows)
    {
        gGm.SetGlobalBuffer((__gm__ float*)g, static_cast<uint64_t>(rows) * cols);
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(accGBuf, LANES * sizeof(float));
        pipe.InitBuffer(accGdBuf, LANES * sizeof(float));
        pipe.InitBuffer(termGBuf, LANES * sizeof(float));
        pipe.InitBuffer(termGdBuf, LANES * sizeof(float));
        pipe.InitBuffer(gPartialBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(gdPartialBuf, MAX_SEGMENTS * sizeof(float));
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
            } else if constexpr (OP == MaskedOp::WHITEN) {
                Whiten(rowStart, s.count, mean);
            } else {
                WhitenGrad(rowStart, s.count, r, mean);
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
        float inv = ScalarRsqrt(Floored(var));
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

    // ---- Backward of masked_whiten (spec 26.8) ---------------------------------------

    __aicore__ inline void CopyInGrad(uint64_t offset, uint32_t len)
    {
        CopyIn(offset, len);
        LocalTensor<float> g = gQueue.AllocTensor<float>();
        LoadChunk(g, gGm[offset], len);
        gQueue.EnQue(g);
    }

    // ss += select(m, d * d, -0.0), gs += select(m, g, -0.0), gd += select(m, g * d, -0.0),
    // d = x - mean, lanes >= len being -0.0.
    __aicore__ inline void ComputeGradSums(const LocalTensor<float>& ss, const LocalTensor<float>& gs,
                                           const LocalTensor<float>& gd, float mean, uint32_t len)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> d = valueBuf.Get<float>();
        LocalTensor<float> sq = termBuf.Get<float>();
        LocalTensor<float> tg = termGBuf.Get<float>();
        LocalTensor<float> tgd = termGdBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Adds(d, x, -mean, lanes);   // x + (-mean) == x - mean in IEEE
        AscendC::Mul(sq, d, d, lanes);
        AscendC::Mul(tgd, g, d, lanes);
        SelectUnmasked(sq, sq, m, maskHalfBuf.Get<half>(), bits, lanes, NegZero());   // bits: the mask
        AscendC::Select(tg, bits, g, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        AscendC::Select(tgd, bits, tgd, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        if (len < lanes) {
            SelectValidLanes(sq, sq, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
            SelectValidLanes(tg, tg, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
            SelectValidLanes(tgd, tgd, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
        }
        AscendC::Add(ss, ss, sq, lanes);
        AscendC::Add(gs, gs, tg, lanes);
        AscendC::Add(gd, gd, tgd, lanes);
        gQueue.FreeTensor(g);
        maskQueue.FreeTensor(m);
        xQueue.FreeTensor(x);
    }

    // out = select(m, ((g - gbar) - (d * inv) * c) * inv [+ gbar], +0.0), d = x - mean.
    __aicore__ inline void ComputeWhitenGrad(float mean, float inv, float gbar, float c)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> z = valueBuf.Get<float>();
        AscendC::Adds(z, x, -mean, lanes);
        AscendC::Muls(z, z, inv, lanes);     // z = d * inv, the forward's output before the mask
        AscendC::Muls(z, z, c, lanes);
        AscendC::Adds(out, g, -gbar, lanes);
        AscendC::Sub(out, out, z, lanes);
        AscendC::Muls(out, out, inv, lanes);
        if (!shiftMean) {
            AscendC::Adds(out, out, gbar, lanes);
        }
        SelectUnmasked(out, out, m, maskHalfBuf.Get<half>(), bitsBuf.Get<uint8_t>(), lanes, 0.0f);
        outQueue.EnQue(out);
        gQueue.FreeTensor(g);
        maskQueue.FreeTensor(m);
        xQueue.FreeTensor(x);
    }

    // Passes 2 and 3 of masked_whiten's backward; r = the forward's R.
    __aicore__ inline void WhitenGrad(uint64_t rowStart, float count, float r, float mean)
    {
        LocalTensor<float> ssPartials = partialBuf.Get<float>();
        LocalTensor<float> gPartials = gPartialBuf.Get<float>();
        LocalTensor<float> gdPartials = gdPartialBuf.Get<float>();
        LocalTensor<float> ss = accBuf.Get<float>();
        LocalTensor<float> gs = accGBuf.Get<float>();
        LocalTensor<float> gd = accGdBuf.Get<float>();
        AscendC::Duplicate(ssPartials, NegZero(), geo.PartialLanes());
        AscendC::Duplicate(gPartials, NegZero(), geo.PartialLanes());
        AscendC::Duplicate(gdPartials, NegZero(), geo.PartialLanes());
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            AscendC::Duplicate(ss, NegZero(), geo.lanes);
            AscendC::Duplicate(gs, NegZero(), geo.lanes);
            AscendC::Duplicate(gd, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint32_t len = geo.ChunkLength(seg, c);
                CopyInGrad(rowStart + geo.ChunkStart(seg, c), len);
                ComputeGradSums(ss, gs, gd, mean, len);
            }
            ssPartials.SetValue(seg, TreeSum(ss, geo.treeWidth));
            gPartials.SetValue(seg, TreeSum(gs, geo.treeWidth));
            gdPartials.SetValue(seg, TreeSum(gd, geo.treeWidth));
            ScalarToVectorSync();
        }
        const uint32_t width = NextPow2(geo.segments);
        float ssum = TreeSum(ssPartials, width);
        float gsum = TreeSum(gPartials, width);
        float gdsum = TreeSum(gdPartials, width);
        ScalarToVectorSync();
        float divisor = unbiased ? count - 1.0f : count;   // exact: count is an integer <= 2^24
        divisor = divisor > 1.0f ? divisor : 1.0f;
        float rk = ScalarReciprocal(divisor);
        float var = ssum * rk;
        float inv = ScalarRsqrt(Floored(var));
        float gbar = gsum * r + 0.0f;
        float scaled = gdsum * rk;
        float c = scaled * inv;
        if (epsMode == EpsMode::CLAMP && var < eps) {
            c = 0.0f;
        }
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            for (uint32_t ch = 0; ch < geo.DataChunks(seg); ++ch) {
                uint64_t offset = rowStart + geo.ChunkStart(seg, ch);
                uint32_t len = geo.ChunkLength(seg, ch);
                CopyInGrad(offset, len);
                ComputeWhitenGrad(mean, inv, gbar, c);
                CopyOut(offset, len);
            }
        }
    }

    // var + eps (ADD) or max(var, eps) (CLAMP), NaN-propagating as numpy's maximum (spec 15.3).
    __aicore__ inline float Floored(float var)
    {
        if (epsMode == EpsMode::ADD) {
            return var + eps;
        }
        return (var >= eps || var != var) ? var : eps;
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
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accGBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accGdBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termGBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termGdBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> gPartialBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> gdPartialBuf;
    RowResults results;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> outGm;
    AscendC::GlobalTensor<float> gGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    bool hasMask = false;
    bool shiftMean = true;
    bool unbiased = true;
    float eps = 0.0f;
    EpsMode epsMode = EpsMode::ADD;
};

// The backward of masked_mean (spec 26.7): dx = select(m, g * R, +0.0), R the forward's 1/count.
class KernelMaskedMeanGrad {
public:
    __aicore__ inline KernelMaskedMeanGrad() {}

    // mask: bool[rows, cols]; g: f32[rows]; out: f32[rows, cols].
    __aicore__ inline void Init(GM_ADDR mask, GM_ADDR g, GM_ADDR out, uint32_t rows, uint32_t cols)
    {
        this->cols = cols;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
        gGm.SetGlobalBuffer((__gm__ float*)g, rows);
        outGm.SetGlobalBuffer((__gm__ float*)out, elements);
        pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(countBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(onesBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        pipe.InitBuffer(bitsBuf, LANES / 8);
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
            float n = RowCount(rowStart);
            float r = n == 0.0f ? 0.0f
                                : ReciprocalOfScalar(n, scalarInBuf.Get<float>(), scalarOutBuf.Get<float>(),
                                                     scalarWorkBuf.Get<float>());
            float value = gGm.GetValue(row) * r;
            for (uint32_t seg = 0; seg < geo.segments; ++seg) {
                for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                    uint64_t offset = rowStart + geo.ChunkStart(seg, c);
                    uint32_t len = geo.ChunkLength(seg, c);
                    CopyIn(offset, len);
                    Compute(value);
                    CopyOut(offset, len);
                }
            }
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<uint8_t> m = maskQueue.AllocTensor<uint8_t>();
        LoadChunk(m, maskGm[offset], len);
        maskQueue.EnQue(m);
    }

    __aicore__ inline void Compute(float value)
    {
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        AscendC::Duplicate(out, value, geo.lanes);
        SelectUnmasked(out, out, m, maskHalfBuf.Get<half>(), bitsBuf.Get<uint8_t>(), geo.lanes, 0.0f);
        outQueue.EnQue(out);
        maskQueue.FreeTensor(m);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    // The number of counted entries of a row, exact (tiling.h's AccumulateCount).
    __aicore__ inline float RowCount(uint64_t rowStart)
    {
        LocalTensor<float> count = countBuf.Get<float>();
        AscendC::Duplicate(count, NegZero(), geo.lanes);
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(rowStart + geo.ChunkStart(seg, c), len);
                LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
                AccumulateCount(count, m, maskHalfBuf.Get<half>(), onesBuf.Get<float>(), termBuf.Get<float>(),
                                laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes);
                maskQueue.FreeTensor(m);
            }
        }
        float n = TreeSum(count, geo.treeWidth);
        ScalarToVectorSync();
        return n;
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> countBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> onesBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarInBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarOutBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarWorkBuf;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_masked_mean(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                            uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelMasked<bitparity::MaskedOp::MEAN> op;
    op.Init(x, mask, out, rows, cols, hasMask, 1, 1, 0.0f, 0);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_masked_whiten(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                              uint32_t cols, uint32_t shiftMean, uint32_t unbiased,
                                                              float eps, uint32_t epsMode)
{
    bitparity::KernelMasked<bitparity::MaskedOp::WHITEN> op;
    op.Init(x, mask, out, rows, cols, 1, shiftMean, unbiased, eps, epsMode);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_masked_mean_backward(GM_ADDR mask, GM_ADDR g, GM_ADDR out,
                                                                     uint32_t rows, uint32_t cols)
{
    bitparity::KernelMaskedMeanGrad op;
    op.Init(mask, g, out, rows, cols);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_masked_whiten_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR g,
                                                                       GM_ADDR out, uint32_t rows, uint32_t cols,
                                                                       uint32_t shiftMean, uint32_t unbiased,
                                                                       float eps, uint32_t epsMode)
{
    bitparity::KernelMasked<bitparity::MaskedOp::WHITEN_BACKWARD> op;
    op.Init(x, mask, out, rows, cols, 1, shiftMean, unbiased, eps, epsMode);
    op.InitGradient(g, rows);
    op.Process();
}
