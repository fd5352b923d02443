// linear (spec 24.1) as an Ascend C kernel for Atlas A2.
//
//   x: f32[M, K] (GM); weightT: f32[K, N], torch's weight [N, K] transposed by the
//   host (a copy: no arithmetic); bias: f32[N] or absent; y: f32[M, N].
//
// y[m, n] = dot(x[m, :], weight[n, :]) in spec 3's order over k, then + bias[n]
// (one add; no + 0.0, so an all -0.0 product row stays -0.0).  The dots are
// DotTiles' (dot_tiles.h): the Vector unit's Muls (one rounding per product) and
// Adds in the spec's lane and tree order, for a block of B output columns at a
// time.  The Cube unit (Mmad) is not used: it accumulates in its own order, not
// as the canonical sum of once-rounded products (dot_tiles.h).
//
// Column blocks are spread over AI cores; a core computes every row m of its
// blocks, keeping the block's weight tile in UB across rows when K <= LANES.
//
// UB budget (bytes): DotTiles with an 8192-float accumulator: weight 2 x 32768,
// accumulator 32768, product rows 32768 and partial rows at most 32768 (long K
// only); bias 4 x B, out 2 x 4 x B (B <= 1024): at most 180,224 B of the 188,416 B
// (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "dot_tiles.h"

namespace bitparity {

constexpr uint32_t LINEAR_TILE_FLOATS = 8192;
constexpr uint32_t LINEAR_MAX_COLUMNS = 1024;

class KernelLinear {
public:
    __aicore__ inline KernelLinear() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR weightT, GM_ADDR bias, GM_ADDR y, uint32_t m, uint32_t k,
                                uint32_t n, uint32_t hasBias)
    {
        this->m = m;
        this->k = k;
        this->n = n;
        this->hasBias = hasBias != 0;
        xGm.SetGlobalBuffer((__gm__ float*)x, static_cast<uint64_t>(m) * k);
        weightGm.SetGlobalBuffer((__gm__ float*)weightT, static_cast<uint64_t>(k) * n);
        yGm.SetGlobalBuffer((__gm__ float*)y, static_cast<uint64_t>(m) * n);
        uint32_t maxColumns = n < LINEAR_MAX_COLUMNS ? n : LINEAR_MAX_COLUMNS;
        dots.Init(&pipe, k, maxColumns, LINEAR_TILE_FLOATS);
        columns = dots.Columns();
        share = ThisCoresShare((n + columns - 1) / columns);
        if (this->hasBias) {
            biasGm.SetGlobalBuffer((__gm__ float*)bias, n);
            pipe.InitBuffer(biasQueue, 1, columns * sizeof(float));
        }
        pipe.InitBuffer(yQueue, BUFFER_NUM, columns * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t block = share.begin; block < share.end; ++block) {
            const uint32_t n0 = block * columns;
            const uint32_t cols = n - n0 < columns ? n - n0 : columns;
            LocalTensor<float> biasTile;
            if (hasBias) {
                biasTile = biasQueue.AllocTensor<float>();
                LoadChunk(biasTile, biasGm[n0], cols);
                biasQueue.EnQue(biasTile);
                biasTile = biasQueue.DeQue<float>();
            }
            const bool hold = DotTiles::OneTile(k);
            if (hold) {
                dots.Hold(weightGm[n0], n, k, cols);
            }
            for (uint32_t row = 0; row < m; ++row) {
                Compute(row, n0, cols, biasTile);
                CopyOut(row, n0, cols);
            }
            if (hold) {
                dots.Release();
            }
            if (hasBias) {
                biasQueue.FreeTensor(biasTile);
            }
        }
    }

private:
    // y[row, n0 .. n0 + cols) into the out queue: the dots (CopyIn of the weight tiles is DotTiles'),
    // then + bias.
    __aicore__ inline void Compute(uint32_t row, uint32_t n0, uint32_t cols, const LocalTensor<float>& biasTile)
    {
        const uint64_t rowStart = static_cast<uint64_t>(row) * k;
        LocalTensor<float> y = yQueue.AllocTensor<float>();
        dots.Dots([&](uint32_t j) { return xGm.GetValue(rowStart + j); }, weightGm[n0], n, k, cols, y);
        if (hasBias) {
            AscendC::Add(y, y, biasTile, RoundUp(cols, FLOATS_PER_BLOCK));
        }
        yQueue.EnQue(y);
    }

    __aicore__ inline void CopyOut(uint32_t row, uint32_t n0, uint32_t cols)
    {
        LocalTensor<float> y = yQueue.DeQue<float>();
        StoreChunk(yGm[static_cast<uint64_t>(row) * n + n0], y, cols);
        yQueue.FreeTensor(y);
    }

    AscendC::TPipe pipe;
    DotTiles dots;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> biasQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> yQueue;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> weightGm;
    AscendC::GlobalTensor<float> biasGm;
    AscendC::GlobalTensor<float> yGm;
    Range share;
    uint32_t m = 0;
    uint32_t k = 0;
    uint32_t n = 0;
    uint32_t columns = FLOATS_PER_BLOCK;
    bool hasBias = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_linear(GM_ADDR x, GM_ADDR weightT, GM_ADDR bias, GM_ADDR y,
                                                       uint32_t m, uint32_t k, uint32_t n, uint32_t hasBias)
{
    bitparity::KernelLinear op;
    op.Init(x, weightT, bias, y, m, k, n, hasBias);
    op.Process();
}
