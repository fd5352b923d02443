// rotary (spec 24.3) as an Ascend C kernel for Atlas A2.
//
//   x: f32[rows, cols] (GM), cols even, h = cols / 2; cos, sin: f32[rows, h] (each
//   row's own); y: f32[rows, cols].
//
// Each element on its own, in the spec's order:
//   y_i = x_i * cos_i - x_{i+h} * sin_i;  y_{i+h} = x_{i+h} * cos_i + x_i * sin_i  (i < h).
// A tile is a run of rows by a run of columns c0 .. c0 + w of the half (w <= TILE_FLOATS):
// four strided DataCopyPads bring x's first halves, x's second halves, cos and sin
// into [rows][RoundUp(w, 8)] tiles (each row 32-byte aligned), so that both halves
// line up lane for lane; six vector instructions compute the tile; two strided
// DataCopyPads write the halves of y.  Lanes past w in a row are never stored.
// Tiles are spread over AI cores.
//
// UB budget (bytes): x1, x2, cos, sin 2 x 4 x 8192 (VECIN), y1, y2 2 x 2 x 8192
// (VECOUT), products 2 x 8192: 114,688 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

constexpr uint32_t ROTARY_TILE_FLOATS = 2048;
constexpr uint32_t MAX_COPY_BLOCKS = 4095;   // DataCopyPad's blockCount limit

class KernelRotary {
public:
    __aicore__ inline KernelRotary() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR y, uint32_t rows, uint32_t cols)
    {
        this->rows = rows;
        this->cols = cols;
        half = cols / 2;
        width = half < ROTARY_TILE_FLOATS ? half : ROTARY_TILE_FLOATS;
        tileRows = ROTARY_TILE_FLOATS / RoundUp(width, FLOATS_PER_BLOCK);
        tileRows = tileRows < MAX_COPY_BLOCKS ? tileRows : MAX_COPY_BLOCKS;
        columnTiles = (half + width - 1) / width;
        share = ThisCoresShare(((rows + tileRows - 1) / tileRows) * columnTiles);
        uint64_t elements = static_cast<uint64_t>(rows) * cols;
        xGm.SetGlobalBuffer((__gm__ float*)x, elements);
        cosGm.SetGlobalBuffer((__gm__ float*)cos, elements / 2);
        sinGm.SetGlobalBuffer((__gm__ float*)sin, elements / 2);
        yGm.SetGlobalBuffer((__gm__ float*)y, elements);
        pipe.InitBuffer(inQueue, BUFFER_NUM, 4 * ROTARY_TILE_FLOATS * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, 2 * ROTARY_TILE_FLOATS * sizeof(float));
        pipe.InitBuffer(productBuf, 2 * ROTARY_TILE_FLOATS * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t t = share.begin; t < share.end; ++t) {
            const uint32_t r0 = (t / columnTiles) * tileRows;
            const uint32_t c0 = (t % columnTiles) * width;
            const uint32_t n = rows - r0 < tileRows ? rows - r0 : tileRows;
            const uint32_t w = half - c0 < width ? half - c0 : width;
            CopyIn(r0, c0, n, w);
            Compute(n * RoundUp(w, FLOATS_PER_BLOCK));
            CopyOut(r0, c0, n, w);
        }
    }

private:
    // n rows of w floats from src (row pitch `pitch` floats) into dst, row pitch RoundUp(w, 8).
    __aicore__ inline void LoadRows(const LocalTensor<float>& dst, const AscendC::GlobalTensor<float>& src,
                                    uint32_t pitch, uint32_t n, uint32_t w)
    {
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(n), static_cast<uint32_t>(w * sizeof(float)),
                                        static_cast<uint32_t>((pitch - w) * sizeof(float)), 0, 0};
        AscendC::DataCopyPadExtParams<float> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(dst, src, copy, pad);
    }

    __aicore__ inline void CopyIn(uint32_t r0, uint32_t c0, uint32_t n, uint32_t w)
    {
        LocalTensor<float> in = inQueue.AllocTensor<float>();
        const uint64_t xStart = static_cast<uint64_t>(r0) * cols + c0;
        const uint64_t tableStart = static_cast<uint64_t>(r0) * half + c0;
        LoadRows(in, xGm[xStart], cols, n, w);
        LoadRows(in[ROTARY_TILE_FLOATS], xGm[xStart + half], cols, n, w);
        LoadRows(in[2 * ROTARY_TILE_FLOATS], cosGm[tableStart], half, n, w);
        LoadRows(in[3 * ROTARY_TILE_FLOATS], sinGm[tableStart], half, n, w);
        inQueue.EnQue(in);
    }

    __aicore__ inline void Compute(uint32_t count)
    {
        LocalTensor<float> in = inQueue.DeQue<float>();
        LocalTensor<float> x1 = in;
        LocalTensor<float> x2 = in[ROTARY_TILE_FLOATS];
        LocalTensor<float> c = in[2 * ROTARY_TILE_FLOATS];
        LocalTensor<float> s = in[3 * ROTARY_TILE_FLOATS];
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        LocalTensor<float> a = productBuf.Get<float>();
        LocalTensor<float> b = a[ROTARY_TILE_FLOATS];
        AscendC::Mul(a, x1, c, count);
        AscendC::Mul(b, x2, s, count);
        AscendC::Sub(out, a, b, count);                          // x1 * cos - x2 * sin
        AscendC::Mul(a, x2, c, count);
        AscendC::Mul(b, x1, s, count);
        AscendC::Add(out[ROTARY_TILE_FLOATS], a, b, count);      // x2 * cos + x1 * sin
        outQueue.EnQue(out);
        inQueue.FreeTensor(in);
    }

    __aicore__ inline void CopyOut(uint32_t r0, uint32_t c0, uint32_t n, uint32_t w)
    {
        LocalTensor<float> out = outQueue.DeQue<float>();
        const uint64_t yStart = static_cast<uint64_t>(r0) * cols + c0;
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(n), static_cast<uint32_t>(w * sizeof(float)), 0,
                                        static_cast<uint32_t>((cols - w) * sizeof(float)), 0};
        AscendC::DataCopyPad(yGm[yStart], out, copy);
        AscendC::DataCopyPad(yGm[yStart + half], out[ROTARY_TILE_FLOATS], copy);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> inQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> productBuf;
    AscendC::GlobalTensor<float> xGm;
    AscendC::GlobalTensor<float> cosGm;
    AscendC::GlobalTensor<float> sinGm;
    AscendC::GlobalTensor<float> yGm;
    Range share;
    uint32_t rows = 0;
    uint32_t cols = 0;
    uint32_t half = 0;
    uint32_t width = 0;
    uint32_t tileRows = 0;
    uint32_t columnTiles = 0;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_rotary(GM_ADDR x, GM_ADDR cos, GM_ADDR sin, GM_ADDR y, uint32_t rows,
                                                       uint32_t cols)
{
    bitparity::KernelRotary op;
    op.Init(x, cos, sin, y, rows, cols);
    op.Process();
}
