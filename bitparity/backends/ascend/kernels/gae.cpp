// gae: generalised advantage estimation by the reverse recurrence (spec 14) as an Ascend C kernel for Atlas A2.
//
//   rewards, values: f32[rows, cols] (GM, a sequence per row); mask: bool[rows, cols];
//   bootstrap: f32[rows]; advantages, returns: f32[rows, cols].  gamma = RN32(gamma) and
//   gammaLambda = RN32(gamma * RN32(lambda)) come from the host; zeroMode selects
//   mask_mode="zero", else "carry".
//
// Each row's recurrence is sequential in t, so the kernel vectorises across rows:
// a tile of TILE_ROWS = 64 rows is one vector repeat, lane i being row b0 + i,
// and every instruction of a step advances all of them by one time step.  Per
// lane the operations are exactly canonical.gae's, from t = cols - 1 down to 0,
// with next_v = bootstrap, last = +0.0:
//   carry: delta = (r + g * next_v) - v; cand = delta + gl * last;
//          next_v = select(m, v, next_v); last = select(m, cand, last);
//          adv = last; ret = last + v
//   zero:  r = select(m, r, 0); v = select(m, v, 0) (for the whole block, first);
//          delta = (r + g * next_v) - v; last = delta + gl * last; next_v = v;
//          adv = select(m, last, 0); ret = select(m, last + v, 0)
// Nothing crosses lanes, so no bit depends on which rows share a tile or a core.
//
// Layout: time runs in blocks of BLOCK_STEPS = 32 steps, walked from the last
// block (which may be ragged) to the first.  A block's [rows, steps] tile comes in
// with one strided DataCopyPad per input (rows at a pitch of BLOCK_STEPS in UB),
// is transposed to [steps, rows] by Gather (exact data movement, by a byte-offset
// table built once), so that step t of all the tile's rows is the 64 contiguous
// floats at t * TILE_ROWS; the outputs are transposed back by the inverse table
// and leave by one strided DataCopyPad each.  Lanes of rows past the tile's end
// and steps past a ragged block's end hold whatever UB held: they are computed or
// moved but never stored.  Rows are spread over AI cores in contiguous shares
// (tiling.h), each cut into tiles of up to 64 rows.
//
// UB budget (bytes): rewards, values 2 x 2 x 8192 + mask 2 x 2048 + bootstrap 256
// (VECIN), advantages, returns 2 x 2 x 8192 (VECOUT), maskHalf 4096, mask as
// floats, rewards, values, mask, advantages and returns by step 6 x 8192,
// offset tables 2 x 8192, last, delta, scaled 3 x 256, bits 256: 140,544 B of the
// 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

constexpr uint32_t TILE_ROWS = FLOATS_PER_REPEAT;   // one row per lane of a 256-byte repeat
constexpr uint32_t BLOCK_STEPS = 32;                // a block's mask row is one 32-byte UB block
constexpr uint32_t TILE = TILE_ROWS * BLOCK_STEPS;

// DataCopyPad parameters for `rows` GM runs of `len` elements at a pitch of `cols`,
// which sit in UB at a pitch of BLOCK_STEPS elements (the UB stride counts 32-byte
// blocks from the end of one run's padded block to the start of the next).
template <typename T>
__aicore__ inline AscendC::DataCopyExtParams TileRows(uint32_t rows, uint32_t len, uint32_t cols, bool toGm)
{
    const uint32_t bytes = len * static_cast<uint32_t>(sizeof(T));
    const uint32_t gmGap = (cols - len) * static_cast<uint32_t>(sizeof(T));
    const uint32_t ubGap = (BLOCK_STEPS * static_cast<uint32_t>(sizeof(T)) - RoundUp(bytes, 32)) / 32;
    const uint16_t blocks = static_cast<uint16_t>(rows);
    return toGm ? AscendC::DataCopyExtParams{blocks, bytes, ubGap, gmGap, 0}
                : AscendC::DataCopyExtParams{blocks, bytes, gmGap, ubGap, 0};
}

class KernelGae {
public:
    __aicore__ inline KernelGae() {}

