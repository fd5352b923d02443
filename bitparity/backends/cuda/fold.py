"""fold_rows: the row fold of spec 29.1, as canonical.fold_rows, and the pieces weight_grad (linear.py) shares.

The row fold of a segment is the pairwise adjacent tree over `rows` leaf
positions, c[i] at positions[i] and -0.0 elsewhere.  Because x + (-0.0) == x
for every x, a subtree without rows is -0.0 and its sibling passes through
unchanged, so only blocks that hold rows are ever visited:

1. Blocks.  The leaf positions fall into aligned blocks of B = 2**b positions
   (layout.fold_tile).  A block's partial is the adjacent tree of its B slots
   (a_i = a_{2i} + a_{2i+1}, level by level, -0.0 in the empty slots): the
   tree's node at level b, index j = position >> b.
2. Above the blocks, a stack over the block indices j in increasing order.
   Two consecutive blocks j1 < j2 meet at the node of level
   top = bitlen(j1 ^ j2) - 1 above the blocks.  The pending entries of the
   stack each wait at such a meeting level, all different; before the entry
   ending at j1 (the carry) waits at level top, the pending entries of the
   levels below top have met it: carry = entry + carry, lowest level first
   (the left subtree + the right one).  After the last block the pending
   entries meet the carry the same way, lowest level first.  This is the
   reference's level-by-level tree with the passed-through nodes skipped.

The host (``row_blocks``) sorts the rows by (segment, position) and lists the
blocks that hold rows, with a table of the row at each of their slots: exact
integer work in torch.  One program folds one segment's blocks for a tile of
columns; the stack is one [T, LP] tile (a slot per level), its pending levels
a bitmask, and a pending entry is read by selecting its slot (-0.0 elsewhere)
and adding the slots up, which is exact.
"""

import torch
import triton
import triton.language as tl

from .canonical import log2, neg_zeros, tree_sum
from .layout import fold_tile, launch, next_pow2


def row_blocks(segments, positions, rows, block):
    """The blocks of `block` leaf positions that hold rows, in (segment, position) order:
    (table int64 [n_blocks * block]: the row at each slot, -1 where none; indices int64 [n_blocks]:
    each block's position >> log2(block); block_segments int64 [n_blocks]: each block's segment;
    levels: the meeting levels above the blocks, log2(next_pow2(rows) / block), or 1 (a stack slot
    that stays empty) when one block covers the rows)."""
    shift = block.bit_length() - 1
    order = torch.argsort(segments * next_pow2(rows) + positions)
    seg, index = segments[order], positions[order] >> shift
    starts = torch.ones(order.numel(), dtype=torch.bool, device=order.device)
    starts[1:] = (seg[1:] != seg[:-1]) | (index[1:] != index[:-1])
    rank = torch.cumsum(starts, 0) - 1                                  # each row's block
    table = torch.full((int(starts.sum()) * block,), -1, dtype=torch.int64, device=order.device)
    table[rank * block + (positions[order] & (block - 1))] = order
    return table, index[starts], seg[starts], max(1, next_pow2(rows).bit_length() - 1 - shift)


@triton.jit
def _pairs(x):
    # x: [B, T] -> (x[0::2], x[1::2]), each [B/2, T].  [B, T] -> [B/2, 2, T] puts
    # rows 2i and 2i + 1 at [i, 0] and [i, 1]; moving that axis last lets tl.split take them.
    H: tl.constexpr = x.shape[0] // 2
    T: tl.constexpr = x.shape[1]
    return tl.split(tl.permute(tl.reshape(x, (H, 2, T)), (0, 2, 1)))


@triton.jit
def adjacent_tree(x):
    # x: [B, T], B a power of two -> [T]: a_i = a_{2i} + a_{2i+1} over axis 0,
    # level by level (spec 29.1).
    for _ in tl.static_range(log2(x.shape[0])):
        even, odd = _pairs(x)
        x = even + odd
    return tl.reshape(x, (x.shape[1],))


@triton.jit
def _merge(carry, stack, level_bits, levels):
    # carry: [T]; stack: [T, LP]; level_bits = 1 << arange(LP); levels: a
    # bitmask of pending levels -> carry with each of their entries added on
    # its left, lowest level first: carry = stack[:, l] + carry.
    while levels != 0:
        low = levels & (0 - levels)                                     # the lowest pending level's bit
        entry = tree_sum(tl.where(level_bits[None, :] == low, stack, neg_zeros(())))    # [T], exactly stack[:, l]
        carry = entry + carry
        levels = levels ^ low
    return carry


