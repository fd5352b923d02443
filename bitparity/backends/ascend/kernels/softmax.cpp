// The softmax family (spec 8) as Ascend C kernels for Atlas A2:
// logsumexp, log_softmax, softmax, entropy and token_logprobs, and their
// backwards (spec 26), each beside its forward.
//
//   x: f32[rows, cols] (GM); mask: bool[rows, cols] or absent (tokens: int64[rows]
//   for token_logprobs); scale: f32[rows], each row's float32 inverse temperature,
//   read once per row; out: f32[rows] or f32[rows, cols].
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
// Backward (spec 26), beside the forwards:
//   logsumexp, entropy and token_logprobs recompute the forward's Stats (the same
//   code, so shift, total, log_total and recip are the forward's bits), then map
//   the row once more with the per-row g (and H): P = exp(ls), ls the forward's
//   log_softmax ((w - shift) - log_total, -inf for an empty row);
//     logsumexp:      dx = select(m, (g * P) * scale, +0.0);
//     entropy:        q = e * recip, a = log_total - d, dx = ((q * (a - H)) * g) * scale,
//                     +0.0 where e == 0, then +0.0 where m is False (a NaN shift reaches those);
//     token_logprobs: dx = (select(i == t, g, +0.0) - P * g) * scale.
//   log_softmax and softmax take the forward's output y (KernelSoftmaxOutputGrad):
//     pass 1: G = canonical sum of select(m, g, -0.0) (log_softmax) or of
//       select(m, g * p, -0.0) (softmax), by segments and lanes as in reduce.cpp;
//     pass 2: dx = select(m, (g - exp(y) * G) * scale, +0.0) or
//       select(m, (p * (g - G)) * scale, +0.0).
//   The mask's compare bits are kept in their own 128 B (maskBits) across a
//   chunk's arithmetic, for the final select.  Rows spread over cores as above.
//
// UB budget (bytes): x 2 x 4096 + mask 2 x 1024 (VECIN), out 2 x 4096 (VECOUT,
// log_softmax, softmax and the backwards), segment cache 65536, acc x2, e, term
// and w tiles 5 x 4096, exp/log work 16384, laneIndex 4096, maskHalf 2048, bits
// 128, maskBits 128 (the masked backwards), per-segment max/count/rest/partials
// 4 x 4096, results 4096 (the per-row ops): at most 143,616 B (a masked backward)
// of the 188,416 B (184 KB) InitBuffer may use.
// KernelSoftmaxOutputGrad: y, g 2 x 2 x 4096 + mask 2 x 1024 (VECIN), out 2 x 4096
// (VECOUT), acc, term 2 x 4096, exp work 16384, laneIndex 4096, maskHalf 2048, bits
// 128, partials 4096: 61,568 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "softmax_stats.h"

namespace bitparity {

enum class SoftmaxOp {
    LOGSUMEXP, LOG_SOFTMAX, SOFTMAX, ENTROPY, TOKEN_LOGPROBS,
    // The backwards (spec 26) that recompute the forward's row statistics from x.
    LOGSUMEXP_BACKWARD, ENTROPY_BACKWARD, TOKEN_LOGPROBS_BACKWARD
};

template <SoftmaxOp OP>
class KernelSoftmax {
    static constexpr bool GRAD = OP == SoftmaxOp::LOGSUMEXP_BACKWARD || OP == SoftmaxOp::ENTROPY_BACKWARD ||
                                 OP == SoftmaxOp::TOKEN_LOGPROBS_BACKWARD;
    static constexpr bool MAPS_ROWS = OP == SoftmaxOp::LOG_SOFTMAX || OP == SoftmaxOp::SOFTMAX || GRAD;
    static constexpr bool TOKENS = OP == SoftmaxOp::TOKEN_LOGPROBS || OP == SoftmaxOp::TOKEN_LOGPROBS_BACKWARD;

public:
    __aicore__ inline KernelSoftmax() {}

