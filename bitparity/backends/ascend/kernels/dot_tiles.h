// Many canonical dot products at once on the Vector unit: y[n] = dot(x, w[:, n])
// for a block of columns n, in spec 3's order over k (spec 24.4: dot(a, b) is the
// canonical sum of the products a_k * b_k, each rounded once).  attention.cpp
// (scores and the weighted sum of values) is built on it; linear.cpp, since spec
// 2.0.0 an exact integer product, runs on the Cube unit instead.
//
// The operand w is read as a [K, N] row-major matrix wT (row k holds w[k, n] for
// every n; linear passes torch's weight transposed, attention passes k transposed
// and v as it is).  A block of B columns is a tile with one row per k: the product
// row k is wT[k, block] * x[k] (one Muls, x[k] a scalar), so lane j of every
// dot in the block is row j of the tile, and each step of spec 3 is one vector
// instruction over whole rows:
//   lanes: chunk c's product rows are added to the accumulator rows in chunk order
//     (chunk 0 writes them; rows past a short chunk are -0.0 or left alone, both
//     an exact identity);
//   tree:  TreeSumRows (canonical.h): rows [0, h) += rows [h, 2h);
//   segments: each segment's row 0 is a partial row, and the partial rows are
//     folded by the same tree, padded with -0.0 rows to a power of two.
// Nothing depends on B, the block or the core: every column is its own dot.
//
// Why not the Cube unit (Mmad): it accumulates a matrix product in its own order
// (fractal blocks, its own accumulator precision and internal sum order), which is
// not spec 3's sum of once-rounded products; the Vector unit's Mul and Add are
// single IEEE binary32 roundings, so the order here is exactly the spec's.
//
// UB (bytes): weight tiles 2 x 4 x tileFloats (VECIN), accumulator 4 x tileFloats,
// product rows 4 x tileFloats (K > LANES only), partial rows 4 x P x B (K > SEGMENT only).

#ifndef BITPARITY_DOT_TILES_H
#define BITPARITY_DOT_TILES_H

#include "canonical.h"
#include "tiling.h"

namespace bitparity {

class DotTiles {
public:
    // maxK: the longest dot; tileFloats: the accumulator's target size in floats.  The block width B
    // (Columns()) is tileFloats / W rounded down to a multiple of 8 but at least 8 (W the tree width of
    // maxK, LANES when maxK > LANES), and at most maxColumns rounded up to 8.
    __aicore__ inline void Init(AscendC::TPipe* pipe, uint32_t maxK, uint32_t maxColumns, uint32_t tileFloats)
    {
        RowGeometry geo = MakeRowGeometry(maxK);
        columns = tileFloats / geo.treeWidth / FLOATS_PER_BLOCK * FLOATS_PER_BLOCK;
        columns = columns < FLOATS_PER_BLOCK ? FLOATS_PER_BLOCK : columns;
        uint32_t wanted = RoundUp(maxColumns, FLOATS_PER_BLOCK);
        columns = columns < wanted ? columns : wanted;
        uint32_t tileRows = geo.chunks > 1 || geo.segments > 1 ? LANES : geo.treeWidth;
        pipe->InitBuffer(weightQueue, BUFFER_NUM, tileRows * columns * sizeof(float));
        pipe->InitBuffer(accBuf, tileRows * columns * sizeof(float));
        if (geo.chunks > 1 || geo.segments > 1) {
            pipe->InitBuffer(productBuf, LANES * columns * sizeof(float));
        }
        if (geo.segments > 1) {
            pipe->InitBuffer(partialBuf, NextPow2(geo.segments) * columns * sizeof(float));
        }
    }

    __aicore__ inline uint32_t Columns() const { return columns; }

    // Whether dots of length k read one weight tile per block, which Hold can keep for many x.
    __aicore__ inline static bool OneTile(uint32_t k) { return k <= LANES; }

    // Loads and keeps the tile of wT rows [0, k) (k <= LANES), columns [0, cols) of w (w at the
    // block's first column, row pitch `pitch` floats) for Dots calls with the same w; Release frees it.
    __aicore__ inline void Hold(const AscendC::GlobalTensor<float>& w, uint32_t pitch, uint32_t k, uint32_t cols)
    {
        CopyIn(w, pitch, k, cols);
        held = weightQueue.DeQue<float>();
        holding = true;
    }

