// ppo_token_losses: verl's clipped PPO surrogate per token (spec 17.1) as an Ascend C kernel for Atlas A2.
//
//   logp, oldLogp, advantages: f32[n] (GM, the [B, T] tokens in row-major order);
//   loss: f32[n]; clipped: f32[n], 1.0 where the clipped loss won, else 0.0.
//   ratioLow, ratioHigh: the float32 ratio bounds; dualClip, ratioClamp: float32
//   values, +inf when unset.
//
// Each token is computed on its own, in the spec's order:
//   d = logp - oldLogp; d = min(max(d, -ratioClamp), ratioClamp)    (NaN-propagating)
//   ratio = exp(d); na = -advantages
//   loss1 = na * ratio; loss2 = na * min(max(ratio, ratioLow), ratioHigh)
//   clipped = loss2 > loss1; loss = max(loss1, loss2)               (NaN-propagating)
//   loss = select(advantages < 0, min(na * dualClip, loss), loss)    (NaN-propagating)
// An unset bound is +inf, which changes no bit: a clamp to [-inf, inf] is the
// identity, and where advantages < 0, na > 0 so na * inf = inf and
// min(inf, loss) = loss.  Which zero Max/Min return on a tie never matters:
// loss1 and loss2 both carry na's sign (ratio >= +0, the clipped ratio > 0), and
// so do na * dualClip and loss where advantages < 0.
//
// The aggregation (spec 17.2) is not here: the binding reduces loss and clipped
// with the canonical masked mean and sum kernels (masked.cpp, reduce.cpp), the
// sequence modes over the non-empty sequences only (e_b = n_b > 0, a mask), and
// seq-mean-token-sum-norm's last step, total * reciprocal(T), is masked.cpp's
// masked_mean_backward over a row of T counted entries (g * R(T)).
// Tiling as in elementwise.cpp.
//
// Backward (spec 26.10): two launches.
//   ppo_token_weights (KernelPpoWeights): w_b, the loss's derivative w.r.t. each
//     counted token loss of sequence b, with g the loss's gradient (f32[1] in GM),
//     R(k) = (k == 0 ? 0 : reciprocal(k)), n the count of all B * T mask entries
//     (one core, the whole mask as one row), n_b that of row b, E the number of
//     non-empty rows (n_b > 0; every core counts all rows for it, exactly), T the
//     row length:
//       token-mean g * R(n); seq-mean-token-sum g * R(E);
//       seq-mean-token-mean (g * R(E)) * R(n_b);
//       seq-mean-token-sum-norm (g * reciprocal(T)) * R(E).
//   ppo_policy_loss_backward (KernelPpoGrad): rows over cores, each row's tokens by
//     chunks as in softmax.cpp; the forward's d0, d, ratio, na, loss1, loss2 in its
//     order, then dlogp = loss1 * w_b, +0.0 where the mask is False, where
//     loss2 > loss1 (the clip holds the loss), where adv < 0 and na * dualClip <
//     max(loss1, loss2) (NaN-propagating max; the dual clip holds it), and where
//     d0 < -ratioClamp or d0 > ratioClamp.  An unset dual clip or clamp (+inf)
//     holds nothing, so its compares are skipped.
//
// UB budget (bytes): logp, old, adv 3 x 2 x 4096 (VECIN), loss, clipped
// 2 x 2 x 4096 (VECOUT), d, ratio, na, loss1, loss2, tmp 6 x 4096, work 16384,
// bits 128: 82,048 B of the 188,416 B (184 KB) InitBuffer may use.
// KernelPpoGrad: logp, old, adv 3 x 2 x 4096 + mask 2 x 1024 (VECIN), out
// 2 x 4096 (VECOUT), d0, d, ratio, na, loss1, loss2, tmp, zeros 8 x 4096, work
// 16384, maskHalf 2048, bits 128: 86,144 B.  KernelPpoWeights: mask 2 x 1024
// (VECIN), count, term, ones, laneIndex 4 x 4096, maskHalf 2048, bits 128,
// scalar lanes and work 2304, results 4096: 27,008 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

