/* The row fold (spec 29.1) for the `cpu` backend: the order in which a
 * parameter's gradient accumulates over rows, which fold_rows.c (per segment)
 * and linear.c (weight_grad) share.  See canonical.h for why the bits cannot
 * depend on the build.
 *
 * The fold is the pairwise tree over row positions 0 .. P-1 (P the next power
 * of two >= rows), adjacent pairs level by level, absent rows -0.0.  Because
 * x + (-0.0) = x, a node with one present child is that child, so only the
 * present rows are ever added: two present subtrees A (left) and B (right) are
 * added as A + B at their lowest common ancestor, once no other present row
 * lies under it.  Visiting the present rows in increasing position with a
 * stack of folded subtrees gives exactly that tree: before row p is pushed,
 * the top two entries are added (below + top) while p lies outside the
 * smallest subtree holding both, i.e. while that subtree is complete; after the
 * last row, the entries are added from the top down.  The subtrees on the
 * stack sit at strictly decreasing levels (an entry left unadded means the
 * next row falls inside the pair's common subtree, so deeper), hence the depth
 * bound of fold_depth and the top-down order of the final adds.
 *
 * The schedule (how many adds precede each push) depends on the positions
 * only, so it is computed once and replayed on every column of the data. */

#ifndef BP_CPU_ROW_FOLD_H
#define BP_CPU_ROW_FOLD_H

#include "canonical.h"

/* Most entries the stack holds for positions in [0, rows): log2(next_pow2(rows)) + 1, one per level. */
static inline int64_t fold_depth(int64_t rows)
{
    int64_t depth = 1;
    for (int64_t p = 1; p < rows; p <<= 1)
        depth++;
    return depth;
}

/* The level of the smallest subtree holding positions a != b: the bit length of a ^ b. */
static inline int level_of(int64_t a, int64_t b)
{
    return 64 - __builtin_clzll((unsigned long long)(a ^ b));
}

/* The schedule of the row fold over m rows at strictly increasing positions pos[0:m]: adds[i] = how many
 * times the stack's top two entries are added before row i is pushed (after the last row they are added
 * until one entry is left).  Each entry is kept as one of its positions, all the subtree tests need. */
static inline void fold_schedule(const int64_t *pos, int64_t m, uint8_t *adds)
{
    int64_t stack[64];
    int64_t top = 0;
    for (int64_t i = 0; i < m; i++) {
        uint8_t n = 0;
        /* p outside the pair's common subtree: p and `below` differ at a higher level than the pair */
        while (top >= 2 && level_of(stack[top - 2], pos[i]) > level_of(stack[top - 2], stack[top - 1])) {
            top--;
            n++;
        }
        adds[i] = n;
        stack[top++] = pos[i];
    }
}

/* stack[top - 2][0:cols] = stack[top - 2] + stack[top - 1] (below + top, left + right); the stack then
 * holds top - 1 entries of cols floats. */
ALWAYS_INLINE void fold_add(float *stack, int64_t top, int64_t cols)
{
    float *below = stack + (top - 2) * cols, *upper = below + cols;
    for (int64_t c = 0; c < cols; c++)
        below[c] = below[c] + upper[c];
}

#endif /* BP_CPU_ROW_FOLD_H */
