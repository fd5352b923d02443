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
// the canonical geometry of L_i (segments of SEGMENT keys, chunks of LANES): the
// same bits, and never a read of the keys or values past it.  Per query, in the
// spec's order, one segment of keys at a time in a UB cache of SEGMENT floats:
//   statistics: per segment g, s_j = dot(q_i, k_j) over d (DotTiles over kT,
//     dot_tiles.h, chunk by chunk in key blocks), w = s * scale (lanes past L_i
//     -inf) into the cache; m_g = TreeMax; the split sums n_g, t_g of
//     softmax_stats.h (as softmax.cpp does for a long row); then CombineSegments
//     gives shift and recip;
//   values: per segment g, p_j = exp(w_j - shift) * recip in the cache (with more
//     than one segment, the scores are computed again: the cache held the last
//     segment's); per block of output columns e, lane j of an accumulator
//     [W rows, block] adds p_j * v[j, e] chunk by chunk (chunk 0 writes), the
//     halving tree over the W rows leaves segment g's partial row; the partial
//     rows [P = next_pow2(G), d], padded with -0.0, are folded by the same tree.
//     v's [tk, d] layout is already row j = key j, so a tile of keys x columns is
//     one strided copy.
// Queries (group, i) are spread over AI cores.
//
// Sized for tk <= ATTENTION_MAX_KEYS (ATTENTION_MAX_SEGMENTS partial rows) and
// d <= ATTENTION_MAX_DIM (row_limits.h), which the host checks.  UB budget (bytes)
// at the limits: score cache 65536, the score DotTiles (d <= 256: weight 2 x 8192,
// accumulator 8192), softmax acc, acc2, e, term 4 x 4096, work 32768 (the exp's
// work, then the value accumulator of LANES x 8 floats), laneIndex 4096, bits 128,
// per-segment max/count/rest 3 x 256, value tiles 2 x 8192, partial rows
// 16 x 256 x 4, out 2 x 1024: at most 179,072 B of the 188,416 B (184 KB)
// InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "dot_tiles.h"
#include "softmax_stats.h"
#include "row_limits.h"

namespace bitparity {

constexpr uint32_t ATTENTION_TILE_FLOATS = 2048;    // the score dots' accumulator
constexpr uint32_t VALUE_ACC_FLOATS = LANES * FLOATS_PER_BLOCK;   // LANES lanes of the narrowest block
constexpr uint32_t VALUE_TILE_FLOATS = 2048;        // one tile of v: keys x a block of columns

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
        dPad = RoundUp(d, FLOATS_PER_BLOCK);
        share = ThisCoresShare(groups * tq);
        qGm.SetGlobalBuffer((__gm__ float*)q, static_cast<uint64_t>(groups) * tq * d);
        kGm.SetGlobalBuffer((__gm__ float*)kT, static_cast<uint64_t>(groups) * d * tk);
        vGm.SetGlobalBuffer((__gm__ float*)v, static_cast<uint64_t>(groups) * tk * d);
        lengthsGm.SetGlobalBuffer((__gm__ int64_t*)kvLengths, groups);
        outGm.SetGlobalBuffer((__gm__ float*)out, static_cast<uint64_t>(groups) * tq * d);
        // The longest prefix is tk keys: its geometry bounds every query's.
        const RowGeometry keyGeo = MakeRowGeometry(tk);
        scoreDots.Init(&pipe, d, tk < LANES ? tk : LANES, ATTENTION_TILE_FLOATS);
        pipe.InitBuffer(valueQueue, BUFFER_NUM, VALUE_TILE_FLOATS * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, dPad * sizeof(float));
        pipe.InitBuffer(cacheBuf, ((keyGeo.chunks - 1) * LANES + keyGeo.lanes) * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(acc2Buf, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, VALUE_ACC_FLOATS * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(segMaxBuf, keyGeo.PartialLanes() * sizeof(float));
        pipe.InitBuffer(segCountBuf, keyGeo.PartialLanes() * sizeof(float));
        pipe.InitBuffer(segRestBuf, keyGeo.PartialLanes() * sizeof(float));
        pipe.InitBuffer(partialBuf, NextPow2(keyGeo.segments) * dPad * sizeof(float));
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
            const RowGeometry geo = MakeRowGeometry(keys);
            const SoftmaxStats st = Statistics(group, i, geo);
            Output(group, i, geo, st);
        }
    }

private:
    __aicore__ inline SoftmaxScratch Scratch()
    {
        return SoftmaxScratch{accBuf.Get<float>(), acc2Buf.Get<float>(), eBuf.Get<float>(),
                              termBuf.Get<float>(), workBuf.Get<float>(), bitsBuf.Get<uint8_t>()};
    }