    __aicore__ inline void Release()
    {
        weightQueue.FreeTensor(held);
        holding = false;
    }

    // out[0 .. RoundUp(cols, 8)) = dot(x, w[:, n]) for n < cols (lanes past cols hold junk).
    // xAt(k): x[k] as a scalar.  w as in Hold; if a tile is held, it must be this w with this k.
    // out: a vector-writable tensor of at least RoundUp(cols, 8) floats, not one of these buffers.
    template <typename XAt>
    __aicore__ inline void Dots(const XAt& xAt, const AscendC::GlobalTensor<float>& w, uint32_t pitch, uint32_t k,
                                uint32_t cols, const LocalTensor<float>& out)
    {
        const RowGeometry geo = MakeRowGeometry(k);
        const uint32_t bw = RoundUp(cols, FLOATS_PER_BLOCK);
        LocalTensor<float> acc = accBuf.Get<float>();
        for (uint32_t g = 0; g < geo.segments; ++g) {
            for (uint32_t c = 0; c < geo.DataChunks(g); ++c) {
                const uint32_t k0 = static_cast<uint32_t>(geo.ChunkStart(g, c));
                const uint32_t len = k - k0 < LANES ? k - k0 : LANES;
                LocalTensor<float> tile = held;
                if (!holding) {
                    CopyIn(w[static_cast<uint64_t>(k0) * pitch], pitch, len, cols);
                    tile = weightQueue.DeQue<float>();
                }
                // Chunk 0 writes the accumulator rows; later chunks add theirs (rows past len: + -0.0).
                LocalTensor<float> rows = c == 0 ? acc : productBuf.Get<float>();
                for (uint32_t j = 0; j < len; ++j) {
                    AscendC::Muls(rows[j * bw], tile[j * bw], xAt(k0 + j), bw);
                }
                if (c == 0 && len < geo.treeWidth) {
                    AscendC::Duplicate(acc[len * bw], NegZero(), (geo.treeWidth - len) * bw);
                } else if (c > 0) {
                    AscendC::Add(acc, acc, rows, len * bw);
                }
                if (!holding) {
                    weightQueue.FreeTensor(tile);
                }
            }
            TreeSumRows(acc, geo.treeWidth, bw);
            if (geo.segments > 1) {
                CopyFloats(partialBuf.Get<float>()[g * bw], acc, bw);
            }
        }
        if (geo.segments > 1) {
            LocalTensor<float> partials = partialBuf.Get<float>();
            const uint32_t p = NextPow2(geo.segments);
            if (p > geo.segments) {
                AscendC::Duplicate(partials[geo.segments * bw], NegZero(), (p - geo.segments) * bw);
            }
            TreeSumRows(partials, p, bw);
            CopyFloats(out, partials, bw);
        } else {
            CopyFloats(out, acc, bw);
        }
    }

private:
    // GM -> UB of wT rows [0, rows), columns [0, cols): one DataCopyPad of `rows` blocks, each
    // row landing at a pitch of RoundUp(cols, 8) floats.
    __aicore__ inline void CopyIn(const AscendC::GlobalTensor<float>& w, uint32_t pitch, uint32_t rows, uint32_t cols)
    {
        LocalTensor<float> tile = weightQueue.AllocTensor<float>();
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(rows), static_cast<uint32_t>(cols * sizeof(float)),
                                        static_cast<uint32_t>((pitch - cols) * sizeof(float)), 0, 0};
        AscendC::DataCopyPadExtParams<float> pad{false, 0, 0, 0};
        AscendC::DataCopyPad(tile, w, copy, pad);
        weightQueue.EnQue(tile);
    }

    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> weightQueue;
    AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> productBuf;
    AscendC::TBuf<AscendC::TPosition::VECCALC> partialBuf;
    LocalTensor<float> held;
    uint32_t columns = FLOATS_PER_BLOCK;
    bool holding = false;
};

}  // namespace bitparity

#endif  // BITPARITY_DOT_TILES_H
