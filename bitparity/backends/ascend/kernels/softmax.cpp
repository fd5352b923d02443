// The softmax family (spec 8) as Ascend C kernels for Atlas A2:
// logsumexp, log_softmax, softmax, entropy and token_logprobs.
//
//   x: f32[rows, cols] (GM); mask: bool[rows, cols] or absent (tokens: int64[rows]
//   for token_logprobs); out: f32[rows] or f32[rows, cols]; scale: the float32
//   inverse temperature.
//
// Every op starts from the same row statistics (Stats), in the spec's order:
//   w = x * scale, masked elements and padding lanes -inf.
//   Per segment g: pass 1 loads each chunk once, keeps w in a 64 KB segment
//     cache and takes the lane-wise NaN-propagating max; m_g = TreeMax + 0.0,
//     shift_g = (m_g == -inf ? 0 : m_g).  Pass 2 reads the cache:
//     e = exp(w - shift_g); lane j accumulates, chunk by chunk,
//     count += (e == 1 ? 1 : -0.0) and rest += (e == 1 or e == 0 ? -0.0 : e);
//     n_g = TreeSum(count), t_g = TreeSum(rest) over the spec's W lanes.  A zero
//     exponential (masked, padding, underflow) adds -0.0 to both, the exact
//     identity, so the padding chunks of a short last segment are skipped (spec 8.2).
//   Row: M = max_g m_g + 0.0, shift = (M == -inf ? 0 : M); c_g = exp(m_g - shift);
//     count = tree over (c_g == 1 ? n_g : -0.0), rest = tree over
//     (c_g == 1 ? t_g : c_g * (n_g + t_g)), both padded with -0.0 to a power of two;
//     (total, err) = TwoSum(count, rest); recip = (total == 0 ? 0 : 1/total);
//     log_total = log(total) + err * recip.
// Then: logsumexp = shift + log_total; log_softmax = (w - shift) - log_total
// (-inf for an empty row); softmax = exp(w - shift) * recip; entropy =
// canonical sum of terms (e * recip) * (log_total - (w - shift)), -0.0 where
// e == 0, plus 0.0; token_logprobs = (w[token] - shift) - log_total (-inf for an
// empty row).  log_softmax, softmax and entropy reload x from GM for their pass.
//
// UB budget (bytes): x 2 x 4096 + mask 2 x 1024 (VECIN), out 2 x 4096 (VECOUT,
// log_softmax and softmax), segment cache 65536, acc x2, e, term and w tiles
// 5 x 4096, exp/log work 16384, laneIndex 4096, maskHalf 2048, bits 128,
// per-segment max/count/rest/partials 4 x 4096, results 4096 (the per-row ops):
// at most 143,488 B (log_softmax or softmax with a mask) of the 188,416 B (184 KB)
// InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "softmax_stats.h"

namespace bitparity {

enum class SoftmaxOp { LOGSUMEXP, LOG_SOFTMAX, SOFTMAX, ENTROPY, TOKEN_LOGPROBS };

template <SoftmaxOp OP>
class KernelSoftmax {
    static constexpr bool MAPS_ROWS = OP == SoftmaxOp::LOG_SOFTMAX || OP == SoftmaxOp::SOFTMAX;

public:
    __aicore__ inline KernelSoftmax() {}

