// Counter-based noise, filtering and sampling (spec 19-22) as Ascend C kernels for Atlas A2:
// philox, filter_logits and sample.
//
//   philox: counters u32[n, 4], keys u32[n, 2] (GM) -> u32[n, 4].
//   filter_logits: x f32[rows, cols]; per row scale f32 (> 0), top_k int64 (0: off),
//     top_p f32 (1: off), min_p f32 (0: off) -> f32[rows, cols].
//   sample: the same, plus per row greedy bool, seed int64, position int64 -> int64 tokens[rows].
//
// Philox4x32-10 runs on the SCALAR unit: the A2 vector unit has no 32 x 32 -> 64-bit
// multiply, and the scalar unit's 64-bit integer multiply gives hi(a * b) and lo(a * b)
// exactly.  Each pair of tokens costs one Philox call (about 100 scalar operations), so
// for long rows the scalar unit, not the vector unit, bounds the speed of sample; a
// vector version would build the product from 16-bit halves.  The scalar unit passes
// the top 24 and 23 bits of each token's words (a >>> 8, b >>> 9, both < 2^24) to the
// vector unit, which makes the exponential variate and its log (spec 20) with the
// canonical log of canonical.h.
//
// filter_logits, per row, in the spec's order (w = x * scale, the padding lanes of
// the last chunk -inf).  Every pass re-reads the row from GM, chunk by chunk, and
// recomputes what it needs (w, e = exp(w - shift), the kept values), so a row of
// any length runs in the same UB:
//   1. M = NaN-propagating max of w (+0.0).  A NaN or +inf in w makes M NaN or +inf:
//      the output row is NaN (the token -1).  shift = (M == -inf ? 0 : M).
//   2. Kept values kv: w; -inf where e < min_p (min-p on); -inf where kv < tau
//      (top-k, once tau is known); -inf where kv < floor (top-p, once known).
//      tau and floor start at -inf, where they keep everything.
//   3. top-k (0 < k < cols): tau = the largest value (by selection.h keys) with
//      count(kv >= tau) >= k, by bisection between key(-inf) (count cols) and one
//      key past M (count 0): about 32 counting passes.  This is the k-th largest
//      kept value, counting repeats, as the spec defines it.
//   4. top-p (top_p < 1): Z = A(-inf), thr = top_p * Z, with A(v) the canonical sum
//      (spec 3: 1024 lanes per 16384-element segment, halving trees) of
//      select(kv > v, e, -0.0); floor = the smallest value with A(floor) < thr, by
//      bisection between key(-inf) (A = Z, not < thr) and key(M) (A = -0.0 < thr).
//      A is non-increasing in v (spec 21), so this is the spec's v*.
//   5. The output pass: kv, or NaN for a row with no distribution.
// sample: a greedy row skips 2-4 (w = x, its scale being 1.0); any other row runs
// them, then score = (kv - shift) - log(E) with E the exponential variate of spec 20; the token
// is the lowest index of the maximum score: lane-wise, chunk by chunk, a strictly
// greater score replaces the lane's best (so a lane keeps its lowest index), then the
// maximum over lanes and the lowest index among the lanes holding it.  -1 when the
// row has no distribution or every score is -inf.
//
// UB budget (bytes): x 2 x 4096 (VECIN), out 2 x 4096 (VECOUT, filter_logits), kv,
// e, d, term, acc and ones 6 x 4096, exp/log work 16384, laneIndex 4096, bits and coarse
// bits 2 x 128, partials 4096; sample also: noise 4 x 4096, best, best index and
// chunk index 3 x 4096, tokens 8192 (VECOUT): at most 103,680 B (sample) of the
// 188,416 B (184 KB) InitBuffer may use.  philox: counters 2 x 4096, keys 2 x 2048
// (VECIN), out 2 x 4096 (VECOUT): 20,480 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "selection.h"
#include "tiling.h"

