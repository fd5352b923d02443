"""linear (spec 24.1, 2.0.0): y = x @ weight.T (+ bias) as the exact integer product of fixed-point rows,
rounded once to binary32, on int8 tensor cores.

Three kernels, in this order:
  quantise_rows_kernel  per row of x (spec.LINEAR_BX bits) and of the weight (spec.LINEAR_BW bits): E = the
                        exponent of the row's largest magnitude, from the bit patterns (integer max of |bits|,
                        subnormals by bit length); Q[k] = RNE(v[k] * 2^(B-2-E)) by int64 shifts of the
                        significand; Q split into digits_for(B) balanced int8 digits, Q = sum_i d_i 256^i,
                        d_i in [-128, 127] (five for x's 39 bits, four for the weight's 29).  A row holding NaN or
                        inf is flagged and quantised to 0: its outputs are decided outside the integer path.
  digit_gemm_kernel     T_s[m, n] = sum_{i+j=s} sum_k dx_i[m, k] dw_j[n, k] for each digit weight 256^s, by
                        tl.dot on int8 with an int32 accumulator (wgmma / mma.sync .s8 on a GPU).  |d_i d_j| <=
                        2^14 and at most four pairs share a diagonal, so CHUNK_K = 8192 terms keep every int32
                        partial below 2^31 (exact in any order, saturating or wrapping alike); each chunk's
                        int32 sum is added into an int64 accumulator, so K is bounded only by int64.
  round_kernel          S = sum_s 256^s T_s, carried exactly in base 2^8 into hi * 2^56 + lo (never through
                        binary64), rounded once to nearest even at 2^(Ex + Ew - (Bx-2) - (Bw-2)), subnormal
                        results on the 2^-149 grid, overflow to inf, +0.0 for S = 0; then + bias[n] as one binary32
                        add.  Outputs whose x row or weight row holds NaN or inf take the IEEE value of the sum of
                        the products instead, from the operands' classes.

Integer addition is associative, so no tile size, split or launch order changes a bit; the only float
instruction is the bias's add.  Only builtins of triton.language are used (no tl.max, tl.zeros: jit functions
that an interpreter imported before TRITON_INTERPRET cannot run; canonical.py).
"""

import torch
import triton
import triton.language as tl

from ... import spec
from .. import linear_grad, linear_limbs
from .canonical import halves, log2
from .layout import launch, next_pow2

X_BITS, W_BITS = spec.LINEAR_BX, spec.LINEAR_BW


def digits_for(bits):
    """Balanced int8 digits that hold a quantised value of `bits` bits: s digits hold 8 s - 1."""
    return (bits + 8) // 8


X_DIGITS, W_DIGITS = digits_for(X_BITS), digits_for(W_BITS)
DIAGONALS = X_DIGITS + W_DIGITS - 1   # digit weights 256^s of the products
CHUNK_K = 8192       # K terms per int32 partial: min(X_DIGITS, W_DIGITS) * CHUNK_K * 2^14 < 2^31
MIN_DOT_K = 32       # tl.dot on int8 needs K tiles of at least 32

_F32_INF_BITS = tl.constexpr(0x7F800000)


@triton.jit
def _i64(n):
    # A scalar argument as int64 (an argument equal to 1 arrives as a constexpr, which has no .to).
    return tl.full((), 0, tl.int64) + n


@triton.jit
def _row_max(x):
    # x: [R, W] integers, W a power of two -> [R], the maximum of each row by halving (no triton.language jit
    # function such as tl.max, which cannot run in an interpreter imported before TRITON_INTERPRET was set).
    for _ in tl.static_range(log2(x.shape[1])):
        lo, hi = halves(x)
        x = tl.maximum(lo, hi)
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def _bit_length(v, STEPS: tl.constexpr):
    # v >= 0 (int32 or int64) -> the number of its significant bits (0 for 0), by binary search on shifts.
    # STEPS: 5 for int32, 6 for int64.
    n = tl.full(v.shape, 0, v.dtype)
    for step in tl.static_range(STEPS):
        s = 1 << (STEPS - 1 - step)
        high = v >> s
        big = high > 0
        v = tl.where(big, high, v)
        n += tl.where(big, s, 0)
    return n + (v > 0).to(v.dtype)


