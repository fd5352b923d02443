// topk (spec 21) as an Ascend C kernel for Atlas A2.
//
//   x: f32[rows, cols] (GM); values: f32[rows, k], indices: int64[rows, k]; 1 <= k <= cols.
//
// The result is the first k elements of spec 21's order (value descending, -0.0 ==
// +0.0, NaN lowest; equal values by index ascending).  No arithmetic touches a
// value, so any algorithm that respects the order gives these bits; this one is
// made of exact counts and re-reads the row from GM on every pass, so a row of
// any length needs the same UB.  Per row, in output blocks of up to TOPK_BLOCK
// positions [s, e):
//   1. The top-e threshold (selection.h keys): the largest key K with
//      count(key(x) >= K) >= e, by bisection over keys (about 32 passes, each
//      one IEEE Compares and a count per chunk); then need = e - count(key(x) > K).
//      The top-e set is {key > K} and the first `need` elements, by index, with key K.
//      The top-s threshold is the previous block's top-e one (none when s = 0).
//   2. One collecting pass: the vector unit marks candidates (K_e <= key <= K_s),
//      and the scalar unit walks them in index order, counting the ties at each
//      threshold, and keeps the elements in the top-e set but not in the top-s set,
//      exactly e - s of them, in index order.
//   3. Ranks within the block, on the vector unit: for a non-NaN kept value v_i,
//      its position is #{j: v_j > v_i} + #{j < i: v_j == v_i} (counts of Compares
//      against the kept values, NaN-padded, which compare false); NaN values follow
//      every non-NaN value, in index order.  The scalar unit places value and index
//      at that position in two VECOUT buffers, copied out by DataCopyPad.
//
// UB budget (bytes): x 2 x 4096 (VECIN), acc, term, ones, zeros, candidates and
// laneIndex 6 x 4096, bits 128, kept values 4096 and indices 8192, output values
// 4096 and indices 8192 (VECOUT): 57,472 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "selection.h"
#include "tiling.h"

