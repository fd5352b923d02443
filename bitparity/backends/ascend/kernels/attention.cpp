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
// Backward (spec 29.6), beside the forward, in two launches queued in order on one stream; the host
// adds the transposes vT: f32[groups, d, tk], qT and gT: f32[groups, d, tq] (copies), g: f32[groups,
// tq, d] is the upstream gradient, stats: f32[3, groups * tq] a workspace.
//   bitparity_attention_query_grad, per query i (spread over AI cores like the forward): the
//     forward's statistics (the same code: shift and recip are its bits); then per segment of the
//     prefix, chunk by chunk: p_j = exp(w_j - shift) * recip as in the forward, dp_j = dot(g_i, v_j)
//     (the score DotTiles over vT), and lane j accumulates dp_j * p_j (-0.0 past the prefix); G_i =
//     the segments' trees folded (spec 3).  Then per segment again: ds_j = (p_j * (dp_j - G_i)) *
//     scale into the cache (dp recomputed: UB holds one chunk of it; with more than one segment p
//     too), and dq_i = the canonical sum over the keys of ds_j * k[j, :], the forward's value sums
//     over k's rows.  shift_i, recip_i and G_i go to stats.
//   bitparity_attention_backward, per key j (spread over AI cores): the queries that count for j are
//     i >= i0 = j - (tk - tq) when causal, every query otherwise, and none when j >= kvLengths[g]
//     (then dk_j = dv_j = -0.0).  Over the query axis, in the canonical geometry of tq: dv_j = the
//     canonical sum over i of p_ij * g[i, :], dk_j = that of ds_ij * q[i, :], the queries before i0
//     entering as -0.0 (their rows are not added: a segment of them is a -0.0 partial row).  Per
//     chunk of counted queries, p_ij = exp(w_ij - shift_i) * recip_i with w_ij = dot(k_j, q_i) * scale
//     (the score DotTiles over qT: the forward's dot, its products commuted) and ds_ij = (p_ij *
//     (dp_ij - G_i)) * scale with dp_ij = dot(v_j, g_i) over gT, shift, recip and G read from stats.
//     One segment cache holds p for the dv sweep, then ds for the dk sweep (p recomputed).
//
// Sized for tk <= ATTENTION_MAX_KEYS (ATTENTION_MAX_SEGMENTS partial rows), tq <=
// ATTENTION_MAX_KEYS for the backward (its per-key sums run over the queries) and
// d <= ATTENTION_MAX_DIM (row_limits.h), which the host checks.  UB budget (bytes)
// at the limits: score cache 65536, the score DotTiles (d <= 256: weight 2 x 8192,
// accumulator 8192), softmax acc, acc2, e, term 4 x 4096, work 32768 (the exp's
// work, then the value accumulator of LANES x 8 floats), laneIndex 4096, bits 128,
// per-segment max/count/rest 3 x 256, value tiles 2 x 8192, partial rows
// 16 x 256 x 4, out 2 x 1024: at most 179,072 B of the 188,416 B (184 KB)
// InitBuffer may use.  bitparity_attention_query_grad adds dp 4096, the per-segment
// G partials 256 and the stats staging 96: 183,520 B.  bitparity_attention_backward:
// cache, DotTiles, work, laneIndex, bits, value tiles, partial rows and out as above,
// e, t, dp 3 x 4096, stat tiles 2 x 4096: 182,400 B.

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

