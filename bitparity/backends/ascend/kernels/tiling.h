// How rows are cut into segments and chunks, spread over AI cores, and moved
// between Global Memory and the Unified Buffer.  Shared by reduce.cpp and softmax.cpp.
//
// Distribution: the rows are split into GetBlockNum() contiguous ranges, one
// per AI core.  A row is computed entirely by one core, segment by segment and
// chunk by chunk in the spec's order, so no bit depends on how many cores run
// or which core takes which row.
//
// Tiling (spec 3): a row of n floats is G segments of up to SEGMENT = 16384
// floats; a segment is chunks of LANES = 1024 floats; lane j of a segment's
// accumulator adds its chunks' element j in chunk order.  A chunk is one tile
// in UB: one DataCopy of 4 KB (DataCopyPad for a ragged tail).  A row of
// n <= 1024 is one chunk of W = next_pow2(n) lanes in the spec; here its tile
// is computed over lanes = max(W, 128) so that every vector count is a whole
// number of Compare repeats (128 halves, for the mask), but its halving tree
// runs over the spec's W lanes only (treeWidth).  A row of n > SEGMENT floats
// has 16 chunks in every segment: the padding chunks of its last segment hold
// no data and contribute exact identities (-0.0 to sums, -inf to maxima, -0.0
// to both halves of the softmax exponent split), so every op skips them.

#ifndef BITPARITY_TILING_H
#define BITPARITY_TILING_H

#include "canonical.h"
#include "row_limits.h"

namespace bitparity {

constexpr uint32_t MIN_TILE_LANES = 128;     // 256 bytes of half: one Compares repeat for the mask
constexpr uint32_t CHUNKS_PER_SEGMENT = SEGMENT / LANES;
constexpr uint32_t RESULTS_PER_FLUSH = 1024; // per-row results are written to GM in runs of this many
constexpr uint32_t BUFFER_NUM = 2;           // double buffering: MTE2/MTE3 overlap the vector pipe

__aicore__ inline uint32_t NextPow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n) {
        p *= 2;
    }
    return p;
}

__aicore__ inline uint32_t RoundUp(uint32_t n, uint32_t to) { return (n + to - 1) / to * to; }

struct RowGeometry {
    uint32_t n;          // row length
    uint32_t treeWidth;  // the spec's lane count W: next_pow2(n) for n <= LANES, else LANES
    uint32_t lanes;      // tile width in UB: max(W, MIN_TILE_LANES)
    uint32_t segments;   // G
    uint32_t chunks;     // the spec's chunks per segment C: ceil(n / LANES) for one segment, else 16

    __aicore__ inline uint64_t ChunkStart(uint32_t g, uint32_t c) const
    {
        return static_cast<uint64_t>(g) * SEGMENT + static_cast<uint64_t>(c) * LANES;
    }
    // Elements of chunk (g, c) that lie in the row: 0 for the padding chunks of a short last segment.
    __aicore__ inline uint32_t ChunkLength(uint32_t g, uint32_t c) const
    {
        uint64_t start = ChunkStart(g, c);
        if (start >= n) {
            return 0;
        }
        uint64_t left = n - start;
        return left < lanes ? static_cast<uint32_t>(left) : lanes;
    }
    // Chunks of segment g that hold row elements.
    __aicore__ inline uint32_t DataChunks(uint32_t g) const
    {
        uint64_t left = n - static_cast<uint64_t>(g) * SEGMENT;
        uint64_t c = (left + LANES - 1) / LANES;
        return c < chunks ? static_cast<uint32_t>(c) : chunks;
    }
    // Lanes holding per-segment partials: a power of two >= G, and >= 64 for the vector pieces.
    __aicore__ inline uint32_t PartialLanes() const
    {
        uint32_t p = NextPow2(segments);
        return p < FLOATS_PER_REPEAT ? FLOATS_PER_REPEAT : p;
    }
};

__aicore__ inline RowGeometry MakeRowGeometry(uint32_t n)
{
    RowGeometry g;
    g.n = n;
    g.treeWidth = n <= LANES ? NextPow2(n) : LANES;
    g.lanes = g.treeWidth < MIN_TILE_LANES ? MIN_TILE_LANES : g.treeWidth;
    g.segments = n <= SEGMENT ? 1 : (n + SEGMENT - 1) / SEGMENT;
    g.chunks = n <= SEGMENT ? (n + LANES - 1) / LANES : CHUNKS_PER_SEGMENT;
    return g;
}

struct Range {
    uint32_t begin;
    uint32_t end;
};

// This core's contiguous share of items 0 .. items-1 (rows, or tiles of a 1-D op).
__aicore__ inline Range ThisCoresShare(uint32_t items)
{
    uint32_t cores = static_cast<uint32_t>(AscendC::GetBlockNum());
    uint32_t core = static_cast<uint32_t>(AscendC::GetBlockIdx());
    uint32_t per = (items + cores - 1) / cores;
    uint64_t begin = static_cast<uint64_t>(core) * per;
    uint64_t end = begin + per;
    begin = begin < items ? begin : items;
    end = end < items ? end : items;
    return Range{static_cast<uint32_t>(begin), static_cast<uint32_t>(end)};
}

// GM -> UB of len elements.  DataCopy moves whole 32-byte blocks; a ragged length
// goes through DataCopyPad.  Lanes past len hold whatever the copy left there:
// the kernels overwrite them (SelectValidLanes) before any reduction reads them.
template <typename T>
__aicore__ inline void LoadChunk(const LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src, uint32_t len)
{
    if ((len * sizeof(T)) % 32 == 0) {
        AscendC::DataCopy(dst, src, len);
    } else {
        AscendC::DataCopyExtParams copy{1, static_cast<uint32_t>(len * sizeof(T)), 0, 0, 0};
        AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(dst, src, copy, pad);
    }
}