namespace bitparity {

constexpr uint32_t TOPK_BLOCK = 1024;   // output positions ranked together

// The top-m set of a row: every element with key > key, and the first `need` (by index) with key == key.
struct TopThreshold {
    int32_t key;
    uint32_t need;
};

class KernelTopk {
public:
    __aicore__ inline KernelTopk() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR values, GM_ADDR indices, uint32_t rows, uint32_t cols, uint32_t k)
    {
        this->cols = cols;
        this->k = k;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        xGm.SetGlobalBuffer((__gm__ float*)x, static_cast<uint64_t>(rows) * cols);
        valuesGm.SetGlobalBuffer((__gm__ float*)values, static_cast<uint64_t>(rows) * k);
        indicesGm.SetGlobalBuffer((__gm__ int64_t*)indices, static_cast<uint64_t>(rows) * k);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(onesBuf, LANES * sizeof(float));
        pipe.InitBuffer(zerosBuf, LANES * sizeof(float));
        pipe.InitBuffer(candidateBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(keptValueBuf, TOPK_BLOCK * sizeof(float));
        pipe.InitBuffer(keptIndexBuf, TOPK_BLOCK * sizeof(int64_t));
        pipe.InitBuffer(outValueBuf, TOPK_BLOCK * sizeof(float));
        pipe.InitBuffer(outIndexBuf, TOPK_BLOCK * sizeof(int64_t));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
        AscendC::Duplicate(onesBuf.Get<float>(), 1.0f, LANES);
        AscendC::Duplicate(zerosBuf.Get<float>(), 0.0f, LANES);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            TopThreshold upper{KEY_NAN, 0};
            for (uint32_t s = 0; s < k; s += TOPK_BLOCK) {
                uint32_t e = k - s < TOPK_BLOCK ? k : s + TOPK_BLOCK;
                TopThreshold lower = FindThreshold(rowStart, e);
                uint32_t nonNaN = Collect(rowStart, s > 0, upper, lower);
                RankAndPlace(e - s, nonNaN);
                CopyOut(static_cast<uint64_t>(row) * k + s, e - s);
                upper = lower;
            }
        }
    }

private:
    // ---- Stages of one chunk ------------------------------------------------

    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> x = xQueue.AllocTensor<float>();
        LoadChunk(x, xGm[offset], len);
        xQueue.EnQue(x);
    }

    // The chunk, with lanes >= len NaN: they compare false and are never counted.
    __aicore__ inline LocalTensor<float> ComputeChunk(uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        if (len < geo.lanes) {
            SelectValidLanes(x, x, laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes, QuietNaN());
        }
        return x;
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t count)
    {
        ScalarToMte3Sync();
        StoreChunk(valuesGm[offset], outValueBuf.Get<float>(), count);
        StoreChunk(indicesGm[offset], outIndexBuf.Get<int64_t>(), count);
        Mte3ToScalarSync();
    }

    // ---- Passes ---------------------------------------------------------------------

    // How many elements of the row have key >= key(v), v not NaN.
    __aicore__ inline uint32_t CountAtLeast(uint64_t rowStart, float v)
    {
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Duplicate(acc, NegZero(), geo.lanes);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                LocalTensor<float> x = ComputeChunk(len);
                AscendC::Compares(bits, x, v, AscendC::CMPMODE::GE, geo.lanes);
                AddCount(acc, bits, onesBuf.Get<float>(), termBuf.Get<float>(), geo.lanes);
                xQueue.FreeTensor(x);
            }
        }
        float count = TreeSum(acc, geo.lanes);
        ScalarToVectorSync();
        return static_cast<uint32_t>(count);
    }

    // The top-m threshold by bisection: lo always has count(key >= lo) >= m (KEY_NAN: every
    // element), hi never (one past key(+inf): none), and hi's count is count(key > lo) at the end.
    __aicore__ inline TopThreshold FindThreshold(uint64_t rowStart, uint32_t m)
    {
        int32_t lo = KEY_NAN;
        int32_t hi = KEY_POS_INF + 1;
        uint32_t countHi = 0;
        while (KeysApart(lo, hi)) {
            int32_t mid = MidKey(lo, hi);
            uint32_t count = CountAtLeast(rowStart, KeyValue(mid));
            if (count >= m) {
                lo = mid;
            } else {
                hi = mid;
                countHi = count;
            }
        }
        return TopThreshold{lo, m - countHi};
    }

    // Whether an element with this key is in a top set; ties counts, in index order, the
    // elements met so far with the threshold's key.
    __aicore__ inline bool InTop(int32_t key, const TopThreshold& t, uint32_t& ties)
    {
        if (key != t.key) {
            return key > t.key;
        }
        return ties++ < t.need;
    }

    // Keeps, in index order, the elements in the top-e set (lower) but not in the top-s set
    // (upper, when hasUpper).  Returns how many of them are not NaN.
    __aicore__ inline uint32_t Collect(uint64_t rowStart, bool hasUpper, const TopThreshold& upper,
                                       const TopThreshold& lower)
    {
        LocalTensor<float> candidate = candidateBuf.Get<float>();
        LocalTensor<float> keptValue = keptValueBuf.Get<float>();
        LocalTensor<int64_t> keptIndex = keptIndexBuf.Get<int64_t>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        uint32_t tiesLower = 0;
        uint32_t tiesUpper = 0;
        uint32_t kept = 0;
        uint32_t nonNaN = 0;
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                uint64_t start = geo.ChunkStart(g, c);
                CopyIn(rowStart + start, len);
                LocalTensor<float> x = ComputeChunk(len);
                // Candidates: key >= K_e (every element when K_e is NaN's), and key <= K_s.
                AscendC::Duplicate(candidate, 1.0f, geo.lanes);
                if (lower.key != KEY_NAN) {
                    AscendC::Compares(bits, x, KeyValue(lower.key), AscendC::CMPMODE::GE, geo.lanes);
                    AscendC::Select(candidate, bits, candidate, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE,
                                    geo.lanes);
                }
                if (hasUpper) {
                    if (upper.key != KEY_NAN) {
                        AscendC::Compares(bits, x, KeyValue(upper.key), AscendC::CMPMODE::GT, geo.lanes);
                    } else {
                        AscendC::Compare(bits, x, x, AscendC::CMPMODE::EQ, geo.lanes);   // not NaN: above K_s
                    }
                    AscendC::Select(candidate, bits, zerosBuf.Get<float>(), candidate,
                                    AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, geo.lanes);
                }
                AscendC::Compares(bits, candidate, 0.0f, AscendC::CMPMODE::NE, geo.lanes);
                VectorToScalarSync();
                for (uint32_t byte = 0; byte * 8 < len; ++byte) {
                    uint8_t mark = bits.GetValue(byte);
                    for (uint32_t i = byte * 8; mark != 0 && i < len; ++i, mark >>= 1) {
                        if ((mark & 1u) == 0) {
                            continue;
                        }
                        float v = x.GetValue(i);
                        int32_t key = OrderKey(v);
                        bool inLower = InTop(key, lower, tiesLower);
                        bool inUpper = hasUpper && InTop(key, upper, tiesUpper);
                        if (inLower && !inUpper) {
                            keptValue.SetValue(kept, v);
                            keptIndex.SetValue(kept, static_cast<int64_t>(start + i));
                            ++kept;
                            nonNaN += v == v ? 1 : 0;
                        }
                    }
                }
                ScalarToVectorSync();
                xQueue.FreeTensor(x);
            }
        }
        return nonNaN;
    }

    // Places the block's count kept elements at their positions in the output buffers.
    __aicore__ inline void RankAndPlace(uint32_t count, uint32_t nonNaN)
    {
        LocalTensor<float> keptValue = keptValueBuf.Get<float>();
        LocalTensor<int64_t> keptIndex = keptIndexBuf.Get<int64_t>();
        LocalTensor<float> outValue = outValueBuf.Get<float>();
        LocalTensor<int64_t> outIndex = outIndexBuf.Get<int64_t>();
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<float> ones = onesBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        const uint32_t width = NextPow2(count < FLOATS_PER_REPEAT ? FLOATS_PER_REPEAT : count);
        for (uint32_t i = count; i < width; ++i) {
            keptValue.SetValue(i, QuietNaN());   // compares false: never counted
        }
        uint32_t nanSeen = 0;
        for (uint32_t i = 0; i < count; ++i) {
            float v = keptValue.GetValue(i);
            uint32_t position;
            if (v != v) {
                position = nonNaN + nanSeen++;
            } else {
                ScalarToVectorSync();
                AscendC::Compares(bits, keptValue, v, AscendC::CMPMODE::GT, width);
                AscendC::Select(acc, bits, ones, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, width);
                AscendC::Compares(bits, keptValue, v, AscendC::CMPMODE::EQ, width);
                AscendC::Select(term, bits, ones, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, width);
                AscendC::Compares(bits, laneIndexBuf.Get<float>(), static_cast<float>(i), AscendC::CMPMODE::LT,
                                  width);
                AscendC::Select(term, bits, term, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, width);
                AscendC::Add(acc, acc, term, width);
                position = static_cast<uint32_t>(TreeSum(acc, width));
            }
            outValue.SetValue(position, v);
            outIndex.SetValue(position, keptIndex.GetValue(i));
        }
        ScalarToVectorSync();
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> onesBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> zerosBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> candidateBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> keptValueBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> keptIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECOUT> outValueBuf;
    AscendC::TBuf<AscendC::TPosition::VECOUT> outIndexBuf;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> valuesGm;
    AscendC::GlobalTensor<int64_t> indicesGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    uint32_t k = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_topk(GM_ADDR x, GM_ADDR values, GM_ADDR indices, uint32_t rows,
                                                     uint32_t cols, uint32_t k)
{
    bitparity::KernelTopk op;
    op.Init(x, values, indices, rows, cols, k);
    op.Process();
}