    __aicore__ inline void Init(GM_ADDR rewards, GM_ADDR values, GM_ADDR mask, GM_ADDR bootstrap, GM_ADDR advantages,
                                GM_ADDR returns, uint32_t rows, uint32_t cols, float gamma, float gammaLambda,
                                uint32_t zeroMode)
    {
        this->cols = cols;
        this->gamma = gamma;
        this->gammaLambda = gammaLambda;
        this->zeroMode = zeroMode != 0;
        share = ThisCoresShare(rows);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        rewardsGm.SetGlobalBuffer((__gm__ float*)rewards, elements);
        valuesGm.SetGlobalBuffer((__gm__ float*)values, elements);
        maskGm.SetGlobalBuffer((__gm__ uint8_t*)mask, elements);
        bootstrapGm.SetGlobalBuffer((__gm__ float*)bootstrap, rows);
        advGm.SetGlobalBuffer((__gm__ float*)advantages, elements);
        retGm.SetGlobalBuffer((__gm__ float*)returns, elements);
        pipe.InitBuffer(rewardsQueue, BUFFER_NUM, TILE * sizeof(float));
        pipe.InitBuffer(valuesQueue, BUFFER_NUM, TILE * sizeof(float));
        pipe.InitBuffer(maskQueue, BUFFER_NUM, TILE * sizeof(uint8_t));
        pipe.InitBuffer(bootstrapQueue, 1, TILE_ROWS * sizeof(float));
        pipe.InitBuffer(advQueue, BUFFER_NUM, TILE * sizeof(float));
        pipe.InitBuffer(retQueue, BUFFER_NUM, TILE * sizeof(float));
        pipe.InitBuffer(maskHalfBuf, TILE * sizeof(half));
        pipe.InitBuffer(maskFloatBuf, TILE * sizeof(float));
        pipe.InitBuffer(rewardsByStepBuf, TILE * sizeof(float));
        pipe.InitBuffer(valuesByStepBuf, TILE * sizeof(float));
        pipe.InitBuffer(maskByStepBuf, TILE * sizeof(float));
        pipe.InitBuffer(advByStepBuf, TILE * sizeof(float));
        pipe.InitBuffer(retByStepBuf, TILE * sizeof(float));
        pipe.InitBuffer(toStepsBuf, TILE * sizeof(uint32_t));
        pipe.InitBuffer(toRowsBuf, TILE * sizeof(uint32_t));
        pipe.InitBuffer(lastBuf, TILE_ROWS * sizeof(float));
        pipe.InitBuffer(deltaBuf, TILE_ROWS * sizeof(float));
        pipe.InitBuffer(scaledBuf, TILE_ROWS * sizeof(float));
        pipe.InitBuffer(bitsBuf, TILE / 8);
        FillTransposeOffsets();
        ScalarToVectorSync();
    }

    __aicore__ inline void Process()
    {
        for (uint32_t b0 = share.begin; b0 < share.end; b0 += TILE_ROWS) {
            uint32_t tileRows = share.end - b0 < TILE_ROWS ? share.end - b0 : TILE_ROWS;
            Sequences(b0, tileRows);
        }
    }

private:
    // Byte offsets for Gather: [rows, steps] -> [steps, rows] and back.
    __aicore__ inline void FillTransposeOffsets()
    {
        LocalTensor<uint32_t> toSteps = toStepsBuf.Get<uint32_t>();
        LocalTensor<uint32_t> toRows = toRowsBuf.Get<uint32_t>();
        for (uint32_t r = 0; r < TILE_ROWS; ++r) {
            for (uint32_t t = 0; t < BLOCK_STEPS; ++t) {
                toSteps.SetValue(t * TILE_ROWS + r, (r * BLOCK_STEPS + t) * sizeof(float));
                toRows.SetValue(r * BLOCK_STEPS + t, (t * TILE_ROWS + r) * sizeof(float));
            }
        }
    }