@triton.jit
def _row_exponent(amax):
    # amax: the largest |bit pattern| of a finite row (int32) -> E = floor(log2 max|v|); 0 for an all-zero row.
    field = amax >> 23
    return tl.where(field > 0, field - 127, tl.where(amax > 0, _bit_length(amax, 5) - 150, 0))


@triton.jit
def _quantise(bits, e_row, B: tl.constexpr):
    # bits: int32 patterns of finite values, e_row: their row's E (broadcast) -> Q = RNE(v * 2^(B-2-E)), int64
    # (|Q| <= 2^(B-1), B <= 62).
    a = bits & 0x7FFFFFFF
    field = a >> 23
    sig = ((a & 0x7FFFFF) | tl.where(field > 0, 0x800000, 0)).to(tl.int64)
    shift = (tl.maximum(field, 1) - 150 + (B - 2) - e_row).to(tl.int64)   # Q = RNE(sig * 2^shift); shift <= B - 2
    left = sig << tl.minimum(tl.maximum(shift, 0), 62)
    r = tl.minimum(tl.maximum(-shift, 1), 26)                  # sig < 2^24: 26 places leave 0 and below a half
    q = sig >> r
    rem = sig & ((1 << r) - 1)
    half = 1 << (r - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int64)
    q = tl.where(shift >= 0, left, q)
    return tl.where(bits < 0, -q, q)