// What the attention kernels share: the score DotTiles, a UB cache of one segment of per-row weights
// along a summed axis (the keys' probabilities or their gradients, or the queries'), and the weighted
// sums of rows of a [*, d] tensor over that axis in spec 3's order (lanes, tree, segment partial rows).
class AttentionTiles {
protected:
    // axis: the longest summed axis, whose geometry sizes the cache and the partial rows.
    __aicore__ inline void InitTiles(uint32_t d, uint32_t axis, float scale)
    {
        this->d = d;
        this->scale = scale;
        dPad = RoundUp(d, FLOATS_PER_BLOCK);
        const RowGeometry geo = MakeRowGeometry(axis);
        scoreDots.Init(&pipe, d, axis < LANES ? axis : LANES, ATTENTION_TILE_FLOATS);
        pipe.InitBuffer(valueQueue, BUFFER_NUM, VALUE_TILE_FLOATS * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, dPad * sizeof(float));
        pipe.InitBuffer(cacheBuf, ((geo.chunks - 1) * LANES + geo.lanes) * sizeof(float));
        pipe.InitBuffer(workBuf, VALUE_ACC_FLOATS * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, NextPow2(geo.segments) * dPad * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
    }

    // out[0 .. len) = dot(x, wT[:, n]) over d for a chunk of len columns n (lanes past len junk), in blocks
    // of the score DotTiles' width.  xAt(e): x[e] as a scalar; wT at the chunk's first column, row pitch
    // `pitch` floats.
    template <typename XAt>
    __aicore__ inline void ChunkDots(const XAt& xAt, const AscendC::GlobalTensor<float>& wT, uint32_t pitch,
                                     uint32_t len, const LocalTensor<float>& out)
    {
        const uint32_t block = scoreDots.Columns();
        for (uint32_t j0 = 0; j0 < len; j0 += block) {
            const uint32_t cols = len - j0 < block ? len - j0 : block;
            scoreDots.Dots(xAt, wT[j0], pitch, d, cols, out[j0]);
        }
    }

    // Output columns per block of the weighted sums: as many as VALUE_ACC_FLOATS holds at the tree width,
    // a multiple of 8, at most dPad.
    __aicore__ inline uint32_t SumColumns(const RowGeometry& geo) const
    {
        const uint32_t block = VALUE_ACC_FLOATS / geo.treeWidth;
        return block < dPad ? block : dPad;
    }

    // partial[0 .. RoundUp(cols, 8)) = segment g's canonical sum (spec 3 steps 2-3) over the rows r >= first
    // of `geo`'s axis of weight_r * rows[r, n], for the columns n < cols of rows (a [*, d] tensor at the
    // block's first column; lanes past cols junk).  weight_r is cacheBuf[r - g * SEGMENT], read as a
    // scalar (the caller syncs V_S before, S_V after).  The rows before first enter as -0.0: they are not
    // added (the accumulator starts -0.0); when none of the segment's rows is before first, chunk 0 writes
    // the accumulator rows instead.  The accumulator is the exp's work buffer.
    __aicore__ inline void SegmentWeightedSums(const AscendC::GlobalTensor<float>& rows, const RowGeometry& geo,
                                               uint32_t g, uint32_t first, uint32_t cols,
                                               const LocalTensor<float>& partial)
    {
        const uint32_t bw = RoundUp(cols, FLOATS_PER_BLOCK);
        const uint32_t tileRows = VALUE_TILE_FLOATS / bw;
        LocalTensor<float> weights = cacheBuf.Get<float>();
        LocalTensor<float> acc = workBuf.Get<float>();
        const bool whole = first <= geo.ChunkStart(g, 0);
        if (!whole) {
            AscendC::Duplicate(acc, NegZero(), geo.treeWidth * bw);
        }
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            const uint64_t r0 = geo.ChunkStart(g, c);
            const uint32_t len = geo.ChunkLength(g, c);
            const uint32_t skip = first <= r0 ? 0 : (first - r0 < len ? static_cast<uint32_t>(first - r0) : len);
            const bool writes = whole && c == 0;
            for (uint32_t j0 = skip; j0 < len; j0 += tileRows) {
                const uint32_t count = len - j0 < tileRows ? len - j0 : tileRows;
                CopyInRows(rows[(r0 + j0) * d], count, cols);
                LocalTensor<float> tile = valueQueue.DeQue<float>();
                // Chunk 0 of a whole segment writes the accumulator rows; otherwise the tile is scaled in place
                // and added.
                LocalTensor<float> products = writes ? acc[j0 * bw] : tile;
                for (uint32_t j = 0; j < count; ++j) {
                    AscendC::Muls(products[j * bw], tile[j * bw], weights.GetValue(c * LANES + j0 + j), bw);
                }
                if (!writes) {
                    AscendC::Add(acc[j0 * bw], acc[j0 * bw], tile, count * bw);
                }
                valueQueue.FreeTensor(tile);
            }
            if (writes && len < geo.treeWidth) {
                AscendC::Duplicate(acc[len * bw], NegZero(), (geo.treeWidth - len) * bw);
            }
        }
        TreeSumRows(acc, geo.treeWidth, bw);
        CopyFloats(partial, acc, bw);
    }