// Spec 17.1's per-token terms in its order, which the loss (KernelPpoTokens) and its gradient (KernelPpoGrad)
// both compute: d0 = logp - oldLogp; d = d0 clamped to [-ratioClamp, ratioClamp] (d and d0 may be one
// tensor); ratio = exp(d); na = -advantages; loss1 = na * ratio; loss2 = na * ratio clamped to
// [ratioLow, ratioHigh].
__aicore__ inline void PpoSurrogates(const LocalTensor<float>& d0, const LocalTensor<float>& d,
                                     const LocalTensor<float>& ratio, const LocalTensor<float>& na,
                                     const LocalTensor<float>& loss1, const LocalTensor<float>& loss2,
                                     const LocalTensor<float>& logp, const LocalTensor<float>& old,
                                     const LocalTensor<float>& adv, float ratioLow, float ratioHigh,
                                     float ratioClamp, const LocalTensor<float>& tmp,
                                     const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits,
                                     uint32_t lanes)
{
    AscendC::Sub(d0, logp, old, lanes);
    NanClamp(d, d0, -ratioClamp, ratioClamp, tmp, bits, lanes);
    CanonicalExp(ratio, d, work, bits, lanes);
    AscendC::Muls(na, adv, -1.0f, lanes);
    AscendC::Mul(loss1, na, ratio, lanes);
    NanClamp(loss2, ratio, ratioLow, ratioHigh, tmp, bits, lanes);
    AscendC::Mul(loss2, na, loss2, lanes);
}

class KernelPpoTokens {
public:
    __aicore__ inline KernelPpoTokens() {}