@triton.jit
def quantise_rows_kernel(v_ptr, digits_ptr, exps_ptr, flags_ptr, n_rows, n_cols,
                         B: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # v: f32[n_rows, n_cols] read as int32 bits; digits: int8[D, n_rows, n_cols]; exps, flags: int32[n_rows].
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_ok = rows < n_rows
    base = rows.to(tl.int64)[:, None] * n_cols
    amax = tl.full((BLOCK_R,), 0, tl.int32)
    for c0 in range(0, n_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        ok = rows_ok[:, None] & (cols < n_cols)[None, :]
        bits = tl.load(v_ptr + base + cols[None, :], mask=ok, other=0)
        amax = tl.maximum(amax, _row_max(bits & 0x7FFFFFFF))
    special = amax >= 0x7F800000                                   # NaN or +-inf somewhere in the row
    e_row = tl.where(special, 0, _row_exponent(amax))
    tl.store(exps_ptr + rows, e_row, mask=rows_ok)
    tl.store(flags_ptr + rows, special.to(tl.int32), mask=rows_ok)
    plane = _i64(n_rows) * n_cols
    for c0 in range(0, n_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        ok = rows_ok[:, None] & (cols < n_cols)[None, :]
        bits = tl.load(v_ptr + base + cols[None, :], mask=ok, other=0)
        q = tl.where(special[:, None], 0, _quantise(bits, e_row[:, None], B))           # int64
        # Balanced digits, least significant first: d = ((q + 128) mod 256) - 128, then q = (q - d) / 256 exactly.
        for i in tl.static_range(D):
            d = ((q + 128) & 255) - 128
            tl.store(digits_ptr + i * plane + base + cols[None, :], d.to(tl.int8), mask=ok)
            q = (q - d) >> 8


@triton.jit
def digit_gemm_kernel(a_ptr, b_ptr, t_ptr, n_rows, n_out, n_in,
                      DX: tl.constexpr, DW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      CHUNK: tl.constexpr):
    # a: int8[DX, n_rows, n_in] (x's digits), b: int8[DW, n_out, n_in] (the weight's);
    # t: int64[DX + DW - 1, n_rows, n_out].
    # Program (i, j, s): the tile's diagonal s, T_s = sum over digit pairs p + q = s of a_p . b_q^T.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(2)
    rows_ok = rows < n_rows
    outs_ok = outs < n_out
    a_plane = _i64(n_rows) * n_in
    b_plane = _i64(n_out) * n_in
    a_rows = rows.to(tl.int64)[:, None] * n_in
    b_outs = outs.to(tl.int64)[None, :] * n_in
    total = tl.full((BLOCK_M, BLOCK_N), 0, tl.int64)
    for k_chunk in range(0, n_in, CHUNK):
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
        for k0 in range(k_chunk, tl.minimum(k_chunk + CHUNK, n_in), BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            ks_ok = ks < n_in
            for p in tl.static_range(DX):
                q = s - p
                if (q >= 0) & (q < DW):
                    a = tl.load(a_ptr + p * a_plane + a_rows + ks[None, :], mask=rows_ok[:, None] & ks_ok[None, :],
                                other=0)                                             # [BLOCK_M, BLOCK_K]
                    b = tl.load(b_ptr + q * b_plane + b_outs + ks[:, None], mask=ks_ok[:, None] & outs_ok[None, :],
                                other=0)                                             # [BLOCK_K, BLOCK_N]
                    acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        total += acc.to(tl.int64)
    offs = s.to(tl.int64) * _i64(n_rows) * n_out + rows.to(tl.int64)[:, None] * n_out + outs[None, :]
    tl.store(t_ptr + offs, total, mask=rows_ok[:, None] & outs_ok[None, :])


@triton.jit
def _carry(t_ptr, offs, plane, sign, NDIAG: tl.constexpr):
    # sign * S = sum_s 256^s (sign * T_s) = hi * 2^56 + lo, 0 <= lo < 2^56: the low seven base-2^8 limbs
    # carried into lo, the diagonals from 256^7 up and the carry into hi (|hi| < 2^63 while K < 2^37).
    carry = tl.full(offs.shape, 0, tl.int64)
    lo = tl.full(offs.shape, 0, tl.int64)
    hi = tl.full(offs.shape, 0, tl.int64)
    for s in tl.static_range(NDIAG):
        v = sign * tl.load(t_ptr + s * plane + offs)
        if s < 7:
            v = v + carry
            lo |= (v & 255) << (8 * s)
            carry = v >> 8
        else:
            hi += v << (8 * (s - 7))
    return lo, hi + carry


@triton.jit
def _specials(x_ptr, w_ptr, rows, outs, rows_ok, outs_ok, n_in, BLOCK_K: tl.constexpr):
    # The IEEE value of sum_k x[m, k] * w[n, k] for a tile with a NaN or inf operand, from the operands' classes
    # (never from float products, which could overflow): NaN if a product is NaN (a NaN, or inf * 0) or +inf and
    # -inf products meet, else the infinite products' sign.  Returns the int32 bits.
    BM: tl.constexpr = rows.shape[0]
    BN: tl.constexpr = outs.shape[0]
    nan = tl.full((BM * BN,), 0, tl.int32)
    pos = tl.full((BM * BN,), 0, tl.int32)
    neg = tl.full((BM * BN,), 0, tl.int32)
    for k0 in range(0, n_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ks_ok = ks < n_in
        xb = tl.load(x_ptr + rows.to(tl.int64)[:, None] * n_in + ks[None, :], mask=rows_ok[:, None] & ks_ok[None, :],
                     other=0)[:, None, :]                                            # [BM, 1, BK]
        wb = tl.load(w_ptr + outs.to(tl.int64)[:, None] * n_in + ks[None, :], mask=outs_ok[:, None] & ks_ok[None, :],
                     other=0)[None, :, :]                                            # [1, BN, BK]
        xa = xb & 0x7FFFFFFF
        wa = wb & 0x7FFFFFFF
        x_inf = xa == 0x7F800000
        w_inf = wa == 0x7F800000
        is_nan = (xa > 0x7F800000) | (wa > 0x7F800000) | (x_inf & (wa == 0)) | (w_inf & (xa == 0))
        is_inf = (x_inf | w_inf) & ~is_nan
        negative = (xb ^ wb) < 0
        nan = tl.maximum(nan, _row_max(tl.reshape(is_nan.to(tl.int32), (BM * BN, BLOCK_K))))
        pos = tl.maximum(pos, _row_max(tl.reshape((is_inf & ~negative).to(tl.int32), (BM * BN, BLOCK_K))))
        neg = tl.maximum(neg, _row_max(tl.reshape((is_inf & negative).to(tl.int32), (BM * BN, BLOCK_K))))
    bits = tl.where((nan > 0) | ((pos > 0) & (neg > 0)), 0x7FC00000, tl.where(pos > 0, 0x7F800000, -8388608))
    return tl.reshape(bits, (BM, BN))


@triton.jit
def round_kernel(t_ptr, ex_ptr, ew_ptr, fx_ptr, fw_ptr, x_ptr, w_ptr, bias_ptr, out_ptr, n_rows, n_out, n_in,
                 HAS_BIAS: tl.constexpr, BX: tl.constexpr, BW: tl.constexpr, NDIAG: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # t: int64[NDIAG, n_rows, n_out]; ex, fx: int32[n_rows], ew, fw: int32[n_out] (exponents, NaN/inf flags);
    # x: f32[n_rows, n_in], w: f32[n_out, n_in] as int32 bits (specials only); out: f32[n_rows, n_out].
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ok = rows < n_rows
    outs_ok = outs < n_out
    ok = rows_ok[:, None] & outs_ok[None, :]
    plane = _i64(n_rows) * n_out
    offs = tl.where(ok, rows.to(tl.int64)[:, None] * n_out + outs[None, :], 0)
    # The sign of S from its top word, then |S| = hi * 2^56 + lo.
    _, top = _carry(t_ptr, offs, plane, tl.full(offs.shape, 1, tl.int64), NDIAG)
    negative = top < 0
    lo, hi = _carry(t_ptr, offs, plane, tl.where(negative, -1, 1).to(tl.int64), NDIAG)
    LO_BITS: tl.constexpr = 56
    # One word m with every bit that can reach the rounding: hi's bits and lo's top, lo's rest ORed into a
    # sticky bit below them (the rounding point lies at least 24 bits below |S|'s leading bit).
    t = _bit_length(hi, 6)
    sticky = ((lo & ((tl.full(lo.shape, 1, tl.int64) << t) - 1)) != 0).to(tl.int64)
    m = tl.where(t > 0, (((hi << (LO_BITS - t)) | (lo >> t)) << 1) | sticky, lo)
    scale = (tl.load(ex_ptr + rows, mask=rows_ok, other=0)[:, None]
             + tl.load(ew_ptr + outs, mask=outs_ok, other=0)[None, :]).to(tl.int64) - (BX - 2) - (BW - 2) \
        + tl.where(t > 0, t - 1, 0)                                                # |S| ~ m * 2^scale
    lead = _bit_length(m, 6) - 1
    drop = tl.maximum(lead - 23, -149 - scale)                                     # bits below the binary32 grid
    left = m << tl.minimum(tl.maximum(-drop, 0), 23)
    r = tl.minimum(tl.maximum(drop, 1), 62)
    q = m >> r
    rem = m & ((tl.full(m.shape, 1, tl.int64) << r) - 1)
    half = tl.full(m.shape, 1, tl.int64) << (r - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int64)
    q = tl.where(drop > 0, q, left)
    # q * 2^(scale + drop): scale + drop >= -149; normal q in [2^23, 2^24] (2^24: the carry into the exponent).
    bits = tl.minimum(((scale + drop + 149) << 23) + q, _F32_INF_BITS)
    bits = tl.where(m == 0, 0, bits)
    bits = tl.where(negative, bits | (-2147483648), bits).to(tl.int32)
    flagged = (tl.load(fx_ptr + rows, mask=rows_ok, other=0)[:, None]
               | tl.load(fw_ptr + outs, mask=outs_ok, other=0)[None, :])
    if tl.reshape(_row_max(tl.reshape(flagged, (1, BLOCK_M * BLOCK_N))), ()) > 0:
        special = _specials(x_ptr, w_ptr, rows, outs, rows_ok, outs_ok, n_in, BLOCK_K)
        bits = tl.where(flagged > 0, special, bits)
    y = bits.to(tl.float32, bitcast=True)
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + outs, mask=outs_ok, other=0.0)[None, :]
    tl.store(out_ptr + offs, y, mask=ok)


def _tiles(n_rows, n_out, n_in):
    """(BLOCK_M, BLOCK_N, BLOCK_K): the interpreter takes large tiles, a GPU 64 x 64 x 64 (wgmma on sm_90)."""
    if triton.knobs.runtime.interpret:
        return (min(128, max(16, next_pow2(n_rows))), min(128, max(16, next_pow2(n_out))),
                min(1024, max(MIN_DOT_K, next_pow2(n_in))))
    return 64, 64, 64


def quantise_rows(v, bits):
    """f32[R, C] -> (int8 digits [digits_for(bits), R, C], int32 exponents [R], int32 NaN/inf flags [R])."""
    n_rows, n_cols = v.shape
    digits = torch.empty((digits_for(bits), n_rows, n_cols), dtype=torch.int8, device=v.device)
    exps = torch.empty(n_rows, dtype=torch.int32, device=v.device)
    flags = torch.empty(n_rows, dtype=torch.int32, device=v.device)
    interpret = triton.knobs.runtime.interpret
    block_r = min(next_pow2(n_rows), 64) if interpret else 1
    block_c = min(next_pow2(n_cols), 4096 if interpret else 1024)
    launch(quantise_rows_kernel, triton.cdiv(n_rows, block_r), v.view(torch.int32), digits, exps, flags, n_rows,
           n_cols, B=bits, D=digits_for(bits), BLOCK_R=block_r, BLOCK_C=block_c)
    return digits, exps, flags


def _digit_planes(x, weight):
    """f32 x [M, K], weight [N, K] -> (int64 planes [DIAGONALS, M, N] with S = sum_s planes[s] 256^s, the rows'
    exponents and NaN/inf flags of x and of the weight, the launch grid and tiles): both quantisations and the int8
    tl.dot digit products, everything of spec 24.1 before the rounding."""
    n_rows, n_in = x.shape
    n_out = weight.shape[0]
    dx, ex, fx = quantise_rows(x, X_BITS)
    dw, ew, fw = quantise_rows(weight, W_BITS)
    block_m, block_n, block_k = _tiles(n_rows, n_out, n_in)
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_out, block_n))
    planes = torch.empty((DIAGONALS, n_rows, n_out), dtype=torch.int64, device=x.device)
    launch(digit_gemm_kernel, (*grid, DIAGONALS), dx, dw, planes, n_rows, n_out, n_in,
           DX=X_DIGITS, DW=W_DIGITS, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, CHUNK=CHUNK_K)
    return planes, (ex, fx), (ew, fw), grid, (block_m, block_n)


def linear(x, weight, bias):
    """x f32[M, K], weight f32[N, K], bias f32[N] or None -> f32[M, N]."""
    n_rows, n_in = x.shape
    n_out = weight.shape[0]
    partials, (ex, fx), (ew, fw), grid, (block_m, block_n) = _digit_planes(x, weight)
    out = torch.empty((n_rows, n_out), dtype=torch.float32, device=x.device)
    special_k = min(next_pow2(n_in), 64 if triton.knobs.runtime.interpret else 8)
    launch(round_kernel, grid, partials, ex, ew, fx, fw, x.view(torch.int32), weight.view(torch.int32),
           weight if bias is None else bias, out, n_rows, n_out, n_in, HAS_BIAS=bias is not None, BX=X_BITS, BW=W_BITS,
           NDIAG=DIAGONALS,
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=special_k)
    return out


def linear_exact(x, weight):
    """x f32[M, K], weight f32[N, K] -> int64 [2, M, N]: the exact S of spec 24.1 as (hi, lo) limbs (spec 31.1),
    from quantise_rows_kernel and digit_gemm_kernel's int64 diagonal planes (the int8 tl.dot), carried by
    backends/linear_limbs.py; no rounding."""
    return linear_limbs.from_planes(_digit_planes(x, weight)[0], 8)


def weight_grad(x, g, positions, rows):
    """spec 29.2: dW over blocks of spec.LINEAR_GRAD_BLOCK rows, each block this backend's linear(g_b^T, x_b^T),
    row-folded (backends/linear_grad.py)."""
    return linear_grad.weight_grad(linear, x, g, positions, rows)
