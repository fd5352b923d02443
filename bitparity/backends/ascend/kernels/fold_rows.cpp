// fold_rows (spec 29.1) as an Ascend C kernel for Atlas A2: per segment, the row fold of its rows.
//
//   c: f32[m, f] (GM); order: int64[m], the rows of c sorted by (segment, position), and positions:
//   int64[m], their positions in that order (the host's stable sorts: integer data movement); starts:
//   int64[segments + 1], segment s's rows being order[starts[s] .. starts[s + 1]); rows: the fold's leaf
//   count (every position is below it, rows <= MAX_ROW); out: f32[segments, f].
//
// out[s, :] = the row fold of `rows` leaves holding c[order[i], :] at positions[i] for the segment's i,
// -0.0 elsewhere: RowFoldStack (row_fold.h) over the segment's rows in position order, one column tile
// of FOLD_TILE_FLOATS at a time.  A segment without rows is -0.0.  Each row's tile is loaded once
// (CopyIn) and written into the stack's top entry (Compute; CopyFloats: its bits unchanged), and the
// fold leaves the stack for the out queue (CopyOut).  Work items (segment, column tile) are spread over
// AI cores; each element is its own fold, so no bit depends on the tiles or the cores.
//
// UB budget (bytes): the stack at most 25 x 4096, c tiles 2 x 4096 (VECIN), out 2 x 4096 (VECOUT):
// at most 118,784 B of the 188,416 B (184 KB) InitBuffer may use.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"
#include "row_fold.h"

namespace bitparity {

class KernelFoldRows {
public:
    __aicore__ inline KernelFoldRows() {}

    __aicore__ inline void Init(GM_ADDR c, GM_ADDR order, GM_ADDR positions, GM_ADDR starts, GM_ADDR out,
                                uint32_t m, uint32_t f, uint32_t segments, uint32_t rows)
    {
        this->f = f;
        tiles = (f + FOLD_TILE_FLOATS - 1) / FOLD_TILE_FLOATS;
        share = ThisCoresShare(segments * tiles);
        cGm.SetGlobalBuffer((__gm__ float*)c, static_cast<uint64_t>(m) * f);
        orderGm.SetGlobalBuffer((__gm__ int64_t*)order, m);
        positionsGm.SetGlobalBuffer((__gm__ int64_t*)positions, m);
        startsGm.SetGlobalBuffer((__gm__ int64_t*)starts, segments + 1);
        outGm.SetGlobalBuffer((__gm__ float*)out, static_cast<uint64_t>(segments) * f);
        stack.Init(&pipe, rows, FOLD_TILE_FLOATS);
        pipe.InitBuffer(cQueue, BUFFER_NUM, FOLD_TILE_FLOATS * sizeof(float));
        pipe.InitBuffer(outQueue, BUFFER_NUM, FOLD_TILE_FLOATS * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t item = share.begin; item < share.end; ++item) {
            const uint32_t segment = item / tiles;
            const uint32_t col0 = item % tiles * FOLD_TILE_FLOATS;
            const uint32_t len = f - col0 < FOLD_TILE_FLOATS ? f - col0 : FOLD_TILE_FLOATS;
            const uint32_t lanes = RoundUp(len, FLOATS_PER_BLOCK);
            const uint64_t last = static_cast<uint64_t>(startsGm.GetValue(segment + 1));
            stack.Reset();
            for (uint64_t i = static_cast<uint64_t>(startsGm.GetValue(segment)); i < last; ++i) {
                CopyIn(static_cast<uint64_t>(orderGm.GetValue(i)) * f + col0, len);
                Compute(static_cast<uint32_t>(positionsGm.GetValue(i)), lanes);
            }
            CopyOut(static_cast<uint64_t>(segment) * f + col0, len, lanes);
        }
    }

private:
    __aicore__ inline void CopyIn(uint64_t offset, uint32_t len)
    {
        LocalTensor<float> tile = cQueue.AllocTensor<float>();
        LoadChunk(tile, cGm[offset], len);
        cQueue.EnQue(tile);
    }

    // The leaf at `position`: the stack closes what it completes, then the tile becomes the top entry.
    __aicore__ inline void Compute(uint32_t position, uint32_t lanes)
    {
        LocalTensor<float> tile = cQueue.DeQue<float>();
        CopyFloats(stack.Push(position, lanes), tile, lanes);
        cQueue.FreeTensor(tile);
    }

    // The segment's fold, or -0.0 for a segment without rows.
    __aicore__ inline void CopyOut(uint64_t offset, uint32_t len, uint32_t lanes)
    {
        LocalTensor<float> out = outQueue.AllocTensor<float>();
        if (stack.Empty()) {
            AscendC::Duplicate(out, NegZero(), lanes);
        } else {
            CopyFloats(out, stack.Finish(lanes), lanes);
        }
        outQueue.EnQue(out);
        out = outQueue.DeQue<float>();
        StoreChunk(outGm[offset], out, len);
        outQueue.FreeTensor(out);
    }

    AscendC::TPipe pipe;
    RowFoldStack stack;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> cQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue;
    AscendC::GlobalTensor<float> cGm;
    AscendC::GlobalTensor<int64_t> orderGm;
    AscendC::GlobalTensor<int64_t> positionsGm;
    AscendC::GlobalTensor<int64_t> startsGm;
    AscendC::GlobalTensor<float> outGm;
    Range share;
    uint32_t f = 0;
    uint32_t tiles = 1;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_fold_rows(GM_ADDR c, GM_ADDR order, GM_ADDR positions, GM_ADDR starts,
                                                          GM_ADDR out, uint32_t m, uint32_t f, uint32_t segments,
                                                          uint32_t rows)
{
    bitparity::KernelFoldRows op;
    op.Init(c, order, positions, starts, out, m, f, segments, rows);
    op.Process();
}
