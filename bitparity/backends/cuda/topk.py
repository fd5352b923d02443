"""topk (spec 21): the first k elements of each row in spec 21's order, as canonical.topk.

topk performs no float arithmetic, so the only question is the order, and integer keys
decide it exactly.  Per row:
  1. keys = order_key(x) into a scratch row (INT32_MIN for NaN and for the padding);
  2. t = the key of the k-th largest element (canonical.kth_largest_key, exact counts),
     c_gt = #{key > t}: the elements above t are all taken, and the first need = k - c_gt
     of those equal to t, by index;
  3. one pass in index order gives each taken element a slot below k (exclusive prefix
     counts, exact) and writes its sort word (key << 32) | (INT32_MAX - index) there
     (INT32_MAX - index = index ^ INT32_MAX);
  4. a bitonic network sorts the KP = next_pow2(k) words of each row, descending: the words
     are distinct, so the sorted order is the spec's order whatever network sorts them.
On a GPU one program takes one row; step 4 holds KP words per program, which suits the
beam widths topk is used for (a k of thousands would want a merge sort through memory).
"""

import torch
import triton
import triton.language as tl

from .canonical import INT32_MIN, kth_largest_key, log2, order_key, program_rows, tree_sum
from .layout import block_rows, launch, next_pow2, order_tile

INT32_MAX: tl.constexpr = tl.constexpr((1 << 31) - 1)
INT64_MIN: tl.constexpr = tl.constexpr(-(1 << 63))


