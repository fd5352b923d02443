// attention (spec 24.4) as an Ascend C kernel for Atlas A2.
//
//   q: f32[groups, tq, d] (GM); kT: f32[groups, d, tk], k transposed by the host (a
//   copy: no arithmetic); v: f32[groups, tk, d]; kvLengths: int64[groups] in [1, tk];
//   out: f32[groups, tq, d]; causal: 0 or 1 (then tq <= tk); scale: float32.
//
// The keys that count for query i form a prefix: j < L_i = min(kvLengths[g],
// i + tk - tq + 1) when causal, else kvLengths[g].  The keys past L_i enter the
// softmax as -inf and both key sums as -0.0, the identities of the maximum and of
// the sum (spec 3.1), so each query is computed over its prefix alone, with
// the canonical geometry of L_i: the same bits, and never a read of the keys
// or values past it.  Per query, in the spec's order:
//   s_j = dot(q_i, k_j) over d, j < L_i: DotTiles over kT (dot_tiles.h), in key
//     blocks, into a score row in UB;
//   w = s * scale, lanes past L_i -inf; m = TreeMax (+ 0.0); the split sums and the
//     combine of softmax_stats.h (the softmax of spec 8.2; L_i <= LANES is one
//     segment, so the combine's shift is the segment's) give recip;
//   p_j = exp(w_j - shift) * recip;
//   out_i[e] = dot(p, v[:, e]) over j < L_i: DotTiles over v, whose [tk, d] layout
//     is already the transposed operand, in blocks of d.
// Queries (group, i) are spread over AI cores.
//
// Sized for tk <= ATTENTION_MAX_KEYS (one chunk of keys, so one segment) and
// d <= ATTENTION_MAX_DIM (row_limits.h), which the host checks.  UB budget (bytes):
// two DotTiles with 2048-float accumulators (each at most 8 columns x 1024 rows:
// weight 2 x 32768, accumulator 32768; the score dots over d <= 256 at most 24,576),
// score and probability rows 2 x 4096, softmax scratch 4 x 4096 + work 16384,
// laneIndex 4096, bits 128, per-segment max/count/rest 3 x 256, out 2 x 4 x B
// (B <= 256): at most 165,760 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "dot_tiles.h"
#include "softmax_stats.h"
#include "row_limits.h"

namespace bitparity {

constexpr uint32_t ATTENTION_TILE_FLOATS = 2048;

class KernelAttention {
public:
    __aicore__ inline KernelAttention() {}