    // cache[c * LANES ...] = w = dot(q_i, k_j) * scale for the keys j of segment g, chunk by chunk
    // in key blocks of scoreDots' width; lanes past the keys -inf.
    __aicore__ inline void SegmentScores(uint32_t group, uint32_t i, const RowGeometry& geo, uint32_t g)
    {
        const uint64_t qStart = (static_cast<uint64_t>(group) * tq + i) * d;
        const AscendC::GlobalTensor<float> k = kGm[static_cast<uint64_t>(group) * d * tk];
        LocalTensor<float> cache = cacheBuf.Get<float>();
        const uint32_t block = scoreDots.Columns();
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            const uint64_t k0 = geo.ChunkStart(g, c);
            const uint32_t len = geo.ChunkLength(g, c);
            LocalTensor<float> w = cache[c * LANES];
            for (uint32_t j0 = 0; j0 < len; j0 += block) {
                const uint32_t cols = len - j0 < block ? len - j0 : block;
                scoreDots.Dots([&](uint32_t e) { return qGm.GetValue(qStart + e); }, k[k0 + j0], tk, d, cols, w[j0]);
            }
            AscendC::Muls(w, w, scale, geo.lanes);
            if (len < geo.lanes) {
                SelectValidLanes(w, w, laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes, NegInf());
            }
        }
    }

    // The softmax statistics of w over the keys (spec 8.2), segment by segment as softmax.cpp's Stats.
    // Leaves w - shift_G-1 of the last segment in the cache.
    __aicore__ inline SoftmaxStats Statistics(uint32_t group, uint32_t i, const RowGeometry& geo)
    {
        const SoftmaxScratch scratch = Scratch();
        LocalTensor<float> cache = cacheBuf.Get<float>();
        LocalTensor<float> segMax = segMaxBuf.Get<float>();
        LocalTensor<float> segCount = segCountBuf.Get<float>();
        LocalTensor<float> segRest = segRestBuf.Get<float>();
        // Partials of absent segments: max -inf, count and rest -0.0.
        AscendC::Duplicate(segMax, NegInf(), geo.PartialLanes());
        AscendC::Duplicate(segCount, NegZero(), geo.PartialLanes());
        AscendC::Duplicate(segRest, NegZero(), geo.PartialLanes());
        float rowMax = NegInf();
        for (uint32_t g = 0; g < geo.segments; ++g) {
            SegmentScores(group, i, geo, g);
            AscendC::Duplicate(scratch.acc, NegInf(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                NanMax(scratch.acc, scratch.acc, cache[c * LANES], scratch.e, scratch.bits, geo.lanes);
            }
            const float m = SegmentStatistics(cache, geo, g, segMax, segCount, segRest, scratch);
            rowMax = ScalarNanMax(rowMax, m);
        }
        return CombineSegments(segMax, segCount, segRest, geo.segments, rowMax + 0.0f, laneIndexBuf.Get<float>(),
                               scratch);
    }

    // out_i[e] = the canonical sum over the keys of p_j * v[j, e]: segment partial rows, then their tree.
    __aicore__ inline void Output(uint32_t group, uint32_t i, const RowGeometry& geo, const SoftmaxStats& st)
    {
        const SoftmaxScratch scratch = Scratch();
        const AscendC::GlobalTensor<float> v = vGm[static_cast<uint64_t>(group) * tk * d];
        LocalTensor<float> cache = cacheBuf.Get<float>();
        LocalTensor<float> partials = partialBuf.Get<float>();
        // As many columns per block as VALUE_ACC_FLOATS holds at the tree width, a multiple of 8.
        uint32_t block = VALUE_ACC_FLOATS / geo.treeWidth;
        block = block < dPad ? block : dPad;
        for (uint32_t g = 0; g < geo.segments; ++g) {
            // One segment: the cache holds w - shift_0, and shift_0 == shift (its maximum is the row's).
            if (geo.segments > 1) {
                SegmentScores(group, i, geo, g);
            }
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                LocalTensor<float> w = cache[c * LANES];
                if (geo.segments > 1) {
                    AscendC::Adds(w, w, -st.shift, geo.lanes);
                }
                CanonicalExp(scratch.e, w, scratch.work, scratch.bits, geo.lanes);
                AscendC::Muls(w, scratch.e, st.recip, geo.lanes);
            }
            VectorToScalarSync();   // the value sums read the probabilities as scalars
            for (uint32_t e0 = 0; e0 < d; e0 += block) {
                const uint32_t cols = d - e0 < block ? d - e0 : block;
                SegmentValueSums(v[e0], geo, g, cols, partials[g * dPad + e0]);
            }
            ScalarToVectorSync();   // the next segment's (or query's) vector writes to the cache
        }
        const uint32_t p = NextPow2(geo.segments);
        if (p > geo.segments) {
            AscendC::Duplicate(partials[geo.segments * dPad], NegZero(), (p - geo.segments) * dPad);
        }
        TreeSumRows(partials, p, dPad);
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        CopyFloats(out, partials, dPad);
        outQueue.EnQue(out);
        out = outQueue.DeQue<float>();
        StoreChunk(outGm[(static_cast<uint64_t>(group) * tq + i) * d], out, d);
        outQueue.FreeTensor(out);
    }

    // partial[0 .. RoundUp(cols, 8)) = segment g's canonical sum (spec 3 steps 2-3) of p_j * v[j, n] for
    // the columns n < cols of v (v at the block's first column; lanes past cols junk).  The probabilities
    // p_j are cache[j - g * SEGMENT], read as scalars.  The accumulator is the exp's work buffer.
    __aicore__ inline void SegmentValueSums(const AscendC::GlobalTensor<float>& v, const RowGeometry& geo, uint32_t g,
                                            uint32_t cols, const LocalTensor<float>& partial)
    {
        const uint32_t bw = RoundUp(cols, FLOATS_PER_BLOCK);
        const uint32_t tileKeys = VALUE_TILE_FLOATS / bw;
        LocalTensor<float> probs = cacheBuf.Get<float>();
        LocalTensor<float> acc = workBuf.Get<float>();
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            const uint64_t k0 = geo.ChunkStart(g, c);
            const uint32_t len = geo.ChunkLength(g, c);
            for (uint32_t r0 = 0; r0 < len; r0 += tileKeys) {
                const uint32_t keys = len - r0 < tileKeys ? len - r0 : tileKeys;
                CopyInValues(v[(k0 + r0) * d], keys, cols);
                LocalTensor<float> tile = valueQueue.DeQue<float>();
                // Chunk 0 writes the accumulator rows; later chunks scale the tile in place and add it.
                LocalTensor<float> products = c == 0 ? acc[r0 * bw] : tile;
                for (uint32_t j = 0; j < keys; ++j) {
                    AscendC::Muls(products[j * bw], tile[j * bw], probs.GetValue(c * LANES + r0 + j), bw);
                }
                if (c > 0) {
                    AscendC::Add(acc[r0 * bw], acc[r0 * bw], tile, keys * bw);
                }
                valueQueue.FreeTensor(tile);
            }
            if (c == 0 && len < geo.treeWidth) {
                AscendC::Duplicate(acc[len * bw], NegZero(), (geo.treeWidth - len) * bw);
            }
        }
        TreeSumRows(acc, geo.treeWidth, bw);
        CopyFloats(partial, acc, bw);
    }

    // GM -> UB of v rows [0, keys), columns [0, cols): one DataCopyPad of `keys` blocks, each row
    // landing at a pitch of RoundUp(cols, 8) floats.
    __aicore__ inline void CopyInValues(const AscendC::GlobalTensor<float>& v, uint32_t keys, uint32_t cols)
    {
        LocalTensor<float> tile = valueQueue.AllocTensor<float>();
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(keys), static_cast<uint32_t>(cols * sizeof(float)),
                                        static_cast<uint32_t>((d - cols) * sizeof(float)), 0, 0};
        AscendC::DataCopyPadExtParams<float> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(tile, v, copy, pad);
        valueQueue.EnQue(tile);
    }

    AscendC::TPipe pipe;
    DotTiles scoreDots;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> valueQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> cacheBuf;
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
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    AscendC::GlobalTensor<float> qGm;
    AscendC::GlobalTensor<float> kGm;
    AscendC::GlobalTensor<float> vGm;
    AscendC::GlobalTensor<int64_t> lengthsGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t tq = 0;
    uint32_t tk = 0;
    uint32_t d = 0;
    uint32_t dPad = 0;
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