    // other: the mask (or nullptr) for the masked ops, the tokens for TOKEN_LOGPROBS.
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR other, GM_ADDR out, uint32_t rows, uint32_t cols,
                                uint32_t hasMask, float scale)
    {
        this->cols = cols;
        this->scale = scale;
        this->hasMask = hasMask != 0;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        if (this->hasMask) {
            maskGm.SetGlobalBuffer((__gm__ uint8_t*)other, elements);
            pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
            pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        }
        if constexpr (OP == SoftmaxOp::TOKEN_LOGPROBS) {
            tokensGm.SetGlobalBuffer((__gm__ int64_t*)other, rows);
        }
        if constexpr (MAPS_ROWS) {
            outGm.SetGlobalBuffer((__gm__ float*)out, elements);
            pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        } else {
            results.Init(&pipe, out, rows);
        }
        pipe.InitBuffer(segmentBuf, SEGMENT * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(acc2Buf, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(wBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(segMaxBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(segCountBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(segRestBuf, MAX_SEGMENTS * sizeof(float));
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            SoftmaxStats s = Stats(rowStart);
            if constexpr (OP == SoftmaxOp::LOGSUMEXP) {
                results.Put(row, s.shift + s.logTotal);
            } else if constexpr (OP == SoftmaxOp::TOKEN_LOGPROBS) {
                results.Put(row, TokenLogprob(row, rowStart, s));
            } else if constexpr (OP == SoftmaxOp::ENTROPY) {
                results.Put(row, Entropy(rowStart, s));
            } else {
                MapRow(rowStart, s);
            }
        }
        if constexpr (!MAPS_ROWS) {
            results.Flush();
        }
    }

private:
    // ---- Stages of one chunk ------------------------------------------------

    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        EnqueueRowChunk(xQueue, maskQueue, xGm, maskGm, hasMask, offset, len);
    }

    // w = x * scale over the tile, then masked elements and lanes >= len set to -inf.
    __aicore__ inline void ComputeScaled(const LocalTensor<float>& w, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Muls(w, x, scale, geo.lanes);
        xQueue.FreeTensor(x);
        if (hasMask) {
            LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
            SelectUnmasked(w, w, m, maskHalfBuf.Get<half>(), bits, geo.lanes, NegInf());
            maskQueue.FreeTensor(m);
        }
        if (len < geo.lanes) {
            SelectValidLanes(w, w, laneIndexBuf.Get<float>(), bits, len, geo.lanes, NegInf());
        }
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    // ---- Row statistics (spec 8.2) ---------------------------------------------

    __aicore__ inline SoftmaxStats Stats(uint64_t rowStart)
    {
        LocalTensor<float> segMax = segMaxBuf.Get<float>();
        LocalTensor<float> segCount = segCountBuf.Get<float>();
        LocalTensor<float> segRest = segRestBuf.Get<float>();
        LocalTensor<float> segment = segmentBuf.Get<float>();
        const SoftmaxScratch scratch{accBuf.Get<float>(), acc2Buf.Get<float>(), eBuf.Get<float>(),
                                     termBuf.Get<float>(), workBuf.Get<float>(), bitsBuf.Get<uint8_t>()};
        const LocalTensor<float>& acc = scratch.acc;
        const LocalTensor<float>& e = scratch.e;
        const LocalTensor<uint8_t>& bits = scratch.bits;
        const uint32_t lanes = geo.lanes;
        const uint32_t partialLanes = geo.PartialLanes();

        // Partials of absent segments: max -inf, count and rest -0.0.
        AscendC::Duplicate(segMax, NegInf(), partialLanes);
        AscendC::Duplicate(segCount, NegZero(), partialLanes);
        AscendC::Duplicate(segRest, NegZero(), partialLanes);
        float rowMax = NegInf();
        for (uint32_t g = 0; g < geo.segments; ++g) {
            const uint32_t dataChunks = geo.DataChunks(g);
            // Pass 1: w into the segment cache; lane-wise max.
            AscendC::Duplicate(acc, NegInf(), lanes);
            for (uint32_t c = 0; c < dataChunks; ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                LocalTensor<float> w = segment[c * LANES];
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeScaled(w, len);
                NanMax(acc, acc, w, e, bits, lanes);
            }
            const float m = SegmentStatistics(segment, geo, g, segMax, segCount, segRest, scratch);
            rowMax = ScalarNanMax(rowMax, m);
        }
        return CombineSegments(segMax, segCount, segRest, geo.segments, rowMax + 0.0f, laneIndexBuf.Get<float>(),
                               scratch);
    }

    // ---- The ops' own passes ------------------------------------------------------

    // log_softmax or softmax of one row into outGm.
    __aicore__ inline void MapRow(uint64_t rowStart, const SoftmaxStats& s)
    {
        const uint32_t lanes = geo.lanes;
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint64_t offset = rowStart + geo.ChunkStart(g, c);
                uint32_t len = geo.ChunkLength(g, c);
                LocalTensor<float> out = outQueue.AllocTensor<float>();
                if constexpr (OP == SoftmaxOp::LOG_SOFTMAX) {
                    if (s.total == 0.0f) {
                        AscendC::Duplicate(out, NegInf(), lanes);   // an empty row
                    } else {
                        CopyIn(offset, len);
                        ComputeScaled(out, len);
                        AscendC::Adds(out, out, -s.shift, lanes);
                        AscendC::Adds(out, out, -s.logTotal, lanes);
                    }
                } else {
                    LocalTensor<float> w = wBuf.Get<float>();
                    CopyIn(offset, len);
                    ComputeScaled(w, len);
                    AscendC::Adds(w, w, -s.shift, lanes);
                    CanonicalExp(out, w, workBuf.Get<float>(), bitsBuf.Get<uint8_t>(), lanes);
                    AscendC::Muls(out, out, s.recip, lanes);
                }
                outQueue.EnQue(out);
                CopyOut(offset, len);
            }
        }
    }

    // The canonical sum (spec 3) of the entropy terms, plus 0.0.
    __aicore__ inline float Entropy(uint64_t rowStart, const SoftmaxStats& s)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> w = wBuf.Get<float>();
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeScaled(w, len);
                AscendC::Adds(w, w, -s.shift, lanes);       // d = w - shift
                CanonicalExp(e, w, work, bits, lanes);
                AscendC::Muls(term, e, s.recip, lanes);     // p = e * recip
                LocalTensor<float> q = work;                // free once Exp is done
                AscendC::Duplicate(q, s.logTotal, lanes);
                AscendC::Sub(q, q, w, lanes);               // log_total - d
                AscendC::Mul(term, term, q, lanes);
                AscendC::Compares(bits, e, 0.0f, AscendC::CMPMODE::NE, lanes);
                AscendC::Select(term, bits, term, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
                if (len < lanes) {
                    SelectValidLanes(term, term, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
                }
                AscendC::Add(acc, acc, term, lanes);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float h = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return h + 0.0f;
    }

    __aicore__ inline float TokenLogprob(uint32_t row, uint64_t rowStart, const SoftmaxStats& s)
    {
        if (s.total == 0.0f) {
            return NegInf();
        }
        int64_t token = tokensGm.GetValue(row);
        float chosen = xGm.GetValue(rowStart + static_cast<uint64_t>(token)) * scale;
        float centred = chosen - s.shift;
        return centred - s.logTotal;
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segmentBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> acc2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> wBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segMaxBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segCountBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segRestBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    RowResults results;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<int64_t> tokensGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    float scale = 1.0f;
    bool hasMask = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_logsumexp(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                          uint32_t cols, uint32_t hasMask, float scale)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::LOGSUMEXP> op;
    op.Init(x, mask, out, rows, cols, hasMask, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_log_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                            uint32_t cols, uint32_t hasMask, float scale)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::LOG_SOFTMAX> op;
    op.Init(x, mask, out, rows, cols, hasMask, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                        uint32_t cols, uint32_t hasMask, float scale)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::SOFTMAX> op;
    op.Init(x, mask, out, rows, cols, hasMask, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_entropy(GM_ADDR x, GM_ADDR mask, GM_ADDR out, uint32_t rows,
                                                        uint32_t cols, uint32_t hasMask, float scale)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::ENTROPY> op;
    op.Init(x, mask, out, rows, cols, hasMask, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_token_logprobs(GM_ADDR x, GM_ADDR tokens, GM_ADDR out, uint32_t rows,
                                                               uint32_t cols, float scale)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::TOKEN_LOGPROBS> op;
    op.Init(x, tokens, out, rows, cols, 0, scale);
    op.Process();
}
