"""Host-side launch geometry for the Triton kernels.

The reduction structure is a function of the row length only (spec 3):
W lanes (LANES, or next_pow2(n) when n <= LANES, which gives the same bits
because padding is an exact identity) and G segments of SEGMENT elements
whose partials sit in a GP = next_pow2(G) slot vector.

How many rows one program handles (BLOCK_R) is free: rows are independent
and every row-level operation acts along the lane axis only, so BLOCK_R
changes speed, never a bit.  The interpreter pays a fixed Python cost per
operation, so it takes large tiles; the GPU takes tiles of about LANES
elements (one row when the row fills the lanes).
"""

import numpy as np
import triton

from ... import spec

# Launch options of every kernel: no a*b+c may be contracted into an FMA.
LAUNCH_OPTIONS = {"enable_fp_fusion": False}

# Elements per program tile in the interpreter: large enough that numpy,
# not the per-operation Python overhead, dominates.
INTERPRETER_TILE = 1 << 16

# Products per program of a tile of dot products (attention's scores):
# each tile is one [*, *, W] product tensor and its halving tree.
INTERPRETER_PRODUCTS = 1 << 20
GPU_PRODUCTS = 4 * spec.LANES

# Leaf positions per block of the row fold (fold.py).  The interpreter pays
# per block visited, so it takes long blocks; on the GPU a block's adjacent
# tree stays in a program's registers (GPU_PRODUCTS elements: 32 positions by
# 128 columns), and each block costs one step of the stack above the blocks.
INTERPRETER_FOLD_BLOCK = 256
GPU_FOLD_BLOCK = 32

# GAE on the GPU (gae.py): rows per program of the reverse loop (one per
# thread of four warps), and columns of a delta tile: one warp wide, so the
# gathers of its search for the next counted column stay warp shuffles.
SCAN_ROWS = 128
SCAN_TILE_COLS = 32


def next_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def row_layout(n_cols):
    """(W, G, GP) for rows of n_cols elements: lanes, segments, segment slots."""
    if n_cols <= spec.LANES:
        return next_pow2(n_cols), 1, 1
    n_segments = triton.cdiv(n_cols, spec.SEGMENT)
    return spec.LANES, n_segments, next_pow2(n_segments)


def _products():
    """Products per program of a tile of dot products: the interpreter takes
    large tiles, the GPU about 32 per thread of a four-warp program."""
    return INTERPRETER_PRODUCTS if triton.knobs.runtime.interpret else GPU_PRODUCTS


def product_rows(n_rows, width):
    """Rows per program for a tile of width products per row (attention's [rows, keys, dims]); never changes a bit."""
    return min(next_pow2(n_rows), max(1, _products() // width))


def attention_tile(n_groups, n_queries, width, dim):
    """(BLOCK_G, BLOCK_Q, DV): a program's groups and queries, and the dims of its output per pass,
    for keys in chunks of width lanes; never changes a bit.  The interpreter takes every dim in
    one pass and as many rows as fit; the GPU one query and the dims that fit beside its keys."""
    rows = product_rows(n_groups * n_queries, width * next_pow2(dim))
    block_q = min(next_pow2(n_queries), rows)
    block_g = min(next_pow2(n_groups), rows // block_q)
    return block_g, block_q, min(next_pow2(dim), max(1, _products() // (rows * width)))


def fold_tile(n_rows, n_cols):
    """(B, T): leaf positions per block of the row fold (fold.py) and columns per program; never
    changes a bit (spec 29.1's tree is the same whatever the block).  The interpreter takes
    blocks of up to INTERPRETER_FOLD_BLOCK positions and the columns that fit beside them in
    INTERPRETER_TILE; the GPU blocks of GPU_FOLD_BLOCK positions by the columns that fill
    GPU_PRODUCTS elements."""
    if triton.knobs.runtime.interpret:
        block = min(next_pow2(n_rows), INTERPRETER_FOLD_BLOCK)
        return block, min(next_pow2(n_cols), INTERPRETER_TILE // block)
    block = min(next_pow2(n_rows), GPU_FOLD_BLOCK)
    return block, min(next_pow2(n_cols), GPU_PRODUCTS // block)


def block_rows(n_rows, width):
    """Rows per program for a tile [BLOCK_R, width]; never changes a bit."""
    if triton.knobs.runtime.interpret:
        return min(next_pow2(n_rows), max(1, INTERPRETER_TILE // width))
    return max(1, spec.LANES // width)


def scan_rows(n_rows):
    """Rows per program of a reverse loop along the rows (GAE's); never changes a bit.

    The interpreter pays per operation, not per element, so it takes every
    row; the GPU gives each thread of a SCAN_ROWS-thread program one row.
    """
    if triton.knobs.runtime.interpret:
        return min(next_pow2(n_rows), INTERPRETER_TILE)
    return min(next_pow2(n_rows), SCAN_ROWS)


def scan_tile(n_rows, n_cols):
    """(BLOCK_R, TC): rows and columns of a tile of GAE's delta kernel; never changes a bit."""
    if triton.knobs.runtime.interpret:
        width = min(next_pow2(n_cols), INTERPRETER_TILE)
    else:
        width = min(next_pow2(n_cols), SCAN_TILE_COLS)
    return block_rows(n_rows, width), width


def order_tile(n_rows, n_cols):
    """(BLOCK_R, W): rows and columns of a tile of topk, whose passes only compare and count.

    No sum's structure depends on W there, so it is free.  The interpreter
    takes all rows it can at LANES columns, then widens the tile up to
    INTERPRETER_TILE elements (few long rows: one wide tile); the GPU takes
    LANES columns of one row.
    """
    if triton.knobs.runtime.interpret:
        rows = min(next_pow2(n_rows), INTERPRETER_TILE // spec.LANES)
        return rows, min(next_pow2(n_cols), max(spec.LANES, INTERPRETER_TILE // rows))
    width = min(next_pow2(n_cols), spec.LANES)
    return block_rows(n_rows, width), width


def block_elements(n):
    """Elements per program for the 1-D elementwise kernels."""
    if triton.knobs.runtime.interpret:
        return min(next_pow2(n), INTERPRETER_TILE)
    return spec.LANES


def launch(kernel, n_programs, *args, **constexprs):
    """kernel[(n_programs,)](*args, **constexprs) with LAUNCH_OPTIONS; n_programs may be a
    tuple, one count per grid axis.

    In the interpreter the kernels' float32 arithmetic is numpy's, which warns
    on inf - inf, 0 * inf and the like: IEEE cases the canonical order meets
    on purpose (and resolves by selects), so those warnings are silenced.
    """
    with np.errstate(all="ignore"):
        grid = n_programs if isinstance(n_programs, tuple) else (n_programs,)
        kernel[grid](*args, **constexprs, **LAUNCH_OPTIONS)