// CopyIn of one chunk of a row and, when the op has a mask, the same chunk of the mask:
// the stage the reduction, softmax and masked kernels share.
template <typename Queue>
__aicore__ inline void EnqueueRowChunk(Queue& xQueue, Queue& maskQueue, const AscendC::GlobalTensor<float>& x,
                                       const AscendC::GlobalTensor<uint8_t>& mask, bool hasMask, uint64_t offset,
                                       uint32_t len)
{
    LocalTensor<float> xLocal = xQueue.template AllocTensor<float>();
    LoadChunk(xLocal, x[offset], len);
    xQueue.EnQue(xLocal);
    if (hasMask) {
        LocalTensor<uint8_t> m = maskQueue.template AllocTensor<uint8_t>();
        LoadChunk(m, mask[offset], len);      // the mask is indexed only when there is one
        maskQueue.EnQue(m);
    }
}

// UB -> GM of exactly len elements.
template <typename T>
__aicore__ inline void StoreChunk(const AscendC::GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t len)
{
    if ((len * sizeof(T)) % 32 == 0) {
        AscendC::DataCopy(dst, src, len);
    } else {
        AscendC::DataCopyExtParams copy{1, static_cast<uint32_t>(len * sizeof(T)), 0, 0, 0};
        AscendC::DataCopyPad(dst, src, copy);
    }
}

// 0.0, 1.0, ..., LANES - 1 as floats: the lane indices SelectValidLanes compares with.
// Written once by the scalar unit; the caller syncs (ScalarToVectorSync) before use.
__aicore__ inline void FillLaneIndex(const LocalTensor<float>& laneIndex)
{
    for (uint32_t i = 0; i < LANES; ++i) {
        laneIndex.SetValue(i, static_cast<float>(i));
    }
}

// dst[i] = i < len ? src[i] : fill for i < lanes: the spec's padding of a row's last chunk
// (or of the per-segment partials).  dst may be src.
__aicore__ inline void SelectValidLanes(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                        const LocalTensor<float>& laneIndex, const LocalTensor<uint8_t>& bits,
                                        uint32_t len, uint32_t lanes, float fill)
{
    AscendC::Compares(bits, laneIndex, static_cast<float>(len), AscendC::CMPMODE::LT, lanes);
    AscendC::Select(dst, bits, src, fill, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
}

// dst[i] = mask[i] ? src[i] : fill (mask bytes are torch bools, 0 or 1).  A2 has no
// uint8 Compare, so the bytes are cast exactly to half and compared with 0.  dst may be src.
__aicore__ inline void SelectUnmasked(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                      const LocalTensor<uint8_t>& mask, const LocalTensor<half>& maskHalf,
                                      const LocalTensor<uint8_t>& bits, uint32_t lanes, float fill)
{
    AscendC::Cast(maskHalf, mask, AscendC::RoundMode::CAST_NONE, lanes);
    AscendC::Compares(bits, maskHalf, static_cast<half>(0), AscendC::CMPMODE::NE, lanes);
    AscendC::Select(dst, bits, src, fill, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
}

// count[i] += (mask[i] ? 1.0 : -0.0) for i < len, -0.0 for the lanes past len: one chunk of a
// mask's count (ones: lanes floats of 1.0; term: scratch).  Every partial count is an integer of at
// most 2^24 (MAX_ROW), so each addition is exact and the count is the same in any order.
__aicore__ inline void AccumulateCount(const LocalTensor<float>& count, const LocalTensor<uint8_t>& mask,
                                       const LocalTensor<half>& maskHalf, const LocalTensor<float>& ones,
                                       const LocalTensor<float>& term, const LocalTensor<float>& laneIndex,
                                       const LocalTensor<uint8_t>& bits, uint32_t len, uint32_t lanes)
{
    SelectUnmasked(term, ones, mask, maskHalf, bits, lanes, NegZero());
    if (len < lanes) {
        SelectValidLanes(term, term, laneIndex, bits, len, lanes, NegZero());
    }
    AscendC::Add(count, count, term, lanes);
}

// Per-row results (one value per row: float, or the int64 tokens of sampling.cpp)
// collected by the scalar unit in a VECOUT TBuf and written to GM in runs of
// RESULTS_PER_FLUSH with DataCopyPad.
template <typename T>
class RowResultsOf {
public:
    __aicore__ inline void Init(AscendC::TPipe* pipe, GM_ADDR out, uint32_t rows)
    {
        outGm.SetGlobalBuffer((__gm__ T*)out, rows);
        pipe->InitBuffer(buf, RESULTS_PER_FLUSH * sizeof(T));
    }

    __aicore__ inline void Put(uint32_t row, T value)
    {
        if (count == 0) {
            first = row;
        }
        buf.Get<T>().SetValue(count, value);
        if (++count == RESULTS_PER_FLUSH) {
            Flush();
        }
    }

    __aicore__ inline void Flush()
    {
        if (count == 0) {
            return;
        }
        ScalarToMte3Sync();
        StoreChunk(outGm[first], buf.Get<T>(), count);
        Mte3ToScalarSync();
        count = 0;
    }

private:
    AscendC::GlobalTensor<T> outGm;
    AscendC::TBuf<AscendC::TPosition::VECOUT> buf;
    uint32_t first = 0;
    uint32_t count = 0;
};

using RowResults = RowResultsOf<float>;

}  // namespace bitparity

#endif  // BITPARITY_TILING_H