namespace bitparity {


// Philox4x32-10 (spec 19) on the scalar unit: counter c (four words) under key (k0, k1), in place.
__aicore__ inline void Philox4x32(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (uint32_t round = 0; round < PHILOX_ROUNDS; ++round) {
        uint64_t p0 = static_cast<uint64_t>(PHILOX_M0) * c[0];
        uint64_t p1 = static_cast<uint64_t>(PHILOX_M1) * c[2];
        uint32_t next0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
        uint32_t next2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
        c[1] = static_cast<uint32_t>(p1);
        c[3] = static_cast<uint32_t>(p0);
        c[0] = next0;
        c[2] = next2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

// ---- philox: the contract's Philox4x32-10 over counter/key pairs -------------------

class KernelPhilox {
public:
    __aicore__ inline KernelPhilox() {}

    __aicore__ inline void Init(GM_ADDR counters, GM_ADDR keys, GM_ADDR out, uint32_t n)
    {
        this->n = n;
        share = ThisCoresShare((n + PHILOX_TILE - 1) / PHILOX_TILE);
        countersGm.SetGlobalBuffer((__gm__ uint32_t*)counters, static_cast<uint64_t>(n) * 4);
        keysGm.SetGlobalBuffer((__gm__ uint32_t*)keys, static_cast<uint64_t>(n) * 2);
        outGm.SetGlobalBuffer((__gm__ uint32_t*)out, static_cast<uint64_t>(n) * 4);
        pipe.InitBuffer(counterQueue, BUFFER_NUM, PHILOX_TILE * 4 * sizeof(uint32_t));
        pipe.InitBuffer(keyQueue, BUFFER_NUM, PHILOX_TILE * 2 * sizeof(uint32_t));
        pipe.InitBuffer(outQueue, BUFFER_NUM, PHILOX_TILE * 4 * sizeof(uint32_t));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t tile = share.begin; tile < share.end; ++tile) {
            uint32_t first = tile * PHILOX_TILE;
            uint32_t count = n - first < PHILOX_TILE ? n - first : PHILOX_TILE;
            CopyIn(first, count);
            Compute(count);
            CopyOut(first, count);
        }
    }

private:
    __aicore__ inline void CopyIn(uint32_t first, uint32_t count)
    {
        LocalTensor<uint32_t> c = counterQueue.AllocTensor<uint32_t>();
        LoadChunk(c, countersGm[static_cast<uint64_t>(first) * 4], count * 4);
        counterQueue.EnQue(c);
        LocalTensor<uint32_t> k = keyQueue.AllocTensor<uint32_t>();
        LoadChunk(k, keysGm[static_cast<uint64_t>(first) * 2], count * 2);
        keyQueue.EnQue(k);
    }

    __aicore__ inline void Compute(uint32_t count)
    {
        LocalTensor<uint32_t> c = counterQueue.DeQue<uint32_t>();
        LocalTensor<uint32_t> k = keyQueue.DeQue<uint32_t>();
        LocalTensor<uint32_t> out = outQueue.AllocTensor<uint32_t>();
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t words[4] = {c.GetValue(4 * i), c.GetValue(4 * i + 1), c.GetValue(4 * i + 2),
                                 c.GetValue(4 * i + 3)};
            Philox4x32(words, k.GetValue(2 * i), k.GetValue(2 * i + 1));
            for (uint32_t j = 0; j < 4; ++j) {
                out.SetValue(4 * i + j, words[j]);
            }
        }
        outQueue.EnQue(out);
        counterQueue.FreeTensor(c);
        keyQueue.FreeTensor(k);
    }

    __aicore__ inline void CopyOut(uint32_t first, uint32_t count)
    {
        LocalTensor<uint32_t> out = outQueue.DeQue<uint32_t>();
        ScalarToMte3Sync();
        StoreChunk(outGm[static_cast<uint64_t>(first) * 4], out, count * 4);
        outQueue.FreeTensor(out);
        Mte3ToScalarSync();
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> counterQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> keyQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::GlobalTensor<uint32_t> countersGm;
    AscendC::GlobalTensor<uint32_t> keysGm;
    AscendC::GlobalTensor<uint32_t> outGm;
    Range share;
    uint32_t n = 0;
};

// ---- filter_logits and sample ----------------------------------------------------------

enum class SamplingOp { FILTER_LOGITS, SAMPLE };

// One row's parameters and what the passes have found so far.
struct RowPlan {
    float scale;
    float minP;
    float topP;
    bool useMinP;
    bool useTopK;
    bool useTopP;
    uint32_t topK;
    float shift;
    float tau;      // the top-k threshold: -inf until found, or when top-k is off
    float floor;    // the top-p threshold: likewise
};

template <SamplingOp OP>
class KernelSampling {
    static constexpr bool SAMPLES = OP == SamplingOp::SAMPLE;

public:
    __aicore__ inline KernelSampling() {}

    // greedy, seeds and positions are read by SAMPLE only; out is f32[rows, cols] or int64[rows].
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP, GM_ADDR minP, GM_ADDR greedy,
                                GM_ADDR seeds, GM_ADDR positions, GM_ADDR out, uint32_t rows, uint32_t cols)
    {
        this->cols = cols;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        scaleGm.SetGlobalBuffer((__gm__ float*)scale, rows);
        topKGm.SetGlobalBuffer((__gm__ int64_t*)topK, rows);
        topPGm.SetGlobalBuffer((__gm__ float*)topP, rows);
        minPGm.SetGlobalBuffer((__gm__ float*)minP, rows);
        pipe.InitBuffer(xQueue, BUFFER_NUM, LANES * sizeof(float));
        if constexpr (SAMPLES) {
            greedyGm.SetGlobalBuffer((__gm__ uint8_t*)greedy, rows);
            seedsGm.SetGlobalBuffer((__gm__ int64_t*)seeds, rows);
            positionsGm.SetGlobalBuffer((__gm__ int64_t*)positions, rows);
            pipe.InitBuffer(noiseBuf, 4 * LANES * sizeof(float));
            pipe.InitBuffer(bestBuf, LANES * sizeof(float));
            pipe.InitBuffer(bestIndexBuf, LANES * sizeof(float));
            pipe.InitBuffer(indexBuf, LANES * sizeof(float));
            tokens.Init(&pipe, out, rows);
        } else {
            outGm.SetGlobalBuffer((__gm__ float*)out, elements);
            pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        }
        pipe.InitBuffer(kvBuf, LANES * sizeof(float));
        pipe.InitBuffer(eBuf, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(accBuf, LANES * sizeof(float));
        pipe.InitBuffer(onesBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(coarseBuf, LANES / 8);
        pipe.InitBuffer(partialBuf, MAX_SEGMENTS * sizeof(float));
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
        AscendC::Duplicate(onesBuf.Get<float>(), 1.0f, LANES);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            if constexpr (SAMPLES) {
                tokens.Put(row, SampleRow(row, rowStart));
            } else {
                FilterRow(row, rowStart);
            }
        }
        if constexpr (SAMPLES) {
            tokens.Flush();
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

    // kv = w = x * scale, lanes >= len -inf.
    __aicore__ inline void ComputeScaled(const LocalTensor<float>& kv, const RowPlan& plan, uint32_t len)
    {
        LocalTensor<float> x = xQueue.DeQue<float>();
        AscendC::Muls(kv, x, plan.scale, geo.lanes);
        xQueue.FreeTensor(x);
        if (len < geo.lanes) {
            SelectValidLanes(kv, kv, laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes, NegInf());
        }
    }

    // kv = the kept values of the chunk (step 2), and e = exp(w - shift) when withExp or min-p needs it.
    __aicore__ inline void ComputeKept(const LocalTensor<float>& kv, const RowPlan& plan, uint32_t len, bool withExp)
    {
        LocalTensor<float> e = eBuf.Get<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        const uint32_t lanes = geo.lanes;
        ComputeScaled(kv, plan, len);
        if (withExp || plan.useMinP) {
            AscendC::Adds(d, kv, -plan.shift, lanes);   // w + (-shift) == w - shift in IEEE
            CanonicalExp(e, d, workBuf.Get<float>(), bits, lanes);
        }
        if (plan.useMinP) {
            AscendC::Compares(bits, e, plan.minP, AscendC::CMPMODE::GE, lanes);
            AscendC::Select(kv, bits, kv, NegInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        }
        if (plan.tau != NegInf()) {
            AscendC::Compares(bits, kv, plan.tau, AscendC::CMPMODE::GE, lanes);
            AscendC::Select(kv, bits, kv, NegInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        }
        if (plan.floor != NegInf()) {
            AscendC::Compares(bits, kv, plan.floor, AscendC::CMPMODE::GE, lanes);
            AscendC::Select(kv, bits, kv, NegInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        }
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    // ---- Passes -----------------------------------------------------------------------

    // Step 1: the NaN-propagating maximum of w, plus 0.0.
    __aicore__ inline float RowMax(uint64_t rowStart, const RowPlan& plan)
    {
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> kv = kvBuf.Get<float>();
        AscendC::Duplicate(acc, NegInf(), geo.lanes);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeScaled(kv, plan, len);
                NanMax(acc, acc, kv, termBuf.Get<float>(), bitsBuf.Get<uint8_t>(), geo.lanes);
            }
        }
        float m = TreeMax(acc, geo.lanes, termBuf.Get<float>(), bitsBuf.Get<uint8_t>());
        ScalarToVectorSync();
        return m;
    }

    // Step 3's count: how many kept values are >= v.
    __aicore__ inline uint32_t CountKeptAtLeast(uint64_t rowStart, const RowPlan& plan, float v)
    {
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> kv = kvBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Duplicate(acc, NegZero(), geo.lanes);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeKept(kv, plan, len, false);
                AscendC::Compares(bits, kv, v, AscendC::CMPMODE::GE, geo.lanes);
                AddCount(acc, bits, onesBuf.Get<float>(), termBuf.Get<float>(), geo.lanes);
            }
        }
        float count = TreeSum(acc, geo.lanes);
        ScalarToVectorSync();
        return static_cast<uint32_t>(count);
    }

    // Step 4's mass A(v): the canonical sum of select(kv > v, e, -0.0) (spec 3).
    __aicore__ inline float MassAbove(uint64_t rowStart, const RowPlan& plan, float v)
    {
        LocalTensor<float> partials = partialBuf.Get<float>();
        LocalTensor<float> acc = accBuf.Get<float>();
        LocalTensor<float> kv = kvBuf.Get<float>();
        LocalTensor<float> term = termBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Duplicate(partials, NegZero(), geo.PartialLanes());
        for (uint32_t g = 0; g < geo.segments; ++g) {
            AscendC::Duplicate(acc, NegZero(), geo.lanes);
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + geo.ChunkStart(g, c), len);
                ComputeKept(kv, plan, len, true);
                AscendC::Compares(bits, kv, v, AscendC::CMPMODE::GT, geo.lanes);
                AscendC::Select(term, bits, eBuf.Get<float>(), NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE,
                                geo.lanes);
                AscendC::Add(acc, acc, term, geo.lanes);
            }
            partials.SetValue(g, TreeSum(acc, geo.treeWidth));
            ScalarToVectorSync();
        }
        float mass = TreeSum(partials, NextPow2(geo.segments));
        ScalarToVectorSync();
        return mass;
    }

    // Steps 1-4 for one row: its plan, with thresholds found.  bad: the row has no distribution.
    __aicore__ inline RowPlan Plan(uint32_t row, uint64_t rowStart, bool filters, bool& bad)
    {
        RowPlan plan;
        plan.scale = scaleGm.GetValue(row);
        plan.tau = NegInf();
        plan.floor = NegInf();
        plan.shift = 0.0f;
        plan.useMinP = false;
        float m = RowMax(rowStart, plan);
        bad = m != m || m == PosInf();
        if (bad || !filters) {
            return plan;
        }
        plan.shift = m == NegInf() ? 0.0f : m;
        int64_t topK = topKGm.GetValue(row);
        plan.minP = minPGm.GetValue(row);
        plan.topP = topPGm.GetValue(row);
        plan.useMinP = plan.minP > 0.0f;
        // An empty row (m = -inf) keeps nothing whatever the thresholds: they are not searched.
        plan.useTopK = m != NegInf() && topK > 0 && topK < static_cast<int64_t>(cols);
        plan.useTopP = m != NegInf() && plan.topP < 1.0f;
        plan.topK = static_cast<uint32_t>(plan.useTopK ? topK : 0);
        if (plan.useTopK) {
            int32_t lo = KEY_NEG_INF;        // count(kv >= -inf) = cols >= k
            int32_t hi = OrderKey(m) + 1;    // nothing is above m
            while (KeysApart(lo, hi)) {
                int32_t mid = MidKey(lo, hi);
                if (CountKeptAtLeast(rowStart, plan, KeyValue(mid)) >= plan.topK) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            plan.tau = KeyValue(lo);
        }
        if (plan.useTopP) {
            float thr = plan.topP * MassAbove(rowStart, plan, NegInf());
            int32_t lo = KEY_NEG_INF;        // A(-inf) = Z, never < top_p * Z
            int32_t hi = OrderKey(m);        // A(m) = -0.0 < thr
            while (KeysApart(lo, hi)) {
                int32_t mid = MidKey(lo, hi);
                if (MassAbove(rowStart, plan, KeyValue(mid)) < thr) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            plan.floor = KeyValue(hi);
        }
        return plan;
    }

    // ---- The ops' own output passes ------------------------------------------------------

    __aicore__ inline void FilterRow(uint32_t row, uint64_t rowStart)
    {
        bool bad;
        RowPlan plan = Plan(row, rowStart, true, bad);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint64_t offset = rowStart + geo.ChunkStart(g, c);
                uint32_t len = geo.ChunkLength(g, c);
                LocalTensor<float> out = outQueue.AllocTensor<float>();
                if (bad) {
                    AscendC::Duplicate(out, QuietNaN(), geo.lanes);
                } else {
                    CopyIn(offset, len);
                    ComputeKept(out, plan, len, false);
                }
                outQueue.EnQue(out);
                CopyOut(offset, len);
            }
        }
    }

    // noise = log(E) for the tokens start .. start + lanes - 1 (spec 19, 20); lanes past the
    // row get words 0, whose noise is finite and whose score is -inf anyway.
    __aicore__ inline void ComputeNoise(const LocalTensor<float>& noise, uint64_t start, uint32_t len,
                                        const uint32_t key[2], const uint32_t position[2])
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> noiseWork = noiseBuf.Get<float>();
        LocalTensor<float> v = noiseWork;                     // ha (int32), then V
        LocalTensor<float> big = noiseWork[lanes];            // hb (int32), then -log(1 - V)
        LocalTensor<float> coarse = noiseWork[2 * lanes];     // Vc, then 1 - V, then E
        LocalTensor<float> series = noiseWork[3 * lanes];     // V * THIRD + HALF, then (V * V) * that
        LocalTensor<float> small = noise;                     // the fine V, then V * V, then the series' sum
        LocalTensor<int32_t> ha = v.ReinterpretCast<int32_t>();
        LocalTensor<int32_t> hb = big.ReinterpretCast<int32_t>();
        LocalTensor<float> work = workBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        LocalTensor<uint8_t> isCoarse = coarseBuf.Get<uint8_t>();

        // Scalar unit: Philox words of token pairs (start is even), their top 24 and 23 bits.
        VectorToScalarSync();
        for (uint32_t i = 0; i < lanes; i += 2) {
            uint32_t words[4] = {0, 0, 0, 0};
            if (i < len) {
                uint64_t pair = (start + i) >> 1;
                words[0] = static_cast<uint32_t>(pair);
                words[1] = position[0];
                words[2] = position[1];
                words[3] = SAMPLE_STREAM;
                Philox4x32(words, key[0], key[1]);
            }
            ha.SetValue(i, static_cast<int32_t>(words[0] >> 8));
            hb.SetValue(i, static_cast<int32_t>(words[1] >> 9));
            ha.SetValue(i + 1, static_cast<int32_t>(words[2] >> 8));
            hb.SetValue(i + 1, static_cast<int32_t>(words[3] >> 9));
        }
        ScalarToVectorSync();
        // Vc = ha * 2^-24 (exact); coarse = ha >= 2^16, i.e. Vc >= 2^-8 (exact).
        AscendC::Cast(coarse, ha, AscendC::RoundMode::CAST_NONE, lanes);
        AscendC::Muls(coarse, coarse, FloatFromBits(TWO_M24_BITS), lanes);
        AscendC::Compares(isCoarse, coarse, static_cast<float>(UNIFORM_COARSE_MIN) * FloatFromBits(TWO_M24_BITS),
                          AscendC::CMPMODE::GE, lanes);
        // V = coarse ? Vc : Vc + (2 hb + 1) * 2^-48 (one rounding, in the add).
        AscendC::Add(hb, hb, hb, lanes);
        AscendC::Adds(hb, hb, static_cast<int32_t>(1), lanes);
        AscendC::Cast(small, hb, AscendC::RoundMode::CAST_NONE, lanes);
        AscendC::Muls(small, small, FloatFromBits(TWO_M48_BITS), lanes);
        AscendC::Add(small, coarse, small, lanes);
        AscendC::Select(v, isCoarse, coarse, small, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        // big = -log(1 - V): (-V) + 1 == 1 - V, exact on the coarse grid; the negations are sign flips.
        AscendC::Muls(coarse, v, -1.0f, lanes);
        AscendC::Adds(coarse, coarse, 1.0f, lanes);
        CanonicalLog(big, coarse, work, bits, lanes);
        AscendC::Muls(big, big, -1.0f, lanes);
        // small = V + (V * V) * (V * THIRD + HALF)
        AscendC::Muls(series, v, FloatFromBits(THIRD_BITS), lanes);
        AscendC::Adds(series, series, FloatFromBits(HALF_BITS), lanes);
        AscendC::Mul(small, v, v, lanes);
        AscendC::Mul(series, small, series, lanes);
        AscendC::Add(small, v, series, lanes);
        // E, then noise = log(E).
        AscendC::Select(coarse, isCoarse, big, small, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        CanonicalLog(noise, coarse, work, bits, lanes);
    }

    __aicore__ inline int64_t SampleRow(uint32_t row, uint64_t rowStart)
    {
        bool greedy = greedyGm.GetValue(row) != 0;
        bool bad;
        RowPlan plan = Plan(row, rowStart, !greedy, bad);
        if (bad) {
            return -1;
        }
        uint64_t seed = static_cast<uint64_t>(seedsGm.GetValue(row));
        uint64_t position = static_cast<uint64_t>(positionsGm.GetValue(row));
        const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
        const uint32_t pos[2] = {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32)};
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> kv = kvBuf.Get<float>();
        LocalTensor<float> noise = dBuf.Get<float>();
        LocalTensor<float> best = bestBuf.Get<float>();
        LocalTensor<float> bestIndex = bestIndexBuf.Get<float>();
        LocalTensor<float> index = indexBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        AscendC::Duplicate(best, NegInf(), lanes);
        AscendC::Duplicate(bestIndex, 0.0f, lanes);
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                uint64_t start = geo.ChunkStart(g, c);
                uint32_t len = geo.ChunkLength(g, c);
                CopyIn(rowStart + start, len);
                ComputeKept(kv, plan, len, false);
                if (!greedy) {
                    ComputeNoise(noise, start, len, key, pos);
                    AscendC::Adds(kv, kv, -plan.shift, lanes);  // f + (-shift) == f - shift in IEEE
                    AscendC::Sub(kv, kv, noise, lanes);         // score = (f - shift) - log(E)
                }
                // Token indices are below 2^24: exact as floats.
                AscendC::Adds(index, laneIndexBuf.Get<float>(), static_cast<float>(start), lanes);
                AscendC::Compare(bits, kv, best, AscendC::CMPMODE::GT, lanes);
                AscendC::Select(best, bits, kv, best, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
                AscendC::Select(bestIndex, bits, index, bestIndex, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
            }
        }
        // The maximum over lanes, then the lowest index among the lanes holding it (as the maximum of -index).
        LocalTensor<float> acc = accBuf.Get<float>();
        CopyFloats(acc, best, lanes);
        float top = TreeMax(acc, lanes, termBuf.Get<float>(), bits);
        ScalarToVectorSync();
        if (top == NegInf()) {
            return -1;
        }
        AscendC::Compares(bits, best, top, AscendC::CMPMODE::EQ, lanes);
        AscendC::Muls(index, bestIndex, -1.0f, lanes);
        AscendC::Select(acc, bits, index, NegInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        float lowest = TreeMax(acc, lanes, termBuf.Get<float>(), bits);
        ScalarToVectorSync();
        return static_cast<int64_t>(-lowest);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> kvBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> eBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> onesBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> coarseBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> noiseBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bestBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bestIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> indexBuf;
    RowResultsOf<int64_t> tokens;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> scaleGm;
    AscendC::GlobalTensor<int64_t> topKGm;
    AscendC::GlobalTensor<float> topPGm;
    AscendC::GlobalTensor<float> minPGm;
    AscendC::GlobalTensor<uint8_t> greedyGm;
    AscendC::GlobalTensor<int64_t> seedsGm;
    AscendC::GlobalTensor<int64_t> positionsGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_philox(GM_ADDR counters, GM_ADDR keys, GM_ADDR out, uint32_t n)
{
    bitparity::KernelPhilox op;
    op.Init(counters, keys, out, n);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_filter_logits(GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP,
                                                              GM_ADDR minP, GM_ADDR out, uint32_t rows, uint32_t cols)
{
    bitparity::KernelSampling<bitparity::SamplingOp::FILTER_LOGITS> op;
    op.Init(x, scale, topK, topP, minP, nullptr, nullptr, nullptr, out, rows, cols);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_sample(GM_ADDR x, GM_ADDR scale, GM_ADDR topK, GM_ADDR topP,
                                                       GM_ADDR minP, GM_ADDR greedy, GM_ADDR seeds, GM_ADDR positions,
                                                       GM_ADDR tokens, uint32_t rows, uint32_t cols)
{
    bitparity::KernelSampling<bitparity::SamplingOp::SAMPLE> op;
    op.Init(x, scale, topK, topP, minP, greedy, seeds, positions, tokens, rows, cols);
    op.Process();
}