@triton.jit
def fold(load_block, block_args, table_ptr, indices_ptr, first, last,
         B: tl.constexpr, T: tl.constexpr, LP: tl.constexpr):
    # -> [T]: the row fold (spec 29.1) of blocks first .. last - 1 of one
    # segment, in position order.  load_block(block_args, rows) gives, for rows
    # [B] (the row at each slot, -1 where none), the leaves [B, T], -0.0 at the
    # empty slots.  indices: each block's position >> log2(B).
    slots = tl.arange(0, B)
    level_bits = tl.full((LP,), 1, tl.int64) << tl.arange(0, LP).to(tl.int64)     # [LP]
    carry = neg_zeros((T,))                                             # -0.0: a segment without blocks
    stack = neg_zeros((T, LP))                                          # [T, LP]
    pending = tl.full((), 0, tl.int64)
    previous = tl.full((), 0, tl.int64)
    for i in range(first, last):
        partial = adjacent_tree(load_block(block_args, tl.load(table_ptr + i * B + slots)))     # [T]
        index = tl.load(indices_ptr + i)
        if i > first:
            # The carry meets this block at level top = bitlen(previous ^ index) - 1:
            # spread the highest bit of the xor down, keep it alone.
            meet = previous ^ index
            meet = meet | (meet >> 1)
            meet = meet | (meet >> 2)
            meet = meet | (meet >> 4)
            meet = meet | (meet >> 8)
            meet = meet | (meet >> 16)
            meet = meet | (meet >> 32)
            top = meet ^ (meet >> 1)                                    # the bit of level top
            carry = _merge(carry, stack, level_bits, pending & (top - 1))
            stack = tl.where(level_bits[None, :] == top, carry[:, None], stack)
            pending = (pending & ~(top - 1)) | top
        carry = partial
        previous = index
    return _merge(carry, stack, level_bits, pending)


@triton.jit
def _rows_block(block_args, rows):
    # block_args = (c_ptr, cols, cols_ok, n_cols), cols and cols_ok [T]; rows [B]
    # -> [B, T]: c[rows, cols], -0.0 at the empty slots (and past the columns).
    c_ptr, cols, cols_ok, n_cols = block_args
    present = (rows >= 0)[:, None] & cols_ok[None, :]                   # [B, T]
    c = tl.load(c_ptr + rows[:, None] * n_cols + cols[None, :], mask=present, other=0.0)
    return tl.where(present, c, neg_zeros(()))


@triton.jit
def fold_rows_kernel(c_ptr, table_ptr, indices_ptr, first_ptr, segments_ptr, out_ptr, n_cols,
                     B: tl.constexpr, T: tl.constexpr, LP: tl.constexpr):
    # c: [M, n_cols]; table: [n_blocks, B] rows of c (-1: none); indices: [n_blocks];
    # first: [S + 1], segments: [S] for the S segments with rows, whose blocks
    # are first[s] .. first[s + 1] - 1; out: [n_segments, n_cols], -0.0 already
    # in the rows of the other segments.  Program (s, j): segment segments[s],
    # columns block j.
    s = tl.program_id(0)
    cols = tl.program_id(1) * T + tl.arange(0, T)                       # [T]
    cols_ok = cols < n_cols
    out = fold(_rows_block, (c_ptr, cols, cols_ok, n_cols), table_ptr, indices_ptr,
               tl.load(first_ptr + s), tl.load(first_ptr + s + 1), B, T, LP)
    tl.store(out_ptr + tl.load(segments_ptr + s) * n_cols + cols, out, mask=cols_ok)


def fold_rows(c, segments, positions, rows, n_segments):
    n_cols = c.shape[1]
    out = torch.full((n_segments, n_cols), -0.0, dtype=torch.float32, device=c.device)
    if c.shape[0] == 0:
        return out
    block, cols = fold_tile(rows, n_cols)
    table, indices, block_segments, levels = row_blocks(segments, positions, rows, block)
    segment_ids, counts = torch.unique_consecutive(block_segments, return_counts=True)
    first = torch.zeros(segment_ids.numel() + 1, dtype=torch.int64, device=c.device)
    first[1:] = torch.cumsum(counts, 0)
    launch(fold_rows_kernel, (segment_ids.numel(), triton.cdiv(n_cols, cols)),
           c, table, indices, first, segment_ids, out, n_cols, B=block, T=cols, LP=next_pow2(levels))
    return out