    // The partial rows of `segments` segments, padded with -0.0 rows to a power of two and folded by the
    // halving tree (spec 3 step 4), stored to dst[0 .. d).
    __aicore__ inline void StoreFoldedRows(uint32_t segments, const AscendC::GlobalTensor<float>& dst)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        const uint32_t p = NextPow2(segments);
        if (p > segments) {
            AscendC::Duplicate(partials[segments * dPad], NegZero(), (p - segments) * dPad);
        }
        TreeSumRows(partials, p, dPad);
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        CopyFloats(out, partials, dPad);
        StoreRow(out, dst);
    }

    // An out-queue row of dPad floats, already written, stored to dst[0 .. d).
    __aicore__ inline void StoreRow(LocalTensor<float>& out, const AscendC::GlobalTensor<float>& dst)
    {
        outQueue.EnQue(out);
        out = outQueue.DeQue<float>();
        StoreChunk(dst, out, d);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    DotTiles scoreDots;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> valueQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> cacheBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    uint32_t d = 0;
    uint32_t dPad = 0;
    float scale = 1.0f;

private:
    // GM -> UB of rows [0, count), columns [0, cols) of a [*, d] tensor: one DataCopyPad of `count`
    // blocks, each row landing at a pitch of RoundUp(cols, 8) floats.
    __aicore__ inline void CopyInRows(const AscendC::GlobalTensor<float>& rows, uint32_t count, uint32_t cols)
    {
        LocalTensor<float> tile = valueQueue.AllocTensor<float>();
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(count), static_cast<uint32_t>(cols * sizeof(float)),
                                        static_cast<uint32_t>((d - cols) * sizeof(float)), 0, 0};
        AscendC::DataCopyPadExtParams<float> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(tile, rows, copy, pad);
        valueQueue.EnQue(tile);
    }
};

enum class AttentionOp { FORWARD, QUERY_GRAD };

// Per query: the forward (out = the weighted sum of v's rows), or the backward's first launch (dq = the
// weighted sum of k's rows with the score gradients, and the query's statistics).
template <AttentionOp OP>
class KernelAttention : public AttentionTiles {
    static constexpr bool GRAD = OP == AttentionOp::QUERY_GRAD;

public:
    __aicore__ inline KernelAttention() {}

