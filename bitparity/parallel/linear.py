"""The tensor-parallel linear with the bits of one process (spec 31.1, 31.2).

Column-parallel: each rank holds some of the weight's rows (output features) and computes its output columns
with the single-process linear: each output is a function of its own x row and weight row (spec 24.1), so these
are the single-process bits with no communication. Its backward's dx reduces over the sharded output features.

Row-parallel: each rank holds some of the reduction's K columns of x and of the weight. The single-process
result is S = sum over all K of Qx Qw, rounded once, with each row's quantisation exponent taken over all K.
So the ranks (1) take each row's exponent as the MAX over ranks (all_reduce MAX on int32), (2) form their exact
integer partials S_r against those exponents with their backend's own integer GEMM (`linear_exact`), (3) add
them with all_reduce SUM on two int64 limbs (exact and order-free), (4) round once (spec 24.1's round32, here in
portable torch int64), (5) give the pairs whose rows hold NaN or inf their IEEE value from per-pair flags
combined by all_reduce MAX, and (6) add the replicated bias. Only integers and maxima cross the network.

The exponents are forced on every backend's own quantisation without changing a kernel: rank r appends to its x
shard a column holding 2^Ex[m] and a zero column, and to its weight shard a zero column and a column holding
2^Ew[n]. Each appended value sets its row's largest exponent to the global one (it is at least every local
entry), and its products are exact zeros (Q times 0), so S_r is the rank's share of the single-process S.
"""

import operator

import torch
import torch.distributed as dist

from .. import autograd as _autograd
from .. import ops, spec
from ..backends import linear_limbs
from ..backends import resolve as _resolve
from ..distributed import _check_agreement, _check_tensor, _collective, _describe, _exchange, _group_size, _name

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_OFFSET = (spec.LINEAR_BX - 2) + (spec.LINEAR_BW - 2)
# A shard row without a finite nonzero entry sends this exponent to the MAX: it is below every e(v) >= -149, and
# a row that is zero on every rank keeps it and gets E = 0 (spec 24.1).
_NO_EXPONENT = -(1 << 20)
# The summed limbs stay exact and the rounding's two-limb window holds |S| < 2^92 for every K below this
# (|S| <= K 2^66; backends/linear_limbs.py).
MAX_K = 1 << 26

_ROW, _COLUMN = "parallel.row_parallel_linear", "parallel.column_parallel_linear"