    // The recurrence of rows b0 .. b0 + tileRows - 1, block by block from the end.
    __aicore__ inline void Sequences(uint32_t b0, uint32_t tileRows)
    {
        LocalTensor<float> boot = bootstrapQueue.AllocTensor<float>();
        AscendC::DataCopyExtParams copy{1, static_cast<uint32_t>(tileRows * sizeof(float)), 0, 0, 0};
        AscendC::DataCopyPad(boot, bootstrapGm[b0], copy, AscendC::DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
        bootstrapQueue.EnQue(boot);
        LocalTensor<float> nextV = bootstrapQueue.DeQue<float>();   // next_v starts as the bootstrap
        AscendC::Duplicate(lastBuf.Get<float>(), 0.0f, TILE_ROWS);
        for (uint32_t block = (cols + BLOCK_STEPS - 1) / BLOCK_STEPS; block-- > 0;) {
            uint32_t t0 = block * BLOCK_STEPS;
            uint32_t len = cols - t0 < BLOCK_STEPS ? cols - t0 : BLOCK_STEPS;
            uint64_t offset = static_cast<uint64_t>(b0) * cols + t0;
            CopyIn(offset, tileRows, len);
            ComputeBySteps();
            if (zeroMode) {
                StepsZero(nextV, len);
            } else {
                StepsCarry(nextV, len);
            }
            ComputeByRows();
            CopyOut(offset, tileRows, len);
        }
        bootstrapQueue.FreeTensor(nextV);
    }

    __aicore__ inline void CopyIn(uint64_t offset, uint32_t tileRows, uint32_t len)
    {
        AscendC::DataCopyPadExtParams<float> padFloat{false, 0, 0, 0.0f};
        AscendC::DataCopyPadExtParams<uint8_t> padByte{false, 0, 0, 0};
        LocalTensor<float> r = rewardsQueue.AllocTensor<float>();
        AscendC::DataCopyPad(r, rewardsGm[offset], TileRows<float>(tileRows, len, cols, false), padFloat);
        rewardsQueue.EnQue(r);
        LocalTensor<float> v = valuesQueue.AllocTensor<float>();
        AscendC::DataCopyPad(v, valuesGm[offset], TileRows<float>(tileRows, len, cols, false), padFloat);
        valuesQueue.EnQue(v);
        LocalTensor<uint8_t> m = maskQueue.AllocTensor<uint8_t>();
        AscendC::DataCopyPad(m, maskGm[offset], TileRows<uint8_t>(tileRows, len, cols, false), padByte);
        maskQueue.EnQue(m);
    }

    // The block's rewards, values and mask (1.0 / 0.0), transposed to [steps, rows].
    // In zero mode rewards and values are first set to 0 where the mask is False.
    __aicore__ inline void ComputeBySteps()
    {
        LocalTensor<float> r = rewardsQueue.DeQue<float>();
        LocalTensor<float> v = valuesQueue.DeQue<float>();
        LocalTensor<uint8_t> m = maskQueue.DeQue<uint8_t>();
        LocalTensor<half> maskHalf = maskHalfBuf.Get<half>();
        LocalTensor<float> maskFloat = maskFloatBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        LocalTensor<uint32_t> toSteps = toStepsBuf.Get<uint32_t>();
        // A2 has no uint8 Compare: the mask bytes are cast exactly to half and compared with 0.
        AscendC::Cast(maskHalf, m, AscendC::RoundMode::CAST_NONE, TILE);
        AscendC::Compares(bits, maskHalf, static_cast<half>(0), AscendC::CMPMODE::NE, TILE);
        maskQueue.FreeTensor(m);
        if (zeroMode) {
            AscendC::Select(r, bits, r, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, TILE);
            AscendC::Select(v, bits, v, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, TILE);
        }
        AscendC::Duplicate(maskFloat, 1.0f, TILE);
        AscendC::Select(maskFloat, bits, maskFloat, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, TILE);
        AscendC::Gather(rewardsByStepBuf.Get<float>(), r, toSteps, 0, TILE);
        AscendC::Gather(valuesByStepBuf.Get<float>(), v, toSteps, 0, TILE);
        AscendC::Gather(maskByStepBuf.Get<float>(), maskFloat, toSteps, 0, TILE);
        rewardsQueue.FreeTensor(r);
        valuesQueue.FreeTensor(v);
    }

    // mask_mode="carry": steps len - 1 .. 0 of the block on all 64 lanes.
    __aicore__ inline void StepsCarry(const LocalTensor<float>& nextV, uint32_t len)
    {
        LocalTensor<float> last = lastBuf.Get<float>();
        LocalTensor<float> delta = deltaBuf.Get<float>();
        LocalTensor<float> scaled = scaledBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        for (uint32_t t = len; t-- > 0;) {
            const uint32_t at = t * TILE_ROWS;
            LocalTensor<float> r = rewardsByStepBuf.Get<float>()[at];
            LocalTensor<float> v = valuesByStepBuf.Get<float>()[at];
            AscendC::Muls(delta, nextV, gamma, TILE_ROWS);
            AscendC::Add(delta, r, delta, TILE_ROWS);
            AscendC::Sub(delta, delta, v, TILE_ROWS);                  // delta = (r + g * next_v) - v
            AscendC::Muls(scaled, last, gammaLambda, TILE_ROWS);
            AscendC::Add(delta, delta, scaled, TILE_ROWS);             // cand = delta + gl * last
            AscendC::Compares(bits, maskByStepBuf.Get<float>()[at], 0.0f, AscendC::CMPMODE::NE, TILE_ROWS);
            AscendC::Select(nextV, bits, v, nextV, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, TILE_ROWS);
            AscendC::Select(last, bits, delta, last, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, TILE_ROWS);
            CopyFloats(advByStepBuf.Get<float>()[at], last, TILE_ROWS);
            AscendC::Add(retByStepBuf.Get<float>()[at], last, v, TILE_ROWS);
        }
    }

    // mask_mode="zero": steps len - 1 .. 0 of the block; next_v is the (zeroed) value of
    // the step after, which for the block's last step is carried in nextV.
    __aicore__ inline void StepsZero(const LocalTensor<float>& nextV, uint32_t len)
    {
        LocalTensor<float> last = lastBuf.Get<float>();
        LocalTensor<float> delta = deltaBuf.Get<float>();
        LocalTensor<float> scaled = scaledBuf.Get<float>();
        LocalTensor<uint8_t> bits = bitsBuf.Get<uint8_t>();
        LocalTensor<float> values = valuesByStepBuf.Get<float>();
        for (uint32_t t = len; t-- > 0;) {
            const uint32_t at = t * TILE_ROWS;
            LocalTensor<float> r = rewardsByStepBuf.Get<float>()[at];
            LocalTensor<float> v = values[at];
            LocalTensor<float> next = t + 1 < len ? values[at + TILE_ROWS] : nextV;
            AscendC::Muls(delta, next, gamma, TILE_ROWS);
            AscendC::Add(delta, r, delta, TILE_ROWS);
            AscendC::Sub(delta, delta, v, TILE_ROWS);                  // delta = (r + g * next_v) - v
            AscendC::Muls(scaled, last, gammaLambda, TILE_ROWS);
            AscendC::Add(last, delta, scaled, TILE_ROWS);              // last = delta + gl * last
            AscendC::Compares(bits, maskByStepBuf.Get<float>()[at], 0.0f, AscendC::CMPMODE::NE, TILE_ROWS);
            AscendC::Select(advByStepBuf.Get<float>()[at], bits, last, 0.0f,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, TILE_ROWS);
            AscendC::Add(delta, last, v, TILE_ROWS);
            AscendC::Select(retByStepBuf.Get<float>()[at], bits, delta, 0.0f,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, TILE_ROWS);
        }
        CopyFloats(nextV, values, TILE_ROWS);   // the block's first step is next for the block before
    }

    // The block's advantages and returns, transposed back to [rows, steps].
    __aicore__ inline void ComputeByRows()
    {
        LocalTensor<uint32_t> toRows = toRowsBuf.Get<uint32_t>();
        LocalTensor<float> adv = advQueue.AllocTensor<float>();
        AscendC::Gather(adv, advByStepBuf.Get<float>(), toRows, 0, TILE);
        advQueue.EnQue(adv);
        LocalTensor<float> ret = retQueue.AllocTensor<float>();
        AscendC::Gather(ret, retByStepBuf.Get<float>(), toRows, 0, TILE);
        retQueue.EnQue(ret);
    }

    __aicore__ inline void CopyOut(uint64_t offset, uint32_t tileRows, uint32_t len)
    {
        LocalTensor<float> adv = advQueue.DeQue<float>();
        AscendC::DataCopyPad(advGm[offset], adv, TileRows<float>(tileRows, len, cols, true));
        advQueue.FreeTensor(adv);
        LocalTensor<float> ret = retQueue.DeQue<float>();
        AscendC::DataCopyPad(retGm[offset], ret, TileRows<float>(tileRows, len, cols, true));
        retQueue.FreeTensor(ret);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> rewardsQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> valuesQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> maskQueue;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> bootstrapQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> advQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> retQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskHalfBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskFloatBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rewardsByStepBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> valuesByStepBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskByStepBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> advByStepBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> retByStepBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> toStepsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> toRowsBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> lastBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> deltaBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scaledBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> bitsBuf;
    AscendC::GlobalTensor<float> rewardsGm;
    AscendC::GlobalTensor<float> valuesGm;
    AscendC::GlobalTensor<uint8_t> maskGm;
    AscendC::GlobalTensor<float> bootstrapGm;
    AscendC::GlobalTensor<float> advGm;
    AscendC::GlobalTensor<float> retGm;
    Range share;
    uint32_t cols = 0;
    float gamma = 0.0f;
    float gammaLambda = 0.0f;
    bool zeroMode = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_gae(GM_ADDR rewards, GM_ADDR values, GM_ADDR mask, GM_ADDR bootstrap,
                                                    GM_ADDR advantages, GM_ADDR returns, uint32_t rows, uint32_t cols,
                                                    float gamma, float gammaLambda, uint32_t zeroMode)
{
    bitparity::KernelGae op;
    op.Init(rewards, values, mask, bootstrap, advantages, returns, rows, cols, gamma, gammaLambda, zeroMode);
    op.Process();
}
