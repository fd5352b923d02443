// The row fold (spec 29.1), how a parameter's gradient accumulates over rows, as a stack of
// subtrees in UB.  fold_rows.cpp and linear.cpp's weight gradient are built on it.
//
// The spec folds P = next_pow2(rows) leaves (a leaf without a row is -0.0) by adding adjacent pairs,
// level by level.  Since x + (-0.0) = x, a node with one present child is that child: only the
// present leaves matter, and a node is (left subtree) + (right subtree) exactly where both subtrees
// hold a leaf.  Two subtrees whose leaves sit at positions a < b meet at the level of the highest bit
// of a ^ b.  The leaves arrive in increasing position order; the stack holds the subtrees built so
// far, left to right, each entry a tile of floats and the position of one of its leaves.  When a leaf
// at position p arrives, the entries that meet the top below the level at which the top meets p lie in
// the top's half of that meeting, which p's arrival closes: from the top down, while
//   msb(pos[top - 1] ^ pos[top]) < msb(pos[top] ^ p):  entry top - 1 = entry top - 1 + entry top,
// then the leaf is pushed.  At the end the entries are folded from the top down the same way (each
// pair in the spec's left + right order).  The meeting levels strictly increase down the stack, so it
// holds at most bitlen(rows - 1) + 1 entries: FOLD_MAX_DEPTH = 25 for rows <= MAX_ROW = 2^24, a limit
// the host checks.  Tiles and order are independent: every element of a tile is its own fold.
//
// UB (bytes): bitlen(rows - 1) + 1 entries of 4 x tileFloats, at most 25 x 4 x tileFloats.

#ifndef BITPARITY_ROW_FOLD_H
#define BITPARITY_ROW_FOLD_H

#include "canonical.h"
#include "row_limits.h"

namespace bitparity {

constexpr uint32_t FOLD_TILE_FLOATS = 1024;   // one stack entry: the tile fold_rows and weight_grad fold

// Entries a fold over `rows` leaves needs: bitlen(rows - 1) + 1.
__aicore__ inline uint32_t FoldDepth(uint32_t rows)
{
    uint32_t depth = 1;
    for (uint32_t span = rows > 0 ? rows - 1 : 0; span > 0; span >>= 1) {
        ++depth;
    }
    return depth;
}

class RowFoldStack {
public:
    // rows: the fold's leaf count (positions lie in [0, rows)), at most MAX_ROW; tileFloats: floats per entry,
    // a multiple of 8.
    __aicore__ inline void Init(AscendC::TPipe* pipe, uint32_t rows, uint32_t tileFloats)
    {
        this->tileFloats = tileFloats;
        pipe->InitBuffer(stackBuf, FoldDepth(rows) * tileFloats * sizeof(float));
    }

    // Starts a new fold: no entries.
    __aicore__ inline void Reset() { size = 0; }

    __aicore__ inline bool Empty() const { return size == 0; }

    // Closes the subtrees a leaf at `position` completes (lanes floats of each entry), then returns the
    // new top entry, into which the caller writes the leaf's lanes.  Positions strictly increase and lie
    // below Init's rows (the contract's, which bounds the stack to FoldDepth(rows) entries).
    __aicore__ inline LocalTensor<float> Push(uint32_t position, uint32_t lanes)
    {
        while (size >= 2 && MeetsLower(positions[size - 2] ^ positions[size - 1], positions[size - 1] ^ position)) {
            MergeTop(lanes);
        }
        positions[size] = position;
        return Entry(size++);
    }

    // Folds the entries left, from the top down; returns the fold (entry 0).  Not for an Empty() stack.
    __aicore__ inline LocalTensor<float> Finish(uint32_t lanes)
    {
        while (size >= 2) {
            MergeTop(lanes);
        }
        return Entry(0);
    }

private:
    // msb(a) < msb(b), by comparisons only.
    __aicore__ inline static bool MeetsLower(uint32_t a, uint32_t b) { return a < b && a < (a ^ b); }

    __aicore__ inline LocalTensor<float> Entry(uint32_t i) { return stackBuf.Get<float>()[i * tileFloats]; }

    // entry top - 1 = entry top - 1 + entry top (left + right); the merged entry keeps the left's position.
    __aicore__ inline void MergeTop(uint32_t lanes)
    {
        LocalTensor<float> left = Entry(size - 2);
        AscendC::Add(left, left, Entry(size - 1), lanes);
        --size;
    }

    AscendC::TBuf<AscendC::TPosition::VECCALC> stackBuf;
    uint32_t positions[FOLD_MAX_DEPTH] = {};
    uint32_t size = 0;
    uint32_t tileFloats = FOLD_TILE_FLOATS;
};

}  // namespace bitparity

#endif  // BITPARITY_ROW_FOLD_H