def shard_range(size, world_size, rank):
    """(start, stop): rank's part of `size` items split evenly and contiguously over world_size ranks, the
    tensor-parallel split of heads, intermediate features and weight rows or columns (spec 31.1). ValueError
    unless world_size divides size."""
    for name, value in (("size", size), ("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool):
            raise TypeError(f"bitparity.parallel.shard_range: {name} must be an int; got bool")
        try:
            operator.index(value)
        except TypeError:
            raise TypeError(f"bitparity.parallel.shard_range: {name} must be an int; got "
                            f"{type(value).__name__}") from None
    size, world_size, rank = operator.index(size), operator.index(world_size), operator.index(rank)
    if world_size < 1:
        raise ValueError(f"bitparity.parallel.shard_range: world_size must be >= 1; got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"bitparity.parallel.shard_range: rank must be in [0, {world_size}); got {rank}")
    if size < 0 or size % world_size:
        raise ValueError(f"bitparity.parallel.shard_range: size must be a non-negative multiple of world_size "
                         f"{world_size}; got {size}")
    step = size // world_size
    return rank * step, (rank + 1) * step


# -- Exponents, the exact sum and the specials, on this rank's shard ------------------------------------------

def _bit_length(v):
    """int64 [...] >= 0 -> the number of significant bits (0 for 0), by shifts and compares."""
    n = torch.zeros_like(v)
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= (1 << shift)
        n = torch.where(big, n + shift, n)
        v = torch.where(big, v >> shift, v)
    return n + (v > 0).to(torch.int64)


def _row_exponents(v):
    """v f32 [R, C] -> (E int32 [R], nonfinite int32 [R]): spec 24.1's e of the row's largest finite nonzero
    magnitude, read from the bit patterns (magnitude patterns order as the values), _NO_EXPONENT for a row without
    one; and 1 where the row holds NaN or inf."""
    a = v.view(torch.int32) & 0x7FFFFFFF
    special = a >= 0x7F800000
    nonfinite = special.any(dim=1)
    top = a.masked_fill(special, 0).amax(dim=1).to(torch.int64)
    biased = top >> 23
    e = torch.where(biased > 0, biased - 127, _bit_length(top) - 150)
    e = torch.where(top == 0, _NO_EXPONENT, e)
    return e.to(torch.int32), nonfinite.to(torch.int32)


def _power_of_two(e):
    """int64 [R] in [-149, 127] -> f32 2^e exactly, from its bit pattern (normal, or subnormal below -126)."""
    normal = (e.clamp(-126, 127) + 127) << 23
    subnormal = torch.ones_like(e) << (e.clamp(-149, -127) + 149)
    return torch.where(e >= -126, normal, subnormal).to(torch.int32).view(torch.float32)


def _rne_shift(m, r):
    """m in [0, 2^63) and r >= 0 (int64) -> RNE(m / 2^r), ties to even (0 for r >= 64)."""
    s = r.clamp(1, 63)
    q = m >> s
    rem = m - (q << s)
    half = torch.ones_like(s) << (s - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)
    return torch.where(r == 0, m, torch.where(r >= 64, torch.zeros_like(q), q))


def _round(hi, lo, p):
    """(hi, lo) int64 with S = hi 2^30 + lo, 0 <= lo < 2^30, |S| < 2^92; p int64 -> binary32 nearest S 2^p, ties to
    even, on the subnormal grid below 2^-126, +-inf from 2^128 (1 - 2^-25) up, +0.0 for S = 0: spec 24.1's round32,
    the steps of reference/canonical.py's round_scaled in torch int64 (|S| cut to its top 62 bits with a sticky
    bit, one round-half-even shift, packed with its exponent)."""
    bits = linear_limbs.LIMB_BITS
    negative = hi < 0
    borrow = negative & (lo > 0)                                      # |S| = mag_hi 2^30 + mag_lo
    mag_hi = torch.where(negative, -hi - borrow.to(torch.int64), hi)
    mag_lo = torch.where(borrow, (1 << bits) - lo, torch.where(negative, torch.zeros_like(lo), lo))
    length = torch.where(mag_hi > 0, _bit_length(mag_hi) + bits, _bit_length(mag_lo))
    drop = (length - 62).clamp(min=0)                                 # <= 30 while mag_hi < 2^62
    window = (mag_hi << (bits - drop)) | (mag_lo >> drop)             # |S| >> drop, below 2^62
    sticky = ((mag_lo & ((torch.ones_like(drop) << drop) - 1)) != 0).to(torch.int64)
    r = torch.maximum(length - 24, -149 - p)                          # the result's lsb is 2^(r + p)
    shift = r - drop
    # The dropped bits enter as one sticky bit below the window: a tie can then only be a true tie.
    q = torch.where(shift <= 0, window << (-shift).clamp(0, 62),
                    _rne_shift((window << 1) | sticky, (shift + 1).clamp(min=0)))
    pattern = ((r + p + 149) << 23) + q                               # q = 2^24 carries into the exponent
    pattern = torch.where(length == 0, torch.zeros_like(pattern), pattern.clamp(max=0x7F800000))
    pattern = torch.where(negative, pattern - (1 << 31), pattern)     # the sign bit, as an int32 pattern
    return pattern.to(torch.int32).view(torch.float32)


def _special_flags(x, weight):
    """int32 [3, M, N]: whether some exact product x[m, k] weight[n, k] over this rank's k is NaN (a NaN factor or
    +-inf * +-0), +inf, -inf (spec 24.1's specials, which ranks combine with MAX, an OR). Counts of 0/1
    indicators are exact in binary64 products."""
    def count(a, b):
        return (a.to(torch.float64) @ b.to(torch.float64).t()) > 0
    ones_x, ones_w = torch.ones_like(x, dtype=torch.bool), torch.ones_like(weight, dtype=torch.bool)
    x_inf, w_inf = torch.isinf(x), torch.isinf(weight)
    nan = (count(torch.isnan(x), ones_w) | count(ones_x, torch.isnan(weight)) | count(x_inf, weight == 0)
           | count(x == 0, w_inf))
    x_pos, x_neg, w_pos, w_neg = x > 0, x < 0, weight > 0, weight < 0
    pos = (count(x_inf & x_pos, w_pos) | count(x_inf & x_neg, w_neg) | count(x_pos, w_inf & w_pos)
           | count(x_neg, w_inf & w_neg))
    neg = (count(x_inf & x_pos, w_neg) | count(x_inf & x_neg, w_pos) | count(x_pos, w_inf & w_neg)
           | count(x_neg, w_inf & w_pos))
    return torch.stack([nan, pos, neg]).to(torch.int32)


def exact_linear(op, module, x, weight, group):
    """x f32 [M, K_r], weight f32 [N, K_r]: this rank's columns of the reduction -> f32 [M, N] on every rank, spec
    24.1's linear (no bias) of the rank-order concatenations along K. Steps and collectives (spec 31.1): one
    all_reduce MAX of 2 (M + N) int32 (row exponents, non-finite flags), one all_reduce SUM of 2 M N int64 (the
    limbs of S), and, only where some row holds NaN or inf, one all_reduce MAX of 3 M N int32 (the flags)."""
    m, n = x.shape[0], weight.shape[0]
    ex, fx = _row_exponents(x)
    ew, fw = _row_exponents(weight)
    rows = torch.cat([ex, ew, fx, fw])
    _collective(op, "all_reduce (MAX) of the row exponents",
                lambda: dist.all_reduce(rows, op=dist.ReduceOp.MAX, group=group))
    e = rows[:m + n].to(torch.int64)
    e = torch.where(e == _NO_EXPONENT, 0, e)
    ex, ew = e[:m], e[m:]
    nonfinite_x, nonfinite_w = rows[m + n:2 * m + n] > 0, rows[2 * m + n:] > 0
    zx, zw = torch.zeros_like(x[:, :1]), torch.zeros_like(weight[:, :1])
    xs = torch.cat([x, _power_of_two(ex)[:, None], zx], dim=1)
    ws = torch.cat([weight, zw, _power_of_two(ew)[:, None]], dim=1)
    limbs = module.linear_exact(xs, ws)
    _collective(op, "all_reduce (SUM) of the int64 limbs of the exact partial sums",
                lambda: dist.all_reduce(limbs, op=dist.ReduceOp.SUM, group=group))
    hi, lo = linear_limbs.carry(limbs)
    out = _round(hi, lo, ex[:, None] + ew[None, :] - _OFFSET)
    if bool(nonfinite_x.any()) or bool(nonfinite_w.any()):
        flags = _special_flags(x, weight)
        _collective(op, "all_reduce (MAX) of the NaN/inf flags",
                    lambda: dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group))
        nan, pos, neg = flags > 0
        value = torch.where(nan | (pos & neg), float("nan"), torch.where(pos, float("inf"), float("-inf")))
        out = torch.where(nonfinite_x[:, None] | nonfinite_w[None, :], value.to(torch.float32), out)
    return out


# -- Autograd: spec 31.2 ---------------------------------------------------------------------------------------

def _ones(x):
    return torch.ones((x.shape[0], 1), dtype=torch.float32, device=x.device)


class _RowParallel(torch.autograd.Function):
    """y = exact_linear(x_r, W_r) + b. Backward, all local: dx_r = linear(g, W_r^T) (each x column's gradient
    reduces over N, which every rank holds), dW_r = the block rule on (x_r, g) (its slice), db = the block rule
    on g (the whole bias gradient, on every rank)."""

    @staticmethod
    def forward(ctx, module, group, x, weight, bias):
        out = exact_linear(_ROW, module, x, weight, group)
        ctx.module, ctx.has_bias = module, bias is not None
        ctx.save_for_backward(x, weight)
        return out if bias is None else out + bias[None, :]

    @staticmethod
    def backward(ctx, g):
        _autograd._refuse_double_backward(_ROW)
        x, weight = ctx.saved_tensors
        g, module, needs = _autograd._dense(g), ctx.module, ctx.needs_input_grad[2:]
        dx = module.linear(g, weight.t().contiguous(), None) if needs[0] else None
        dw = _autograd.weight_grad(module, x, g) if needs[1] else None
        db = _autograd.weight_grad(module, _ones(x), g)[:, 0] if ctx.has_bias and needs[2] else None
        return None, None, dx, dw, db


class _ColumnParallel(torch.autograd.Function):
    """y_r = linear(x, W_r) + b_r, local. Backward: dx = linear(g, W^T) reduces over N, which is sharded: the
    row-parallel exact sum of (g_r, W_r^T) over the group, the full dx on every rank; dW_r and db_r are the block
    rule on (x, g_r), local (their slices)."""

    @staticmethod
    def forward(ctx, module, group, x, weight, bias):
        ctx.module, ctx.group, ctx.has_bias = module, group, bias is not None
        ctx.save_for_backward(x, weight)
        return module.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        _autograd._refuse_double_backward(_COLUMN)
        x, weight = ctx.saved_tensors
        g, module, needs = _autograd._dense(g), ctx.module, ctx.needs_input_grad[2:]
        dx = exact_linear(_COLUMN, module, g, weight.t().contiguous(), ctx.group) if needs[0] else None
        dw = _autograd.weight_grad(module, x, g) if needs[1] else None
        db = _autograd.weight_grad(module, _ones(x), g)[:, 0] if ctx.has_bias and needs[2] else None
        return None, None, dx, dw, db


# -- The public functions: the same checks on every rank, then the op ------------------------------------------

def _check(op, group, x, weight, bias, backend, row_parallel):
    """The backend module, after every rank checked every rank's arguments in one order and raised the same
    error (spec 31.1): types, dtypes and shapes of each rank's shard, then agreement across ranks (x's shape
    (row-parallel: all but its last dimension), the weight's output features (row-parallel) or input features
    (column-parallel), dtypes, device types, whether a bias is given, the backend), then the reduction's total
    length."""
    world, _ = _group_size(op, group)
    table = _exchange(op, group, world, ([_describe(x), _describe(weight), _describe(bias)], repr(backend)))
    for rank, ((dx, dw, db), _) in enumerate(table):
        _check_tensor(op, "x", rank, dx, _FLOATS)
        _check_tensor(op, "weight", rank, dw, _FLOATS)
        x_shape, w_shape = dx[2], dw[2]
        if not x_shape or 0 in x_shape:
            raise ValueError(f"{_name(op)}: x on rank {rank} must have at least one dimension and no empty one; "
                             f"got shape {x_shape}")
        if len(w_shape) != 2 or w_shape[1] != x_shape[-1] or w_shape[0] == 0:
            raise ValueError(f"{_name(op)}: weight on rank {rank} must have shape [N, K] with N >= 1 and K = "
                             f"x.shape[-1] = {x_shape[-1]} (this rank's {'columns' if row_parallel else 'rows'}); "
                             f"got {w_shape}")
        if dw[3] != dx[3]:
            raise ValueError(f"{_name(op)}: weight on rank {rank} must be on x's device type {dx[3]}; got {dw[3]}")
        if db[0] != "NoneType":
            _check_tensor(op, "bias", rank, db, _FLOATS)
            if db[3] != dx[3]:
                raise ValueError(f"{_name(op)}: bias on rank {rank} must be on x's device type {dx[3]}; got {db[3]}")
            if db[2] != w_shape[:1]:
                raise ValueError(f"{_name(op)}: bias on rank {rank} must have shape [{w_shape[0]}] (weight's rows); "
                                 f"got {db[2]}")
    x_key = (lambda e: e[0][0][2][:-1]) if row_parallel else (lambda e: e[0][0][2])
    _check_agreement(op, "x's shape" + (" except its last dimension" if row_parallel else ""), table, x_key)
    w_dim = 0 if row_parallel else 1
    _check_agreement(op, f"weight.shape[{w_dim}]", table, lambda e: e[0][1][2][w_dim])
    _check_agreement(op, "the dtypes and device types of x and weight", table,
                     lambda e: (e[0][0][1], e[0][0][3], e[0][1][1], e[0][1][3]))
    _check_agreement(op, "bias's presence, dtype and device type", table,
                     lambda e: (e[0][2][0], e[0][2][1], e[0][2][3]))
    _check_agreement(op, "backend", table, lambda e: e[1])
    reduction = sum(e[0][1][2][1 - w_dim] for e in table)            # row: the K_r; column: the N_r
    if reduction >= MAX_K:
        raise ValueError(f"{_name(op)}: the sharded dimension totals {reduction} over the ranks; the exact sum "
                         f"needs fewer than 2^26 (spec 31.1)")
    module = _resolve(backend, x.device)
    if not hasattr(module, "linear_exact"):
        raise ValueError(f"{_name(op)}: backend {module.NAME!r} has no exact integer product; use numpy, cpu, cuda "
                         f"or ascend")
    return module


def _apply(function, module, group, x, weight, bias):
    rows = ops._dense(x.reshape(-1, x.shape[-1]).to(torch.float32))
    weight = ops._dense(weight.to(torch.float32))
    bias = None if bias is None else ops._dense(bias.to(torch.float32))
    out = function.apply(module, group, rows, weight, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def column_parallel_linear(x, weight, bias=None, *, group=None, backend=None):
    """This rank's output columns [..., N_r] of linear(x, W, b) (spec 24.1, 31.1), where W [N, K] and b [N] are
    the rank-order concatenations of every rank's weight [N_r, K] and bias [N_r] along the output features; x
    [..., K] is the same on every rank. The bits of bitparity.linear's columns; the forward is local. Float inputs
    float32, bfloat16 or float16 (upcast exactly), result float32. Differentiable (spec 31.2): dx, the full input
    gradient on every rank, is the exact sum over the ranks' output features, so every rank must run the backward;
    weight and bias get their slices of the single-process gradients."""
    module = _check(_COLUMN, group, x, weight, bias, backend, row_parallel=False)
    return _apply(_ColumnParallel, module, group, x, weight, bias)


def row_parallel_linear(x, weight, bias=None, *, group=None, backend=None):
    """linear(X, W, b) [..., N] on every rank (spec 24.1, 31.1), where X [..., K] and W [N, K] are the rank-order
    concatenations along K of every rank's x [..., K_r] and weight [N, K_r] (K_r may differ between ranks), and
    the bias [N] is the same on every rank. The bits of bitparity.linear on the whole tensors at every world size:
    row exponents are maxima over the ranks, the exact integer partials are added as int64 limbs, and the sum is
    rounded once. Float inputs float32, bfloat16 or float16 (upcast exactly), result float32. Differentiable (spec
    31.2), locally: x and weight get their slices of the single-process gradients, bias the whole one."""
    module = _check(_ROW, group, x, weight, bias, backend, row_parallel=True)
    return _apply(_RowParallel, module, group, x, weight, bias)