    // other: the mask (or nullptr) for the masked ops, the tokens for TOKEN_LOGPROBS(_BACKWARD).
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR other, GM_ADDR scale, GM_ADDR out, uint32_t rows, uint32_t cols,
                                uint32_t hasMask)
    {
        this->cols = cols;
        this->hasMask = hasMask != 0;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        scaleGm.SetGlobalBuffer((__gm__ float*)scale, rows);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        if (this->hasMask) {
            maskGm.SetGlobalBuffer((__gm__ uint8_t*)other, elements);
            pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
            pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        }
        if constexpr (TOKENS) {
            tokensGm.SetGlobalBuffer((__gm__ int64_t*)other, rows);
        }
        if constexpr (GRAD) {
            if (this->hasMask) {
                pipe.InitBuffer(maskBitsBuf, LANES / 8);
            }
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

    // The backwards' upstream gradient g: f32[rows], and the forward's entropy h: f32[rows] (ENTROPY_BACKWARD).
    __aicore__ inline void InitGradient(GM_ADDR g, GM_ADDR h, uint32_t rows)
    {
        gGm.SetGlobalBuffer((__gm__ float*)g, rows);
        if constexpr (OP == SoftmaxOp::ENTROPY_BACKWARD) {
            hGm.SetGlobalBuffer((__gm__ float*)h, rows);
        }
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            scale = scaleGm.GetValue(row);
            SoftmaxStats s = Stats(rowStart);
            if constexpr (OP == SoftmaxOp::LOGSUMEXP) {
                results.Put(row, s.shift + s.logTotal);
            } else if constexpr (OP == SoftmaxOp::TOKEN_LOGPROBS) {
                results.Put(row, TokenLogprob(row, rowStart, s));
            } else if constexpr (OP == SoftmaxOp::ENTROPY) {
                results.Put(row, Entropy(rowStart, s));
            } else if constexpr (GRAD) {
                GradRow(row, rowStart, s);
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
    // The backwards keep the mask's compare bits in maskBits for their final select.
    __aicore__ inline void ComputeScaled(const LocalTensor<float>& w, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Muls(w, x, scale, geo.lanes);
        xQueue.FreeTensor(x);
        if (hasMask) {
            LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
            LocalTensor<uint8_t> maskBits = GRAD ? maskBitsBuf.Get<uint8_t>() : bits;
            SelectUnmasked(w, w, m, maskHalfBuf.Get<half>(), maskBits, geo.lanes, NegInf());
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

    // ---- Backward (spec 26) of logsumexp, entropy and token_logprobs ------------------

    // dx of one row into outGm, from the forward's statistics s and this row's g (and H).
    __aicore__ inline void GradRow(uint32_t row, uint64_t rowStart, const SoftmaxStats& s)
    {
        const uint32_t lanes = geo.lanes;
        const float g = gGm.GetValue(row);
        float h = 0.0f;
        int64_t token = -1;
        if constexpr (OP == SoftmaxOp::ENTROPY_BACKWARD) {
            h = hGm.GetValue(row);
        }
        if constexpr (OP == SoftmaxOp::TOKEN_LOGPROBS_BACKWARD) {
            token = tokensGm.GetValue(row);
        }
        LocalTensor<float> w = wBuf.Get<float>();
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint64_t start = geo.ChunkStart(seg, c);
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(rowStart + start, len);
                ComputeScaled(w, len);
                LocalTensor<float> out = outQueue.AllocTensor<float>();
                if constexpr (OP == SoftmaxOp::ENTROPY_BACKWARD) {
                    AscendC::Adds(w, w, -s.shift, lanes);           // d = w - shift
                    CanonicalExp(e, w, work, bits, lanes);
                    AscendC::Muls(term, e, s.recip, lanes);         // q = e * recip
                    LocalTensor<float> a = accBuf.Get<float>();
                    AscendC::Duplicate(a, s.logTotal, lanes);
                    AscendC::Sub(a, a, w, lanes);                   // a = log_total - d
                    AscendC::Adds(a, a, -h, lanes);                 // a - H
                    AscendC::Mul(term, term, a, lanes);
                    AscendC::Muls(term, term, g, lanes);
                    AscendC::Muls(out, term, scale, lanes);
                    AscendC::Compares(bits, e, 0.0f, AscendC::CMPMODE::NE, lanes);
                    AscendC::Select(out, bits, out, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
                    // A masked entry has e == 0 already, except in a row whose shift is NaN.
                    if (hasMask) {
                        AscendC::Select(out, maskBitsBuf.Get<uint8_t>(), out, 0.0f,
                                        AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
                    }
                } else {
                    // P = exp(ls), ls the forward's log_softmax (-inf everywhere in an empty row).
                    if (s.total == 0.0f) {
                        AscendC::Duplicate(w, NegInf(), lanes);
                    } else {
                        AscendC::Adds(w, w, -s.shift, lanes);
                        AscendC::Adds(w, w, -s.logTotal, lanes);
                    }
                    CanonicalExp(e, w, work, bits, lanes);
                    if constexpr (OP == SoftmaxOp::LOGSUMEXP_BACKWARD) {
                        AscendC::Muls(out, e, g, lanes);            // g * P
                        AscendC::Muls(out, out, scale, lanes);
                        if (hasMask) {
                            AscendC::Select(out, maskBitsBuf.Get<uint8_t>(), out, 0.0f,
                                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
                        }
                    } else {
                        AscendC::Muls(e, e, g, lanes);              // P * g
                        AscendC::Duplicate(out, 0.0f, lanes);
                        const int64_t lane = token - static_cast<int64_t>(start);   // the token's lane, if here
                        if (lane >= 0 && lane < static_cast<int64_t>(len)) {
                            AscendC::Compares(bits, laneIndexBuf.Get<float>(), static_cast<float>(lane),
                                              AscendC::CMPMODE::EQ, lanes);
                            AscendC::Duplicate(term, g, lanes);
                            AscendC::Select(out, bits, term, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
                        }
                        AscendC::Sub(out, out, e, lanes);           // select(i == t, g, +0.0) - P * g
                        AscendC::Muls(out, out, scale, lanes);
                    }
                }
                outQueue.EnQue(out);
                CopyOut(rowStart + start, len);
            }
        }
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
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskBitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segMaxBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segCountBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segRestBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    RowResults results;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<int64_t> tokensGm;
    AscendC::GlobalTensor<float> scaleGm;
    AscendC::GlobalTensor<float> outGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> hGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    float scale = 1.0f;     // the current row's
    bool hasMask = false;
};

// ---- Backward (spec 26) of log_softmax and softmax, from the forward's output ---------------

enum class OutputGradOp { LOG_SOFTMAX, SOFTMAX };

template <OutputGradOp OP>
class KernelSoftmaxOutputGrad {
public:
    __aicore__ inline KernelSoftmaxOutputGrad() {}

    // y: the forward's output f32[rows, cols]; mask: bool[rows, cols] or nullptr; scale: f32[rows];
    // g: f32[rows, cols].
    __aicore__ inline void Init(GM_ADDR y, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out, uint32_t rows,
                                uint32_t cols, uint32_t hasMask)
    {
        this->cols = cols;
        this->hasMask = hasMask != 0;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        yGm.SetGlobalBuffer((__gm__ float*)y, elements);
        scaleGm.SetGlobalBuffer((__gm__ float*)scale, rows);
        gGm.SetGlobalBuffer((__gm__ float*)g, elements);
        outGm.SetGlobalBuffer((__gm__ float*)out, elements);
        pipe.InitBuffer(yQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(gQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        if (this->hasMask) {
            maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
            pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
            pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        }
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            scale = scaleGm.GetValue(row);
            MapRow(rowStart, RowSum(rowStart));
        }
    }

private:
    // ---- Stages of one chunk ------------------------------------------------

    // g and the mask (if any), and y when the stage reads it.
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len, bool withY)
    {
        EnqueueRowChunk(gQueue, maskQueue, gGm, maskGm, hasMask, offset, len);
        if (withY) {
            LocalTensor<float> y = yQueue.AllocTensor<float>();
            LoadChunk(y, yGm[offset], len);
            yQueue.EnQue(y);
        }
    }

    // acc += select(m, g, -0.0) (log_softmax) or select(m, g * p, -0.0) (softmax), lanes >= len -0.0.
    __aicore__ inline void ComputeTerm(const LocalTensor<float>& acc, uint32_t len)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        LocalTensor<float> v = g;
        if constexpr (OP == OutputGradOp::SOFTMAX) {
            LocalTensor<float> p = yQueue.DeQue<float>();
            AscendC::Mul(term, g, p, lanes);
            yQueue.FreeTensor(p);
            v = term;
        }
        if (hasMask) {
            LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
            SelectUnmasked(term, v, m, maskHalfBuf.Get<half>(), bits, lanes, NegZero());
            maskQueue.FreeTensor(m);
            v = term;
        }
        if (len < lanes) {
            SelectValidLanes(term, v, laneIndexBuf.Get<float>(), bits, len, lanes, NegZero());
            v = term;
        }
        AscendC::Add(acc, acc, v, lanes);
        gQueue.FreeTensor(g);
    }

    // out = select(m, (g - exp(y) * G) * scale, +0.0) or select(m, (p * (g - G)) * scale, +0.0).
    __aicore__ inline void ComputeGrad(float bigG)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> g = gQueue.DeQue<float>();
        LocalTensor<float> y = yQueue.DeQue<float>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        if constexpr (OP == OutputGradOp::LOG_SOFTMAX) {
            CanonicalExp(term, y, workBuf.Get<float>(), bits, lanes);
            AscendC::Muls(term, term, bigG, lanes);
            AscendC::Sub(out, g, term, lanes);
        } else {
            AscendC::Adds(term, g, -bigG, lanes);         // g + (-G) == g - G in IEEE
            AscendC::Mul(out, y, term, lanes);
        }
        AscendC::Muls(out, out, scale, lanes);
        yQueue.FreeTensor(y);
        gQueue.FreeTensor(g);
        if (hasMask) {
            LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
            SelectUnmasked(out, out, m, maskHalfBuf.Get<half>(), bits, lanes, 0.0f);
            maskQueue.FreeTensor(m);
        }
        outQueue.EnQue(out);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    // ---- Passes over a row ----------------------------------------------------

    // Pass 1: G, the canonical sum (spec 3) of the counted terms.
    __aicore__ inline float RowSum(uint64_t rowStart)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(rowStart + geo.ChunkStart(seg, c), len, OP == OutputGradOp::SOFTMAX);
                ComputeTerm(acc, len);
            }
            partials.SetValue(seg, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float bigG = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return bigG;
    }

    // Pass 2: dx chunk by chunk.
    __aicore__ inline void MapRow(uint64_t rowStart, float bigG)
    {
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint64_t offset = rowStart + geo.ChunkStart(seg, c);
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(offset, len, true);
                ComputeGrad(bigG);
                CopyOut(offset, len);
            }
        }
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> yQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> gQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    AscendC::GlobalTensor<float> yGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> scaleGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    float scale = 1.0f;     // the current row's
    bool hasMask = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_logsumexp(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out,
                                                          uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::LOGSUMEXP> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_log_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out,
                                                            uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::LOG_SOFTMAX> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_softmax(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out,
                                                        uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::SOFTMAX> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_entropy(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR out,
                                                        uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::ENTROPY> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_token_logprobs(GM_ADDR x, GM_ADDR tokens, GM_ADDR scale, GM_ADDR out,
                                                               uint32_t rows, uint32_t cols)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::TOKEN_LOGPROBS> op;
    op.Init(x, tokens, scale, out, rows, cols, 0);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_logsumexp_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR g,
                                                                   GM_ADDR out, uint32_t rows, uint32_t cols,
                                                                   uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::LOGSUMEXP_BACKWARD> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.InitGradient(g, nullptr, rows);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_log_softmax_backward(GM_ADDR y, GM_ADDR mask, GM_ADDR scale, GM_ADDR g,
                                                                     GM_ADDR out, uint32_t rows, uint32_t cols,
                                                                     uint32_t hasMask)
{
    bitparity::KernelSoftmaxOutputGrad<bitparity::OutputGradOp::LOG_SOFTMAX> op;
    op.Init(y, mask, scale, g, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_softmax_backward(GM_ADDR p, GM_ADDR mask, GM_ADDR scale, GM_ADDR g,
                                                                 GM_ADDR out, uint32_t rows, uint32_t cols,
                                                                 uint32_t hasMask)
{
    bitparity::KernelSoftmaxOutputGrad<bitparity::OutputGradOp::SOFTMAX> op;
    op.Init(p, mask, scale, g, out, rows, cols, hasMask);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_entropy_backward(GM_ADDR x, GM_ADDR mask, GM_ADDR scale, GM_ADDR h,
                                                                 GM_ADDR g, GM_ADDR out, uint32_t rows, uint32_t cols,
                                                                 uint32_t hasMask)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::ENTROPY_BACKWARD> op;
    op.Init(x, mask, scale, out, rows, cols, hasMask);
    op.InitGradient(g, h, rows);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_token_logprobs_backward(GM_ADDR x, GM_ADDR tokens, GM_ADDR scale,
                                                                        GM_ADDR g, GM_ADDR out, uint32_t rows,
                                                                        uint32_t cols)
{
    bitparity::KernelSoftmax<bitparity::SoftmaxOp::TOKEN_LOGPROBS_BACKWARD> op;
    op.Init(x, tokens, scale, out, rows, cols, 0);
    op.InitGradient(g, nullptr, rows);
    op.Process();
}