    // rows: v (the forward) or k (QUERY_GRAD), [groups, tk, d]; out: the output or dq.  QUERY_GRAD only: vT, g and
    // stats (the forward passes nullptr).
    __aicore__ inline void Init(GM_ADDR q, GM_ADDR kT, GM_ADDR rows, GM_ADDR vT, GM_ADDR g, GM_ADDR kvLengths,
                                GM_ADDR out, GM_ADDR stats, uint32_t groups, uint32_t tq, uint32_t tk, uint32_t d,
                                uint32_t causal, float scale)
    {
        this->tq = tq;
        this->tk = tk;
        this->causal = causal != 0;
        queries = groups * tq;
        share = ThisCoresShare(groups * tq);
        qGm.SetGlobalBuffer((__gm__ float*)q, static_cast<uint64_t>(groups) * tq * d);
        kGm.SetGlobalBuffer((__gm__ float*)kT, static_cast<uint64_t>(groups) * d * tk);
        rowsGm.SetGlobalBuffer((__gm__ float*)rows, static_cast<uint64_t>(groups) * tk * d);
        lengthsGm.SetGlobalBuffer((__gm__ int64_t*)kvLengths, groups);
        outGm.SetGlobalBuffer((__gm__ float*)out, static_cast<uint64_t>(groups) * tq * d);
        // The longest prefix is tk keys: its geometry bounds every query's.
        InitTiles(d, tk, scale);
        const RowGeometry keyGeo = MakeRowGeometry(tk);
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(acc2Buf, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(segMaxBuf, keyGeo.PartialLanes() * sizeof(float));
        pipe.InitBuffer(segCountBuf, keyGeo.PartialLanes() * sizeof(float));
        pipe.InitBuffer(segRestBuf, keyGeo.PartialLanes() * sizeof(float));
        if constexpr (GRAD) {
            vTGm.SetGlobalBuffer((__gm__ float*)vT, static_cast<uint64_t>(groups) * d * tk);
            gGm.SetGlobalBuffer((__gm__ float*)g, static_cast<uint64_t>(groups) * tq * d);
            statsGm.SetGlobalBuffer((__gm__ float*)stats, 3 * static_cast<uint64_t>(queries));
            pipe.InitBuffer(dpBuf, LANES * sizeof(float));
            pipe.InitBuffer(segGradBuf, keyGeo.PartialLanes() * sizeof(float));
            pipe.InitBuffer(statsBuf, 3 * FLOATS_PER_BLOCK * sizeof(float));
        }
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
            if constexpr (GRAD) {
                const float gradSum = GradientSum(group, i, geo, st);
                Output(group, i, geo, st, gradSum);
                StoreStats(item, st, gradSum);
            } else {
                Output(group, i, geo, st, 0.0f);
            }
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
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            const uint64_t k0 = geo.ChunkStart(g, c);
            const uint32_t len = geo.ChunkLength(g, c);
            LocalTensor<float> w = cache[c * LANES];
            ChunkDots([&](uint32_t e) { return qGm.GetValue(qStart + e); }, k[k0], tk, len, w);
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

    // cache[c * LANES ...] = p_j = exp(w_j - shift) * recip for the keys of segment g.  With one segment the
    // cache holds w - shift_0 from Statistics, and shift_0 == shift (its maximum is the row's); with more, the
    // scores are computed again (the cache held the last segment's).
    __aicore__ inline void SegmentProbabilities(uint32_t group, uint32_t i, const RowGeometry& geo, uint32_t g,
                                                const SoftmaxStats& st)
    {
        const SoftmaxScratch scratch = Scratch();
        LocalTensor<float> cache = cacheBuf.Get<float>();
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
    }

    // dp[0 .. len) = dot(g_i, v_j) over d for chunk c of segment g's keys (lanes past len junk).
    __aicore__ inline void ChunkValueDots(uint32_t group, uint32_t i, const RowGeometry& geo, uint32_t g, uint32_t c)
    {
        const uint64_t gStart = (static_cast<uint64_t>(group) * tq + i) * d;
        ChunkDots([&](uint32_t e) { return gGm.GetValue(gStart + e); },
                  vTGm[static_cast<uint64_t>(group) * d * tk + geo.ChunkStart(g, c)], tk, geo.ChunkLength(g, c),
                  dpBuf.Get<float>());
    }

    // G_i = the canonical sum over the keys of dp_j * p_j (spec 26.4 over the counted keys; lanes past the
    // prefix -0.0), by segments and chunks.  Leaves p of the last segment in the cache.
    __aicore__ inline float GradientSum(uint32_t group, uint32_t i, const RowGeometry& geo, const SoftmaxStats& st)
    {
        const SoftmaxScratch scratch = Scratch();
        LocalTensor<float> cache = cacheBuf.Get<float>();
        LocalTensor<float> dp = dpBuf.Get<float>();
        LocalTensor<float> partials = segGradBuf.Get<float>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            SegmentProbabilities(group, i, geo, g, st);
            AscendC::Duplicate(scratch.acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                const uint32_t len = geo.ChunkLength(g, c);
                ChunkValueDots(group, i, geo, g, c);
                AscendC::Mul(scratch.term, dp, cache[c * LANES], geo.lanes);
                if (len < geo.lanes) {
                    SelectValidLanes(scratch.term, scratch.term, laneIndexBuf.Get<float>(), scratch.bits, len,
                                     geo.lanes, NegZero());
                }
                AscendC::Add(scratch.acc, scratch.acc, scratch.term, geo.lanes);
            }
            partials.SetValue(g, TreeSum(scratch.acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        const float sum = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return sum;
    }

    // cache[c * LANES ...] = ds_j = (p_j * (dp_j - G)) * scale for the keys of segment g, p in the cache.
    __aicore__ inline void SegmentScoreGradients(uint32_t group, uint32_t i, const RowGeometry& geo, uint32_t g,
                                                 float gradSum)
    {
        LocalTensor<float> cache = cacheBuf.Get<float>();
        LocalTensor<float> dp = dpBuf.Get<float>();
        LocalTensor<float> t = termBuf.Get<float>();
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            LocalTensor<float> w = cache[c * LANES];
            ChunkValueDots(group, i, geo, g, c);
            AscendC::Adds(t, dp, -gradSum, geo.lanes);
            AscendC::Mul(t, w, t, geo.lanes);
            AscendC::Muls(w, t, scale, geo.lanes);
        }
    }

    // The forward's out_i, or dq_i: per segment the weights (p, or ds after GradientSum) in the cache, the
    // weighted sums of the rows (v, or k) as partial rows, then their tree.
    __aicore__ inline void Output(uint32_t group, uint32_t i, const RowGeometry& geo, const SoftmaxStats& st,
                                  float gradSum)
    {
        const AscendC::GlobalTensor<float> rows = rowsGm[static_cast<uint64_t>(group) * tk * d];
        LocalTensor<float> partials = partialBuf.Get<float>();
        const uint32_t block = SumColumns(geo);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            // QUERY_GRAD with one segment: GradientSum left its p in the cache.
            if (!GRAD || geo.segments > 1) {
                SegmentProbabilities(group, i, geo, g, st);
            }
            if constexpr (GRAD) {
                SegmentScoreGradients(group, i, geo, g, gradSum);
            }
            VectorToScalarSync();   // the weighted sums read the weights as scalars
            for (uint32_t e0 = 0; e0 < d; e0 += block) {
                const uint32_t cols = d - e0 < block ? d - e0 : block;
                SegmentWeightedSums(rows[e0], geo, g, 0, cols, partials[g * dPad + e0]);
            }
            ScalarToVectorSync();   // the next segment's (or query's) vector writes to the cache
        }
        StoreFoldedRows(geo.segments, outGm[(static_cast<uint64_t>(group) * tq + i) * d]);
    }

    // stats[0, item] = shift, stats[1, item] = recip, stats[2, item] = G, written by the scalar unit.
    __aicore__ inline void StoreStats(uint32_t item, const SoftmaxStats& st, float gradSum)
    {
        LocalTensor<float> staged = statsBuf.Get<float>();
        staged.SetValue(0, st.shift);
        staged.SetValue(FLOATS_PER_BLOCK, st.recip);
        staged.SetValue(2 * FLOATS_PER_BLOCK, gradSum);
        ScalarToMte3Sync();
        for (uint32_t s = 0; s < 3; ++s) {
            StoreChunk(statsGm[static_cast<uint64_t>(s) * queries + item], staged[s * FLOATS_PER_BLOCK], 1);
        }
        Mte3ToScalarSync();
    }

    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> acc2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segMaxBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segCountBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segRestBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> segGradBuf;
    AscendC::TBuf<AscendC::TPosition::VECOUT> statsBuf;
    AscendC::GlobalTensor<float> qGm;
    AscendC::GlobalTensor<float> kGm;
    AscendC::GlobalTensor<float> rowsGm;
    AscendC::GlobalTensor<float> vTGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<int64_t> lengthsGm;
    AscendC::GlobalTensor<float> outGm;
    AscendC::GlobalTensor<float> statsGm;
    Range share;
    uint32_t tq = 0;
    uint32_t tk = 0;
    uint32_t queries = 0;
    bool causal = false;
};

// The backward's second launch, per key: dk and dv, sums over the queries.
class KernelAttentionKeyGrad : public AttentionTiles {
public:
    __aicore__ inline KernelAttentionKeyGrad() {}

    __aicore__ inline void Init(GM_ADDR q, GM_ADDR qT, GM_ADDR k, GM_ADDR v, GM_ADDR g, GM_ADDR gT, GM_ADDR kvLengths,
                                GM_ADDR stats, GM_ADDR dk, GM_ADDR dv, uint32_t groups, uint32_t tq, uint32_t tk,
                                uint32_t d, uint32_t causal, float scale)
    {
        this->tq = tq;
        this->tk = tk;
        this->causal = causal != 0;
        queries = groups * tq;
        share = ThisCoresShare(groups * tk);
        const uint64_t queryElements = static_cast<uint64_t>(groups) * tq * d;
        const uint64_t keyElements = static_cast<uint64_t>(groups) * tk * d;
        qGm.SetGlobalBuffer((__gm__ float*)q, queryElements);
        qTGm.SetGlobalBuffer((__gm__ float*)qT, queryElements);
        kGm.SetGlobalBuffer((__gm__ float*)k, keyElements);
        vGm.SetGlobalBuffer((__gm__ float*)v, keyElements);
        gGm.SetGlobalBuffer((__gm__ float*)g, queryElements);
        gTGm.SetGlobalBuffer((__gm__ float*)gT, queryElements);
        lengthsGm.SetGlobalBuffer((__gm__ int64_t*)kvLengths, groups);
        statsGm.SetGlobalBuffer((__gm__ float*)stats, 3 * static_cast<uint64_t>(queries));
        dkGm.SetGlobalBuffer((__gm__ float*)dk, keyElements);
        dvGm.SetGlobalBuffer((__gm__ float*)dv, keyElements);
        InitTiles(d, tq, scale);
        pipe.InitBuffer(statQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(tBuf, LANES * sizeof(float));
        pipe.InitBuffer(dpBuf, LANES * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        const RowGeometry geo = MakeRowGeometry(tq);
        for (uint32_t item = share.begin; item < share.end; ++item) {
            const uint32_t group = item / tk;
            const uint32_t j = item % tk;
            const uint64_t keyRow = (static_cast<uint64_t>(group) * tk + j) * d;
            if (j >= static_cast<uint32_t>(lengthsGm.GetValue(group))) {
                StoreNegZeroRow(dvGm[keyRow]);
                StoreNegZeroRow(dkGm[keyRow]);
                continue;
            }
            // Query i counts for key j from i0 = j - (tk - tq) on (causal; tq <= tk), from 0 otherwise.
            const uint32_t first = causal && j > tk - tq ? j - (tk - tq) : 0;
            Sweep(group, keyRow, geo, first, false);
            Sweep(group, keyRow, geo, first, true);
        }
    }

private:
    // dv_j (keyGrad false: weights p, rows g) or dk_j (keyGrad true: weights ds, rows q), over the queries
    // from `first` on.
    __aicore__ inline void Sweep(uint32_t group, uint64_t keyRow, const RowGeometry& geo, uint32_t first,
                                 bool keyGrad)
    {
        const uint64_t queryRows = static_cast<uint64_t>(group) * tq * d;
        const AscendC::GlobalTensor<float> rows = keyGrad ? qGm[queryRows] : gGm[queryRows];
        LocalTensor<float> partials = partialBuf.Get<float>();
        const uint32_t block = SumColumns(geo);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            SegmentWeights(group, keyRow, geo, g, first, keyGrad);
            VectorToScalarSync();   // the weighted sums read the weights as scalars
            for (uint32_t e0 = 0; e0 < d; e0 += block) {
                const uint32_t cols = d - e0 < block ? d - e0 : block;
                SegmentWeightedSums(rows[e0], geo, g, first, cols, partials[g * dPad + e0]);
            }
            ScalarToVectorSync();   // the next segment's (or sweep's) vector writes to the cache
        }
        StoreFoldedRows(geo.segments, (keyGrad ? dkGm : dvGm)[keyRow]);
    }

    // cache[c * LANES ...] = p_ij (or ds_ij) for the chunks of segment g that hold a query from `first` on.
    __aicore__ inline void SegmentWeights(uint32_t group, uint64_t keyRow, const RowGeometry& geo, uint32_t g,
                                          uint32_t first, bool keyGrad)
    {
        const uint64_t queryStats = static_cast<uint64_t>(group) * tq;
        const uint64_t transposed = static_cast<uint64_t>(group) * d * tq;
        LocalTensor<float> cache = cacheBuf.Get<float>();
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> t = tBuf.Get<float>();
        LocalTensor<float> dp = dpBuf.Get<float>();
        for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
            const uint64_t i0 = geo.ChunkStart(g, c);
            const uint32_t len = geo.ChunkLength(g, c);
            if (i0 + len <= first) {
                continue;
            }
            LocalTensor<float> w = cache[c * LANES];
            ChunkDots([&](uint32_t x) { return kGm.GetValue(keyRow + x); }, qTGm[transposed + i0], tq, len, w);
            AscendC::Muls(w, w, scale, geo.lanes);
            LoadStats(0, queryStats + i0, len);
            LoadStats(1, queryStats + i0, len);
            LocalTensor<float> shift = statQueue.DeQue<float>();
            LocalTensor<float> recip = statQueue.DeQue<float>();
            AscendC::Sub(t, w, shift, geo.lanes);
            CanonicalExp(e, t, workBuf.Get<float>(), bitsBuf.Get<uint8_t>(), geo.lanes);
            AscendC::Mul(w, e, recip, geo.lanes);
            statQueue.FreeTensor(shift);
            statQueue.FreeTensor(recip);
            if (keyGrad) {
                ChunkDots([&](uint32_t x) { return vGm.GetValue(keyRow + x); }, gTGm[transposed + i0], tq, len, dp);
                LoadStats(2, queryStats + i0, len);
                LocalTensor<float> gradSum = statQueue.DeQue<float>();
                AscendC::Sub(t, dp, gradSum, geo.lanes);
                AscendC::Mul(t, w, t, geo.lanes);
                AscendC::Muls(w, t, scale, geo.lanes);
                statQueue.FreeTensor(gradSum);
            }
        }
    }

    // stats[s, offset .. offset + len) into the stat queue (s: 0 shift, 1 recip, 2 G).
    __aicore__ inline void LoadStats(uint32_t s, uint64_t offset, uint32_t len)
    {
        LocalTensor<float> tile = statQueue.AllocTensor<float>();
        LoadChunk(tile, statsGm[static_cast<uint64_t>(s) * queries + offset], len);
        statQueue.EnQue(tile);
    }

    __aicore__ inline void StoreNegZeroRow(const AscendC::GlobalTensor<float>& dst)
    {
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        AscendC::Duplicate(out, NegZero(), dPad);
        StoreRow(out, dst);
    }

    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> statQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dpBuf;
    AscendC::GlobalTensor<float> qGm;
    AscendC::GlobalTensor<float> qTGm;
    AscendC::GlobalTensor<float> kGm;
    AscendC::GlobalTensor<float> vGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<float> gTGm;
    AscendC::GlobalTensor<int64_t> lengthsGm;
    AscendC::GlobalTensor<float> statsGm;
    AscendC::GlobalTensor<float> dkGm;
    AscendC::GlobalTensor<float> dvGm;
    Range share;
    uint32_t tq = 0;
    uint32_t tk = 0;
    uint32_t queries = 0;
    bool causal = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_attention(GM_ADDR q, GM_ADDR kT, GM_ADDR v, GM_ADDR kvLengths,
                                                          GM_ADDR out, uint32_t groups, uint32_t tq, uint32_t tk,
                                                          uint32_t d, uint32_t causal, float scale)
{
    bitparity::KernelAttention<bitparity::AttentionOp::FORWARD> op;
    op.Init(q, kT, v, nullptr, nullptr, kvLengths, out, nullptr, groups, tq, tk, d, causal, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_attention_query_grad(GM_ADDR q, GM_ADDR kT, GM_ADDR k, GM_ADDR vT,
                                                                     GM_ADDR g, GM_ADDR kvLengths, GM_ADDR dq,
                                                                     GM_ADDR stats, uint32_t groups, uint32_t tq,
                                                                     uint32_t tk, uint32_t d, uint32_t causal,
                                                                     float scale)
{
    bitparity::KernelAttention<bitparity::AttentionOp::QUERY_GRAD> op;
    op.Init(q, kT, k, vT, g, kvLengths, dq, stats, groups, tq, tk, d, causal, scale);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_attention_backward(GM_ADDR q, GM_ADDR qT, GM_ADDR k, GM_ADDR v,
                                                                   GM_ADDR g, GM_ADDR gT, GM_ADDR kvLengths,
                                                                   GM_ADDR stats, GM_ADDR dk, GM_ADDR dv,
                                                                   uint32_t groups, uint32_t tq, uint32_t tk,
                                                                   uint32_t d, uint32_t causal, float scale)
{
    bitparity::KernelAttentionKeyGrad op;
    op.Init(q, qT, k, v, g, gT, kvLengths, stats, dk, dv, groups, tq, tk, d, causal, scale);
    op.Process();
}