    __aicore__ inline void Init(GM_ADDR q, GM_ADDR kT, GM_ADDR v, GM_ADDR kvLengths, GM_ADDR out, uint32_t groups,
                                uint32_t tq, uint32_t tk, uint32_t d, uint32_t causal, float scale)
    {
        this->tq = tq;
        this->tk = tk;
        this->d = d;
        this->causal = causal != 0;
        this->scale = scale;
        share = ThisCoresShare(groups * tq);
        qGm.SetGlobalBuffer((__gm__ float*)q, static_cast<uint64_t>(groups) * tq * d);
        kGm.SetGlobalBuffer((__gm__ float*)kT, static_cast<uint64_t>(groups) * d * tk);
        vGm.SetGlobalBuffer((__gm__ float*)v, static_cast<uint64_t>(groups) * tk * d);
        lengthsGm.SetGlobalBuffer((__gm__ int64_t*)kvLengths, groups);
        outGm.SetGlobalBuffer((__gm__ float*)out, static_cast<uint64_t>(groups) * tq * d);
        scoreDots.Init(&pipe, d, tk, ATTENTION_TILE_FLOATS);
        valueDots.Init(&pipe, tk, d, ATTENTION_TILE_FLOATS);
        pipe.InitBuffer(outQueue, BUFFER_NUM, valueDots.Columns() * sizeof(float));
        const uint32_t keyLanes = RoundUp(tk, LANES);
        pipe.InitBuffer(scoreBuf, keyLanes * sizeof(float));
        pipe.InitBuffer(probBuf, keyLanes * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(acc2Buf, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(segMaxBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(segCountBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(segRestBuf, FLOATS_PER_REPEAT * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
    }

    __aicore__ inline void Process()
    {
        for (uint32_t item = share.begin; item < share.end; ++item) {
            const uint32_t group = item / tq;
            const uint32_t i = item % tq;
            uint32_t keys = static_cast<uint32_t>(lengthsGm.GetValue(group));
            if (causal && i + (tk - tq) + 1 < keys) {
                keys = i + (tk - tq) + 1;
            }
            Scores(group, i, keys);
            Probabilities(keys);
            Output(group, i, keys);
        }
    }

private:
    // scores[0 .. keys) = dot(q_i, k_j), in key blocks of scoreDots' width.
    __aicore__ inline void Scores(uint32_t group, uint32_t i, uint32_t keys)
    {
        const uint64_t qStart = (static_cast<uint64_t>(group) * tq + i) * d;
        const AscendC::GlobalTensor<float> k = kGm[static_cast<uint64_t>(group) * d * tk];
        LocalTensor<float> scores = scoreBuf.Get<float>();
        const uint32_t block = scoreDots.Columns();
        for (uint32_t j0 = 0; j0 < keys; j0 += block) {
            const uint32_t cols = keys - j0 < block ? keys - j0 : block;
            scoreDots.Dots([&](uint32_t e) { return qGm.GetValue(qStart + e); }, k[j0], tk, d, cols, scores[j0]);
        }
    }

    // probs[0 .. keys) = softmax of scores * scale over the keys (spec 8, one segment).
    __aicore__ inline void Probabilities(uint32_t keys)
    {
        const RowGeometry geo = MakeRowGeometry(keys);
        const SoftmaxScratch scratch{accBuf.Get<float>(), acc2Buf.Get<float>(), eBuf.Get<float>(),
                                     termBuf.Get<float>(), workBuf.Get<float>(), bitsBuf.Get<uint8_t>()};
        LocalTensor<float> scores = scoreBuf.Get<float>();
        LocalTensor<float> laneIndex = laneIndexBuf.Get<float>();
        // w = s * scale, -inf past the keys; the lane-wise max.
        AscendC::Duplicate(scratch.acc, NegInf(), geo.lanes);
        for (uint32_t c = 0; c < geo.chunks; ++c) {
            LocalTensor<float> w = scores[c * LANES];
            const uint32_t len = geo.ChunkLength(0, c);
            AscendC::Muls(w, w, scale, geo.lanes);
            if (len < geo.lanes) {
                SelectValidLanes(w, w, laneIndex, scratch.bits, len, geo.lanes, NegInf());
            }
            NanMax(scratch.acc, scratch.acc, w, scratch.e, scratch.bits, geo.lanes);
        }
        const float m = TreeMax(scratch.acc, geo.lanes, scratch.e, scratch.bits);
        const float shift = m == NegInf() ? 0.0f : m;
        ScalarToVectorSync();
        // The split sums leave w - shift in the score row: exp of it is the probability's numerator.
        // The one segment's m, n, t in lane 0; the absent segments' -inf, -0.0, -0.0 in the others.
        LocalTensor<float> segMax = segMaxBuf.Get<float>();
        LocalTensor<float> segCount = segCountBuf.Get<float>();
        LocalTensor<float> segRest = segRestBuf.Get<float>();
        AscendC::Duplicate(segMax, NegInf(), FLOATS_PER_REPEAT);
        AscendC::Duplicate(segCount, NegZero(), FLOATS_PER_REPEAT);
        AscendC::Duplicate(segRest, NegZero(), FLOATS_PER_REPEAT);
        const SplitSums sums = SegmentSplitSums(scores, geo.chunks, geo.lanes, geo.treeWidth, shift, scratch);
        segMax.SetValue(0, m);
        segCount.SetValue(0, sums.count);
        segRest.SetValue(0, sums.rest);
        ScalarToVectorSync();
        const SoftmaxStats st = CombineSegments(segMax, segCount, segRest, 1, m, laneIndex, scratch);
        LocalTensor<float> probs = probBuf.Get<float>();
        for (uint32_t c = 0; c < geo.chunks; ++c) {
            CanonicalExp(probs[c * LANES], scores[c * LANES], scratch.work, scratch.bits, geo.lanes);
            AscendC::Muls(probs[c * LANES], probs[c * LANES], st.recip, geo.lanes);
        }
        VectorToScalarSync();   // the value dots read the probabilities as scalars
    }

    // out_i = dot(p, v[:, e]) over the keys, in blocks of valueDots' width.
    __aicore__ inline void Output(uint32_t group, uint32_t i, uint32_t keys)
    {
        const AscendC::GlobalTensor<float> v = vGm[static_cast<uint64_t>(group) * tk * d];
        const uint64_t outStart = (static_cast<uint64_t>(group) * tq + i) * d;
        LocalTensor<float> probs = probBuf.Get<float>();
        const uint32_t block = valueDots.Columns();
        for (uint32_t e0 = 0; e0 < d; e0 += block) {
            const uint32_t cols = d - e0 < block ? d - e0 : block;
            LocalTensor<float> out = outQueue.AllocTensor<float>();
            valueDots.Dots([&](uint32_t j) { return probs.GetValue(j); }, v[e0], d, keys, cols, out);
            outQueue.EnQue(out);
            out = outQueue.DeQue<float>();
            StoreChunk(outGm[outStart + e0], out, cols);
            outQueue.FreeTensor(out);
        }
        ScalarToVectorSync();   // the next query's vector writes to the probabilities
    }

    AscendC::TPipe pipe;
    DotTiles scoreDots;
    DotTiles valueDots;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scoreBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> probBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> acc2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segMaxBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segCountBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segRestBuf;
    AscendC::GlobalTensor<float> qGm;
    AscendC::GlobalTensor<float> kGm;
    AscendC::GlobalTensor<float> vGm;
    AscendC::GlobalTensor<int64_t> lengthsGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t tq = 0;
    uint32_t tk = 0;
    uint32_t d = 0;
    bool causal = false;
    float scale = 1.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_attention(GM_ADDR q, GM_ADDR kT, GM_ADDR v, GM_ADDR kvLengths,
                                                          GM_ADDR out, uint32_t groups, uint32_t tq, uint32_t tk,
                                                          uint32_t d, uint32_t causal, float scale)
{
    bitparity::KernelAttention op;
    op.Init(q, kT, v, kvLengths, out, groups, tq, tk, d, causal, scale);
    op.Process();
}