    __aicore__ inline void Init(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR loss, GM_ADDR clipped,
                                uint32_t n, float ratioLow, float ratioHigh, float dualClip, float ratioClamp)
    {
        this->n = n;
        this->ratioLow = ratioLow;
        this->ratioHigh = ratioHigh;
        this->dualClip = dualClip;
        this->ratioClamp = ratioClamp;
        share = ThisCoresShare((n + LANES - 1) / LANES);
        logpGm.SetGlobalBuffer((__gm__ float*)logp, n);
        oldGm.SetGlobalBuffer((__gm__ float*)oldLogp, n);
        advGm.SetGlobalBuffer((__gm__ float*)advantages, n);
        lossGm.SetGlobalBuffer((__gm__ float*)loss, n);
        clippedGm.SetGlobalBuffer((__gm__ float*)clipped, n);
        pipe.InitBuffer(logpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(oldQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(advQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(lossQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(clippedQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(ratioBuf, LANES * sizeof(float));
        pipe.InitBuffer(naBuf, LANES * sizeof(float));
        pipe.InitBuffer(loss1Buf, LANES * sizeof(float));
        pipe.InitBuffer(loss2Buf, LANES * sizeof(float));
        pipe.InitBuffer(tmpBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(bitsBuf, LANES / 8);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t t = share.begin; t < share.end; ++t) {
            uint64_t offset = static_cast<uint64_t>(t) * LANES;
            uint32_t len = n - offset < LANES ? static_cast<uint32_t>(n - offset) : LANES;
            CopyIn(offset, len);
            Compute(RoundUp(len, FLOATS_PER_REPEAT));
            CopyOut(offset, len);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> logp = logpQueue.AllocTensor<float>();
        LoadChunk(logp, logpGm[offset], len);
        logpQueue.EnQue(logp);
        LocalTensor<float> old = oldQueue.AllocTensor<float>();
        LoadChunk(old, oldGm[offset], len);
        oldQueue.EnQue(old);
        LocalTensor<float> adv = advQueue.AllocTensor<float>();
        LoadChunk(adv, advGm[offset], len);
        advQueue.EnQue(adv);
    }

    __aicore__ inline void Compute(uint32_t lanes)
    {
        LocalTensor<float> logp = logpQueue.DeQue<float>();
        LocalTensor<float> old = oldQueue.DeQue<float>();
        LocalTensor<float> adv = advQueue.DeQue<float>();
        LocalTensor<float> loss = lossQueue.AllocTensor<float>();
        LocalTensor<float> clipped = clippedQueue.AllocTensor<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> ratio = ratioBuf.Get<float>();
        LocalTensor<float> na = naBuf.Get<float>();
        LocalTensor<float> loss1 = loss1Buf.Get<float>();
        LocalTensor<float> loss2 = loss2Buf.Get<float>();
        LocalTensor<float> tmp = tmpBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();

        PpoSurrogates(d, d, ratio, na, loss1, loss2, logp, old, adv, ratioLow, ratioHigh, ratioClamp, tmp,
                      workBuf.Get<float>(), bits, lanes);
        logpQueue.FreeTensor(logp);
        oldQueue.FreeTensor(old);
        // clipped = (loss2 > loss1 ? 1.0 : 0.0)
        AscendC::Compare(bits, loss2, loss1, AscendC::CMPMODE::GT, lanes);
        AscendC::Duplicate(clipped, 1.0f, lanes);
        AscendC::Select(clipped, bits, clipped, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        NanMax(loss, loss1, loss2, tmp, bits, lanes);
        // The dual clip: where advantages < 0, loss = min(na * dualClip, loss).
        AscendC::Muls(d, na, dualClip, lanes);
        NanMin(d, d, loss, tmp, bits, lanes);
        AscendC::Compares(bits, adv, 0.0f, AscendC::CMPMODE::LT, lanes);
        AscendC::Select(loss, bits, d, loss, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
        advQueue.FreeTensor(adv);
        lossQueue.EnQue(loss);
        clippedQueue.EnQue(clipped);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> loss = lossQueue.DeQue<float>();
        StoreChunk(lossGm[offset], loss, len);
        lossQueue.FreeTensor(loss);
        LocalTensor<float> clipped = clippedQueue.DeQue<float>();
        StoreChunk(clippedGm[offset], clipped, len);
        clippedQueue.FreeTensor(clipped);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> logpQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> oldQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> advQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> lossQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> clippedQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> ratioBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> naBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss1Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> logpGm;
    AscendC::GlobalTensor<float> oldGm;
    AscendC::GlobalTensor<float> advGm;
    AscendC::GlobalTensor<float> lossGm;
    AscendC::GlobalTensor<float> clippedGm;
    Range share;
    uint32_t n = 0;
    float ratioLow = 0.0f;
    float ratioHigh = 0.0f;
    float dualClip = 0.0f;
    float ratioClamp = 0.0f;
};

// ---- Backward (spec 26.10) -----------------------------------------------------------

// The values bitparity/backends/ascend passes for ops.PPO_AGGS.
enum class PpoAgg : uint32_t {
    TOKEN_MEAN = 0,
    SEQ_MEAN_TOKEN_SUM = 1,
    SEQ_MEAN_TOKEN_MEAN = 2,
    SEQ_MEAN_TOKEN_SUM_NORM = 3
};

// w_b per row (spec 26.10's token weights).
class KernelPpoWeights {
public:
    __aicore__ inline KernelPpoWeights() {}

    // mask: bool[rows, cols]; g: f32[1]; weights: f32[rows].
    __aicore__ inline void Init(GM_ADDR mask, GM_ADDR g, GM_ADDR weights, uint32_t rows, uint32_t cols, uint32_t agg)
    {
        this->rows = rows;
        this->cols = cols;
        this->agg = static_cast<PpoAgg>(agg);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        // token-mean counts the whole mask as one row on one core (the host keeps it within MAX_ROW).
        geo = MakeRowGeometry(this->agg == PpoAgg::TOKEN_MEAN ? static_cast<uint32_t>(elements) : cols);
        share = ThisCoresShare(this->agg == PpoAgg::TOKEN_MEAN ? 1 : rows);
        maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
        gGm.SetGlobalBuffer((__gm__ float*)g, 1);
        pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
        pipe.InitBuffer(countBuf, LANES * sizeof(float));
        pipe.InitBuffer(termBuf, LANES * sizeof(float));
        pipe.InitBuffer(onesBuf, LANES * sizeof(float));
        pipe.InitBuffer(laneIndexBuf, LANES * sizeof(float));
        pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        pipe.InitBuffer(scalarInBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarOutBuf, FLOATS_PER_REPEAT * sizeof(float));
        pipe.InitBuffer(scalarWorkBuf, 7 * FLOATS_PER_REPEAT * sizeof(float));
        results.Init(&pipe, weights, rows);
        FillLaneIndex(laneIndexBuf.Get<float>());
        ScalarToVectorSync();
        AscendC::Duplicate(onesBuf.Get<float>(), 1.0f, LANES);
    }

    __aicore__ inline void Process()
    {
        if (share.begin == share.end) {
            return;
        }
        const float g = gGm.GetValue(0);
        if (agg == PpoAgg::TOKEN_MEAN) {
            const float w = g * CountReciprocal(Count(0));
            for (uint32_t row = 0; row < rows; ++row) {
                results.Put(row, w);
            }
        } else {
            const float sequences = CountReciprocal(NonEmptyRows());
            float perRow = g * sequences;
            if (agg == PpoAgg::SEQ_MEAN_TOKEN_SUM_NORM) {
                // exact: cols <= 2^24
                const float norm = ReciprocalOfScalar(static_cast<float>(cols), scalarInBuf.Get<float>(),
                                                      scalarOutBuf.Get<float>(), scalarWorkBuf.Get<float>());
                perRow = (g * norm) * sequences;
            }
            for (uint32_t row = share.begin; row < share.end; ++row) {
                if (agg == PpoAgg::SEQ_MEAN_TOKEN_MEAN) {
                    results.Put(row, perRow * CountReciprocal(Count(static_cast<uint64_t>(row) * cols)));
                } else {
                    results.Put(row, perRow);
                }
            }
        }
        results.Flush();
    }

private:
    // E, the number of rows with at least one True entry, as a float (exact: rows <= 2^24).
    __aicore__ inline float NonEmptyRows()
    {
        uint32_t nonEmpty = 0;
        for (uint32_t row = 0; row < rows; ++row) {
            if (Count(static_cast<uint64_t>(row) * cols) > 0.0f) {
                ++nonEmpty;
            }
        }
        return static_cast<float>(nonEmpty);
    }

    // The number of True entries of the geometry's row starting at rowStart, exact (tiling.h's AccumulateCount).
    __aicore__ inline float Count(uint64_t rowStart)
    {
        LocalTensor<float> count = countBuf.Get<float>();
        AscendC::Duplicate(count, NegZero(), geo.lanes);
        for (uint32_t seg = 0; seg < geo.segments; ++seg) {
            for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint64_t offset = rowStart + geo.ChunkStart(seg, c);
                uint32_t len = geo.ChunkLength(seg, c);
                LocalTensor<uint8_t> m = maskQueue.AllocTensor<uint8_t>();
                LoadChunk(m, maskGm[offset], len);
                maskQueue.EnQue(m);
                m = maskQueue.DeQue<uint8_t>();
                AccumulateCount(count, m, maskHalfBuf.Get<half>(), onesBuf.Get<float>(), termBuf.Get<float>(),
                                laneIndexBuf.Get<float>(), bitsBuf.Get<uint8_t>(), len, geo.lanes);
                maskQueue.FreeTensor(m);
            }
        }
        float n = TreeSum(count, geo.treeWidth);
        ScalarToVectorSync();
        return n;
    }

    // R(k) = (k == 0 ? 0 : reciprocal(k)).
    __aicore__ inline float CountReciprocal(float k)
    {
        if (k == 0.0f) {
            return 0.0f;
        }
        return ReciprocalOfScalar(k, scalarInBuf.Get<float>(), scalarOutBuf.Get<float>(), scalarWorkBuf.Get<float>());
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> countBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> termBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> onesBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneIndexBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarInBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarOutBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scalarWorkBuf;
    RowResults results;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> gGm;
    RowGeometry geo;
    Range share;
    uint32_t rows = 0;
    uint32_t cols = 0;
    PpoAgg agg = PpoAgg::TOKEN_MEAN;
};

// dlogp per token (spec 26.10).
class KernelPpoGrad {
public:
    __aicore__ inline KernelPpoGrad() {}

    // logp, oldLogp, advantages: f32[rows, cols]; mask: bool[rows, cols]; weights: f32[rows] (KernelPpoWeights').
    __aicore__ inline void Init(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages, GM_ADDR mask, GM_ADDR weights,
                                GM_ADDR out, uint32_t rows, uint32_t cols, float ratioLow, float ratioHigh,
                                float dualClip, float ratioClamp)
    {
        this->cols = cols;
        this->ratioLow = ratioLow;
        this->ratioHigh = ratioHigh;
        this->dualClip = dualClip;
        this->ratioClamp = ratioClamp;
        geo = MakeRowGeometry(cols);
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        logpGm.SetGlobalBuffer((__gm__ float*)logp, elements);
        oldGm.SetGlobalBuffer((__gm__ float*)oldLogp, elements);
        advGm.SetGlobalBuffer((__gm__ float*)advantages, elements);
        maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
        weightsGm.SetGlobalBuffer((__gm__ float*)weights, rows);
        outGm.SetGlobalBuffer((__gm__ float*)out, elements);
        pipe.InitBuffer(logpQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(oldQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(advQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(maskQueue, BUFFER_NUM, LANES * sizeof(uint8_t));
        pipe.InitBuffer(outQueue, BUFFER_NUM, LANES * sizeof(float));
        pipe.InitBuffer(d0Buf, LANES * sizeof(float));
        pipe.InitBuffer(dBuf, LANES * sizeof(float));
        pipe.InitBuffer(ratioBuf, LANES * sizeof(float));
        pipe.InitBuffer(naBuf, LANES * sizeof(float));
        pipe.InitBuffer(loss1Buf, LANES * sizeof(float));
        pipe.InitBuffer(loss2Buf, LANES * sizeof(float));
        pipe.InitBuffer(tmpBuf, LANES * sizeof(float));
        pipe.InitBuffer(zerosBuf, LANES * sizeof(float));
        pipe.InitBuffer(workBuf, 4 * LANES * sizeof(float));
        pipe.InitBuffer(maskHalfBuf, LANES * sizeof(half));
        pipe.InitBuffer(bitsBuf, LANES / 8);
        AscendC::Duplicate(zerosBuf.Get<float>(), 0.0f, LANES);
    }

    __aicore__ inline void Process()
    {
        for (uint32_t row = share.begin; row < share.end; ++row) {
            uint64_t rowStart = static_cast<uint64_t>(row) * cols;
            const float w = weightsGm.GetValue(row);
            for (uint32_t seg = 0; seg < geo.segments; ++seg) {
                for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                    uint64_t offset = rowStart + geo.ChunkStart(seg, c);
                    uint32_t len = geo.ChunkLength(seg, c);
                    CopyIn(offset, len);
                    Compute(w);
                    CopyOut(offset, len);
                }
            }
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> logp = logpQueue.AllocTensor<float>();
        LoadChunk(logp, logpGm[offset], len);
        logpQueue.EnQue(logp);
        LocalTensor<float> old = oldQueue.AllocTensor<float>();
        LoadChunk(old, oldGm[offset], len);
        oldQueue.EnQue(old);
        LocalTensor<float> adv = advQueue.AllocTensor<float>();
        LoadChunk(adv, advGm[offset], len);
        advQueue.EnQue(adv);
        LocalTensor<uint8_t> m = maskQueue.AllocTensor<uint8_t>();
        LoadChunk(m, maskGm[offset], len);
        maskQueue.EnQue(m);
    }

    // out = +0.0 where bits holds.
    __aicore__ inline void ZeroWhere(const LocalTensor<float>& out, const LocalTensor<uint8_t>& bits, uint32_t lanes)
    {
        AscendC::Select(out, bits, zerosBuf.Get<float>(), out, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, lanes);
    }

    __aicore__ inline void Compute(float w)
    {
        const uint32_t lanes = geo.lanes;
        LocalTensor<float> logp = logpQueue.DeQue<float>();
        LocalTensor<float> old = oldQueue.DeQue<float>();
        LocalTensor<float> adv = advQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> d0 = d0Buf.Get<float>();
        LocalTensor<float> d = dBuf.Get<float>();
        LocalTensor<float> ratio = ratioBuf.Get<float>();
        LocalTensor<float> na = naBuf.Get<float>();
        LocalTensor<float> loss1 = loss1Buf.Get<float>();
        LocalTensor<float> loss2 = loss2Buf.Get<float>();
        LocalTensor<float> tmp = tmpBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();

        PpoSurrogates(d0, d, ratio, na, loss1, loss2, logp, old, adv, ratioLow, ratioHigh, ratioClamp, tmp,
                      workBuf.Get<float>(), bits, lanes);
        logpQueue.FreeTensor(logp);
        oldQueue.FreeTensor(old);
        // d loss1 / d logp = na * ratio = loss1, times the token weight.
        AscendC::Muls(out, loss1, w, lanes);
        AscendC::Compare(bits, loss2, loss1, AscendC::CMPMODE::GT, lanes);
        ZeroWhere(out, bits, lanes);
        if (dualClip != PosInf()) {
            // Held where adv < 0 and na * c < max(loss1, loss2): na * c is replaced by NaN (which
            // compares false) where adv >= 0 or is NaN, so one compare tests both.
            NanMax(ratio, loss1, loss2, tmp, bits, lanes);
            AscendC::Muls(d, na, dualClip, lanes);
            AscendC::Compares(bits, adv, 0.0f, AscendC::CMPMODE::LT, lanes);
            AscendC::Select(d, bits, d, QuietNaN(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
            AscendC::Compare(bits, d, ratio, AscendC::CMPMODE::LT, lanes);
            ZeroWhere(out, bits, lanes);
        }
        advQueue.FreeTensor(adv);
        if (ratioClamp != PosInf()) {
            AscendC::Compares(bits, d0, -ratioClamp, AscendC::CMPMODE::LT, lanes);
            ZeroWhere(out, bits, lanes);
            AscendC::Compares(bits, d0, ratioClamp, AscendC::CMPMODE::GT, lanes);
            ZeroWhere(out, bits, lanes);
        }
        SelectUnmasked(out, out, m, maskHalfBuf.Get<half>(), bits, lanes, 0.0f);
        maskQueue.FreeTensor(m);
        outQueue.EnQue(out);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> logpQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> oldQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> advQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> d0Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> dBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> ratioBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> naBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss1Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> loss2Buf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> zerosBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> logpGm;
    AscendC::GlobalTensor<float> oldGm;
    AscendC::GlobalTensor<float> advGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> weightsGm;
    AscendC::GlobalTensor<float> outGm;
    RowGeometry geo;
    Range share;
    uint32_t cols = 0;
    float ratioLow = 0.0f;
    float ratioHigh = 0.0f;
    float dualClip = 0.0f;
    float ratioClamp = 0.0f;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_ppo_token_losses(GM_ADDR logp, GM_ADDR oldLogp, GM_ADDR advantages,
                                                                 GM_ADDR loss, GM_ADDR clipped, uint32_t n,
                                                                 float ratioLow, float ratioHigh, float dualClip,
                                                                 float ratioClamp)
{
    bitparity::KernelPpoTokens op;
    op.Init(logp, oldLogp, advantages, loss, clipped, n, ratioLow, ratioHigh, dualClip, ratioClamp);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_ppo_token_weights(GM_ADDR mask, GM_ADDR g, GM_ADDR weights,
                                                                  uint32_t rows, uint32_t cols, uint32_t agg)
{
    bitparity::KernelPpoWeights op;
    op.Init(mask, g, weights, rows, cols, agg);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_ppo_policy_loss_backward(GM_ADDR logp, GM_ADDR oldLogp,
                                                                         GM_ADDR advantages, GM_ADDR mask,
                                                                         GM_ADDR weights, GM_ADDR out, uint32_t rows,
                                                                         uint32_t cols, float ratioLow,
                                                                         float ratioHigh, float dualClip,
                                                                         float ratioClamp)
{
    bitparity::KernelPpoGrad op;
    op.Init(logp, oldLogp, advantages, mask, weights, out, rows, cols, ratioLow, ratioHigh, dualClip, ratioClamp);
    op.Process();
}