@triton.jit
def _pair_split(x, J: tl.constexpr):
    # x: [R, N] -> (the columns i with bit J of i clear, those with it set),
    # each [R, N / (2J), J]; column i and column i + J land at the same place.
    R: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    return tl.split(tl.permute(tl.reshape(x, (R, N // (2 * J), 2, J)), (0, 1, 3, 2)))


@triton.jit
def _pair_join(lo, hi):
    # The inverse of _pair_split: two [R, A, J] -> [R, 2 * A * J].
    R: tl.constexpr = lo.shape[0]
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 3, 2)), (R, 2 * lo.shape[1] * lo.shape[2]))


@triton.jit
def _inclusive_prefix_sum(x):
    # x: [R, N] integers, N a power of two -> [R, N]: x[:, 0] + ... + x[:, i]
    # in column i (exact).  Level l sees blocks of 2**l columns that already
    # hold their own prefix sums and totals; each odd block adds the total
    # of the even block before it, and the totals of the pairs are summed.
    R: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    prefix = x
    totals = x
    # (A constexpr cannot be reassigned in a static loop: block sizes stay inline.)
    for level in tl.static_range(log2(N)):
        lo, hi = _pair_split(prefix, 1 << level)                       # [R, N / 2**(l+1), 2**l] each
        t_lo, t_hi = tl.split(tl.reshape(totals, (R, N >> (level + 1), 2)))    # [R, N / 2**(l+1)] each
        prefix = _pair_join(lo, hi + t_lo[:, :, None])
        totals = t_lo + t_hi
    return prefix


@triton.jit
def _sort_descending(x):
    # x: [R, N] integers, N a power of two -> each row sorted, largest first:
    # the bitonic network, blocks of 2**stage columns sorted descending where
    # bit `stage` of their column is clear and ascending where it is set
    # (the last stage's one block descending), by compare-exchange at
    # distances J = 2**(stage - 1 - step).  In _pair_split's [R, N / 2J, J]
    # view, pair a holds columns a * 2J + j, whose bit `stage` is bit `step` of a.
    N: tl.constexpr = x.shape[1]
    for stage in tl.static_range(1, log2(N) + 1):
        for step in tl.static_range(stage):
            lo, hi = _pair_split(x, 1 << (stage - 1 - step))
            pairs = tl.arange(0, N >> (stage - step))[None, :, None]   # [1, N / 2J, 1]
            descending = ((pairs >> step) & 1) == 0
            big = tl.maximum(lo, hi)
            small = tl.minimum(lo, hi)
            x = _pair_join(tl.where(descending, big, small), tl.where(descending, small, big))
    return x


@triton.jit
def topk_kernel(x_ptr, values_ptr, indices_ptr, keys_ptr, words_ptr, n_rows, n_cols, n_padded, k,
                BLOCK_R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr):
    # x: [n_rows, n_cols]; values, indices: [n_rows, k]; keys: scratch
    # [programs * BLOCK_R, n_padded] int32; words: scratch [programs * BLOCK_R, KP] int64.
    rows, rows_ok, row_start = program_rows(n_rows, n_cols, BLOCK_R)
    lanes = tl.arange(0, W)                                             # [W]
    tile = rows.to(tl.int64)[:, None] * n_padded + lanes[None, :]       # [BLOCK_R, W]
    # Step 1: the keys, INT32_MIN outside the rows.
    for start in range(0, n_cols, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + row_start[:, None] + cols[None, :], mask=inside, other=0.0)
        tl.store(keys_ptr + tile + start, tl.where(inside, order_key(x), INT32_MIN))
    tl.debug_barrier()
    # Step 2: t and c_gt = n_above (exact counts; the padding's INT32_MIN is never above t).
    t = kth_largest_key(keys_ptr, tile, n_padded, tl.full((BLOCK_R,), k, tl.int64), BLOCK_R, W)[:, None]
    above = tl.full((BLOCK_R, W), 0, tl.int32)                          # [BLOCK_R, W]
    for start in range(0, n_padded, W):
        above += (tl.load(keys_ptr + tile + start) > t).to(tl.int32)
    n_above = tree_sum(above).to(tl.int64)[:, None]                     # [BLOCK_R, 1]
    need = k - n_above
    # Step 3, in index order: the elements above t take slots 0 .. n_above - 1
    # and the first `need` elements equal to t take n_above .. k - 1, each by
    # how many of its kind come before it (exclusive prefix counts, carried
    # across chunks).  Both counts share one int64 scan: above << 32 | tie.
    seen = tl.full((BLOCK_R, 1), 0, tl.int64)                           # [BLOCK_R, 1]: above << 32 | tie so far
    words_row = rows.to(tl.int64)[:, None] * KP                         # [BLOCK_R, 1]
    for start in range(0, n_cols, W):
        cols = start + lanes
        inside = rows_ok[:, None] & (cols < n_cols)[None, :]
        keys = tl.load(keys_ptr + tile + start).to(tl.int64)            # [BLOCK_R, W]
        is_above = inside & (keys > t)
        is_tie = inside & (keys == t)
        flags = (is_above.to(tl.int64) << 32) | is_tie.to(tl.int64)
        before = _inclusive_prefix_sum(flags) - flags + seen            # [BLOCK_R, W]
        above_before = before >> 32
        ties_before = before & 0xFFFFFFFF
        taken = is_above | (is_tie & (ties_before < need))
        slot = tl.where(is_above, above_before, n_above + ties_before)
        word = (keys << 32) | (cols ^ INT32_MAX)[None, :].to(tl.int64)
        tl.store(words_ptr + words_row + slot, word, mask=taken)
        seen += tree_sum(flags)[:, None]
    tl.debug_barrier()
    # Step 4: sort the k words (INT64_MIN, below every word, fills slots k .. KP - 1) and decode them.
    positions = tl.arange(0, KP)[None, :]                               # [1, KP]
    used = rows_ok[:, None] & (positions < k)                           # [BLOCK_R, KP]
    words = tl.load(words_ptr + words_row + positions, mask=used, other=INT64_MIN)
    words = tl.where(used, words, INT64_MIN)
    indices = (_sort_descending(words) & INT32_MAX) ^ INT32_MAX         # [BLOCK_R, KP] int64
    values = tl.load(x_ptr + row_start[:, None] + indices, mask=used, other=0.0)
    out = rows.to(tl.int64)[:, None] * k + positions                    # [BLOCK_R, KP]
    tl.store(values_ptr + out, values, mask=used)
    tl.store(indices_ptr + out, indices, mask=used)


def topk(x, k):
    n_rows, n_cols = x.shape
    rows, width = order_tile(n_rows, n_cols)
    rows = min(rows, block_rows(n_rows, next_pow2(k)))
    n_programs = triton.cdiv(n_rows, rows)
    n_padded = triton.cdiv(n_cols, width) * width
    keys = torch.empty((n_programs * rows, n_padded), dtype=torch.int32, device=x.device)
    words = torch.empty((n_programs * rows, next_pow2(k)), dtype=torch.int64, device=x.device)
    values = torch.empty((n_rows, k), dtype=torch.float32, device=x.device)
    indices = torch.empty((n_rows, k), dtype=torch.int64, device=x.device)
    launch(topk_kernel, n_programs, x, values, indices, keys, words, n_rows, n_cols, n_padded, k,
           BLOCK_R=rows, W=width, KP=next_pow2(k))
    return values, indices
