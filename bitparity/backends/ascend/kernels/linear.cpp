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
//
// Backward (spec 29.2), beside the forward: dx is linear(g, W^T) and db the weight gradient
// of a column of ones (the host's compositions), so the weight gradient is the one kernel
// (KernelWeightGrad):
//   x: f32[M, K], g: f32[M, N] (GM); positions: int64[M], strictly increasing in [0, rows);
//   dW: f32[N, K].
// dW[n, k] = the row fold (spec 29.1) over `rows` leaves of g[i, n] * x[i, k] at positions[i]
// (each product rounded once).  dW is cut into tiles of nb rows (n) by kb columns (k) of at
// most FOLD_TILE_FLOATS; for a tile, the rows i stream in order: x[i, k0 .. k0 + kb) is loaded
// (CopyIn), the leaf [n][k] = x[i, k] * g[i, n] is written straight into the fold's top entry
// by one Muls per n (g[i, n] a scalar read from GM) once RowFoldStack (row_fold.h) has closed
// the subtrees the row completes, and the tile's fold is stored (CopyOut).  The [M, N, K]
// products are never stored: a tile costs M loads of kb floats and M x nb x kb products, a
// GEMM's count.  Tiles are spread over AI cores; every element is its own fold.
// UB budget (bytes): the stack at most 25 x 4096, x tiles 2 x 1024 (VECIN), out 2 x 4096
// (VECOUT): at most 112,640 B.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "dot_tiles.h"
#include "row_fold.h"

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

// The weight gradient's tile: kb columns of k (a multiple of 8, at most WEIGHT_GRAD_COLUMNS), and as many rows
// of n as fill FOLD_TILE_FLOATS.  The host sizes its launch by the same tiles (no bit depends on them).
constexpr uint32_t WEIGHT_GRAD_COLUMNS = 256;

class KernelWeightGrad {
public:
    __aicore__ inline KernelWeightGrad() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR g, GM_ADDR positions, GM_ADDR dw, uint32_t m, uint32_t k,
                                uint32_t n, uint32_t rows)
    {
        this->m = m;
        this->k = k;
        this->n = n;
        kb = RoundUp(k, FLOATS_PER_BLOCK) < WEIGHT_GRAD_COLUMNS ? RoundUp(k, FLOATS_PER_BLOCK) : WEIGHT_GRAD_COLUMNS;
        nb = FOLD_TILE_FLOATS / kb < n ? FOLD_TILE_FLOATS / kb : n;
        kTiles = (k + kb - 1) / kb;
        share = ThisCoresShare((n + nb - 1) / nb * kTiles);
        xGm.SetGlobalBuffer((__gm__ float*)x, static_cast<uint64_t>(m) * k);
        gGm.SetGlobalBuffer((__gm__ float*)g, static_cast<uint64_t>(m) * n);
        positionsGm.SetGlobalBuffer((__gm__ int64_t*)positions, m);
        dwGm.SetGlobalBuffer((__gm__ float*)dw, static_cast<uint64_t>(n) * k);
        stack.Init(&pipe, rows, FOLD_TILE_FLOATS);
        pipe.InitBuffer(xQueue, BUFFER_NUM, kb * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, FOLD_TILE_FLOATS * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t tile = share.begin; tile < share.end; ++tile) {
            const uint32_t n0 = tile / kTiles * nb;
            const uint32_t k0 = tile % kTiles * kb;
            const uint32_t tileRows = n - n0 < nb ? n - n0 : nb;
            const uint32_t cols = k - k0 < kb ? k - k0 : kb;
            stack.Reset();
            for (uint32_t i = 0; i < m; ++i) {
                CopyIn(static_cast<uint64_t>(i) * k + k0, cols);
                Compute(i, n0, tileRows, cols);
            }
            CopyOut(n0, k0, tileRows, cols);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t cols)
    {
        LocalTensor<float> xTile = xQueue.AllocTensor<float>();
        LoadChunk(xTile, xGm[offset], cols);
        xQueue.EnQue(xTile);
    }

    // Row i's leaf [tileRows][kb]: leaf[r][j] = x[i, k0 + j] * g[i, n0 + r], rounded once, in the top entry.
    __aicore__ inline void Compute(uint32_t i, uint32_t n0, uint32_t tileRows, uint32_t cols)
    {
        LocalTensor<float> xTile = xQueue.DeQue<float>();
        const uint32_t lanes = RoundUp(cols, FLOATS_PER_BLOCK);
        LocalTensor<float> leaf = stack.Push(static_cast<uint32_t>(positionsGm.GetValue(i)), tileRows * kb);
        const uint64_t gRow = static_cast<uint64_t>(i) * n + n0;
        for (uint32_t r = 0; r < tileRows; ++r) {
            AscendC::Muls(leaf[r * kb], xTile, gGm.GetValue(gRow + r), lanes);
        }
        xQueue.FreeTensor(xTile);
    }

    // The tile's fold, rows of kb floats in UB, to dW[n0 .., k0 ..) in one strided copy.  m >= 1, so the stack
    // holds a leaf.
    __aicore__ inline void CopyOut(uint32_t n0, uint32_t k0, uint32_t tileRows, uint32_t cols)
    {
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        CopyFloats(out, stack.Finish(tileRows * kb), tileRows * kb);
        outQueue.EnQue(out);
        out = outQueue.DeQue<float>();
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(tileRows), static_cast<uint32_t>(cols * sizeof(float)),
                                        (kb - RoundUp(cols, FLOATS_PER_BLOCK)) / FLOATS_PER_BLOCK,
                                        static_cast<uint32_t>((k - cols) * sizeof(float)), 0};
        AscendC::DataCopyPad(dwGm[static_cast<uint64_t>(n0) * k + k0], out, copy);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    RowFoldStack stack;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> xQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> gGm;
    AscendC::GlobalTensor<int64_t> positionsGm;
    AscendC::GlobalTensor<float> dwGm;
    Range share;
    uint32_t m = 0;
    uint32_t k = 0;
    uint32_t n = 0;
    uint32_t kb = FLOATS_PER_BLOCK;
    uint32_t nb = 1;
    uint32_t kTiles = 1;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_linear(GM_ADDR x, GM_ADDR weightT, GM_ADDR bias, GM_ADDR y,
                                                       uint32_t m, uint32_t k, uint32_t n, uint32_t hasBias)
{
    bitparity::KernelLinear op;
    op.Init(x, weightT, bias, y, m, k, n, hasBias);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_weight_grad(GM_ADDR x, GM_ADDR g, GM_ADDR positions, GM_ADDR dw,
                                                            uint32_t m, uint32_t k, uint32_t n, uint32_t rows)
{
    bitparity::KernelWeightGrad op;
    op.Init(x, g, positions, dw, m, k, n, rows);
    op.Process();
}
