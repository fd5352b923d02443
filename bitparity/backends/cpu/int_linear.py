"""linear (spec 24.1) on the `cpu` backend: linear.c quantises the rows into int8 digit slices (five for x's 39
bits, four for the weight's 29) and rounds the exact sum once. Where the CPU has AVX-512 VNNI, one C call
(bp_linear_fused) forms the 20 slice products in registers and rounds each output in the same pass (fused_linear;
the weight's digit panels cached in WEIGHTS). Elsewhere the 20 slice products are one int8 GEMM: torch._int_mm
(oneDNN) where a probe at first use proved it exact on the running CPU, else linear.c's bp_int8_gemm, and
bp_linear_round rounds their int32 partials. All three are exact integer sums: the same bits.

oneDNN's exactness depends on the ISA it dispatches to: without VNNI its u8 x s8 pair sums saturate at int16
(127 * 127 * 2 gives 255), so every process proves it again (docs/benchmarks.md, notes on issue 24).
"""

import collections
import ctypes
import functools
import threading

import numpy as np
import torch

from ... import spec

# |d d'| <= 2^14 for int8 digits, so up to 131071 products sum exactly in int32 in any order, saturating or
# wrapping; longer rows are cut into chunks whose int32 sums linear.c adds in 128 bits.
CHUNK_K = 131071
# Rows of x per pass, so the [20 pairs, rows, n] int32 partials stay near this many bytes (but never so few that a
# pass's GEMM falls below INT_MM_MIN_ROWS: at n = 32768 a 64 MiB pass held 25 rows, which ran 5x slower in C).
PARTIAL_BYTES = 256 << 20
_OFFSET = (spec.LINEAR_BX - 2) + (spec.LINEAR_BW - 2)


def slices(bits):
    """Balanced int8 digits needed for a B-bit Q: s digits hold |Q| <= 127 (256^s - 1) / 255, B <= 8 s - 1."""
    return (bits + 8) // 8


X_SLICES, W_SLICES = slices(spec.LINEAR_BX), slices(spec.LINEAR_BW)


def _int_mm(a, b):
    """a [M, K], b [N, K] int8 -> a b^T int32 [M, N] by torch._int_mm. For K = 1, b.t() has strides (1, 1),
    which .contiguous() keeps and _int_mm misreads (uninitialised output for N >= 2): reshape gives (N, 1)."""
    bt = b.reshape(1, b.shape[0]) if b.shape[1] == 1 else b.t()
    return torch._int_mm(a, bt)


@functools.cache
def int_mm_is_exact():
    """Whether torch._int_mm gives the exact int32 products here: digits at -128 and 127 (the largest
    products, summing to within 2^14 of the int32 bound at K = CHUNK_K), alternating signs, and random digits
    against binary64 products of the same integers (exact: every sum is below 2^31), for K = 1 ... CHUNK_K and
    the layouts linear uses (a contiguous, b transposed; M = 1; K = 1)."""
    rng = np.random.default_rng(0)
    for m, n, k in ((1, 1, 1), (3, 5, 1), (1, 7, 2), (5, 3, 3), (17, 9, 33), (64, 48, 4096), (2, 3, CHUNK_K)):
        for fill in ("low", "high", "mixed", "random"):
            if fill == "low":
                a, b = np.full((m, k), -128), np.full((n, k), -128)
            elif fill == "high":
                a, b = np.full((m, k), 127), np.full((n, k), -128)
            elif fill == "mixed":
                a = np.resize(np.array([127, -128]), (m, k))
                b = np.resize(np.array([-128, -128, 127]), (n, k))
            else:
                a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (n, k))
            want = a.astype(np.float64) @ b.astype(np.float64).T
            try:
                got = _int_mm(torch.from_numpy(a.astype(np.int8)), torch.from_numpy(b.astype(np.int8)))
            except RuntimeError:
                return False
            if not np.array_equal(got.numpy().astype(np.float64), want):
                return False
    return True


# torch._int_mm costs milliseconds per call below this many rows of a (measured: 7 ms for [5, 64] x [256, 64]
# against 0.07 ms in C; 0.03 ms against 0.37 ms at 320 rows), so short products, the decode steps' and MoE
# experts', go to the C GEMM. Both are exact: the choice changes no bit.
INT_MM_MIN_ROWS = 128


def _gemm(lib, a, b, threads):
    """a [M, K], b [N, K] int8 -> [M, N] int32, exact for K <= CHUNK_K."""
    if a.shape[0] >= INT_MM_MIN_ROWS and int_mm_is_exact():
        return _int_mm(a, b)
    out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.int32)
    lib.bp_int8_gemm(a.data_ptr(), b.data_ptr(), a.shape[0], b.shape[0], a.shape[1], out.data_ptr(), threads)
    return out


def quantise(lib, v, bits, threads):
    """v [R, K] -> (digits int8 [slices(bits), R, K], exponent int32 [R], finite uint8 [R]) (linear.c)."""
    rows, k = v.shape
    digits = torch.empty((slices(bits), rows, k), dtype=torch.int8)
    exponent = torch.empty(rows, dtype=torch.int32)
    finite = torch.empty(rows, dtype=torch.uint8)
    lib.bp_linear_quantise(v.data_ptr(), rows, k, bits, slices(bits), digits.data_ptr(), exponent.data_ptr(),
                           finite.data_ptr(), threads)
    return digits, exponent, finite


# libc's memcmp: torch.equal took 8 ms for a [4096, 64] weight here (a loaded machine), memcmp reads it at memory speed.
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes, _memcmp.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int


def _same_bytes(a, b):
    """Whether two contiguous tensors of one shape and dtype hold the same bytes."""
    return _memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0


class WeightCache:
    """The quantised form of recently used weights: a rollout calls linear on unchanged weights thousands of
    times. A hit needs the same address and shape and the same bits as the copy kept with the entry, compared in
    full: `p.data.copy_()` changes a parameter without bumping its version counter (measured), so a key on
    `_version` would serve stale digits. Comparing reads the weight once, less work than quantising it. Entries
    (copy and digits, 8 bytes per weight) are evicted least recently used beyond `limit` bytes."""

    def __init__(self, limit):
        self.limit = limit
        self._entries = collections.OrderedDict()      # (address, shape, form) -> (bits copy, quantised)
        self._bytes = 0
        self._lock = threading.Lock()

    def quantised(self, lib, weight, threads, form=None):
        """form(lib, weight, threads) of weight, cached (default: quantise's digits with Bw bits)."""
        form = form or _weight_digits
        key, size = (weight.data_ptr(), tuple(weight.shape), form), 8 * weight.numel()
        bits = weight.view(torch.int32)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and _same_bytes(entry[0], bits):
                self._entries.move_to_end(key)
                return entry[1]
        result = form(lib, weight, threads)
        if size <= self.limit:
            with self._lock:
                old = self._entries.pop(key, None)
                self._bytes += size - (0 if old is None else size)
                self._entries[key] = (bits.clone(), result)
                while self._bytes > self.limit:
                    _, (copy, _) = self._entries.popitem(last=False)
                    self._bytes -= 2 * copy.numel() * 4
        return result


def _weight_digits(lib, weight, threads):
    return quantise(lib, weight, spec.LINEAR_BW, threads)


WEIGHTS = WeightCache(1 << 30)


@functools.cache
def vnni(lib):
    """Whether linear.c's fused AVX-512 VNNI kernel runs on this CPU (and the slices are its five and four)."""
    return bool(lib.bp_linear_vnni()) and (X_SLICES, W_SLICES) == (5, 4)


# The fused kernel's panels: 16 weight rows, k in quads (linear.c).
PANEL_ROWS = 16
# Rows of x whose packed digits (5 bytes per k) a work item keeps in cache while the weight's panels pass.
BLOCK_BYTES = 192 << 10
# Bytes past k's quads in each of x's digit rows, so that no row stride is a multiple of 4096 (linear.c).
X_PAD = 64


def pack_weight(lib, weight, threads):
    """weight [N, K] -> (packed uint8 [ceil(N/16), KP/4, 4, 16, 4], exponent int32 [N], finite uint8 [N]) for
    bp_linear_fused (linear.c), KP = K rounded up to a multiple of 4."""
    n, k = weight.shape
    kp = -(-k // 4) * 4
    packed = torch.empty((-(-n // PANEL_ROWS), kp // 4, W_SLICES, PANEL_ROWS, 4), dtype=torch.uint8)
    if n % PANEL_ROWS:
        packed[-1].zero_()                     # the last panel's padding rows: zero digits, outputs not stored
    exponent = torch.empty(n, dtype=torch.int32)
    finite = torch.empty(n, dtype=torch.uint8)
    lib.bp_linear_pack_w(weight.data_ptr(), n, k, kp, spec.LINEAR_BW, packed.data_ptr(), exponent.data_ptr(),
                         finite.data_ptr(), threads)
    return packed, exponent, finite


def fused_linear(lib, x, weight, bias, threads, cached=True):
    """linear by linear.c's fused kernel: one call that packs x's digits, forms each S in registers (no partials
    in memory) and rounds it, against the weight's panels (unsigned digits) from WEIGHTS (packed afresh without
    `cached`)."""
    (m, k), n = x.shape, weight.shape[0]
    ld = -(-k // 4) * 4 + X_PAD
    packed_w, ew, w_finite = (WEIGHTS.quantised(lib, weight, threads, pack_weight) if cached
                              else pack_weight(lib, weight, threads))
    out = torch.empty((m, n), dtype=torch.float32)
    block_rows = max(3, BLOCK_BYTES // (X_SLICES * ld) // 3 * 3)
    if lib.bp_linear_fused(x.data_ptr(), packed_w.data_ptr(), m, n, k, ld, block_rows, spec.LINEAR_BX, spec.LINEAR_BW,
                           ew.data_ptr(), w_finite.data_ptr(), weight.data_ptr(),
                           None if bias is None else bias.data_ptr(), _OFFSET, out.data_ptr(), threads):
        raise MemoryError("cpu linear: could not allocate the digits of x")
    return out


def linear(lib, x, weight, bias, threads):
    """Spec 24.1's y [M, N] for dense float32 x [M, K], weight [N, K], bias [N] or None."""
    (m, k), n = x.shape, weight.shape[0]
    if m and n and vnni(lib):
        return fused_linear(lib, x, weight, bias, threads)
    out = torch.empty((m, n), dtype=torch.float32)
    if m == 0 or n == 0:
        return out
    w_digits, ew, w_finite = WEIGHTS.quantised(lib, weight, threads)
    w_slices = w_digits.reshape(W_SLICES * n, k)
    rows = max(-(-INT_MM_MIN_ROWS // X_SLICES), PARTIAL_BYTES // (4 * X_SLICES * W_SLICES * n))
    for start in range(0, m, rows):
        xs = x[start:start + rows]
        mb = xs.shape[0]
        x_digits, ex, x_finite = quantise(lib, xs, spec.LINEAR_BX, threads)
        x_slices = x_digits.reshape(X_SLICES * mb, k)
        chunks = [_gemm(lib, x_slices[:, c:c + CHUNK_K].contiguous(), w_slices[:, c:c + CHUNK_K].contiguous(),
                        threads) for c in range(0, k, CHUNK_K)] if k > CHUNK_K else [_gemm(lib, x_slices, w_slices,
                                                                                             threads)]
        partials = torch.stack(chunks) if len(chunks) > 1 else chunks[0].contiguous()
        lib.bp_linear_round(partials.data_ptr(), len(chunks), mb, n, k, X_SLICES, W_SLICES, ex.data_ptr(),
                            ew.data_ptr(), x_finite.data_ptr(), w_finite.data_ptr(), xs.data_ptr(), weight.data_ptr(),
                            None if bias is None else bias.data_ptr(), _OFFSET, out[start:start + mb].data_ptr(),
                            threads)
    return out


def block_linear(lib, x, weight, threads):
    """The weight gradient's product of one block (spec 29.2): x [M, K], weight [N, K] with K <= LINEAR_GRAD_BLOCK,
    both fresh each block, so nothing is cached. The fused kernel where it runs (its vector rounding: 8 outputs at
    a time), else short_linear."""
    if vnni(lib) and x.shape[0] and weight.shape[0]:
        return fused_linear(lib, x, weight, None, threads, cached=False)
    return short_linear(lib, x, weight, threads)


def short_linear(lib, x, weight, threads):
    """Spec 24.1's x [M, K] . weight [N, K]^T for K <= spec.LINEAR_GRAD_BLOCK (the weight gradient's blocks), by
    two binary64 products instead of 20 int8 ones: Qx = high 2^20 + low with |high| <= 2^18 + 1 and low in
    [-2^19, 2^19), and |Qw| <= 2^28, so every product and partial sum is an integer below 2^52 and exact in
    binary64 in any order; linear.c forms S = high.Qw 2^20 + low.Qw in 128 bits and rounds it once."""
    (m, k), n = x.shape, weight.shape[0]
    if k > spec.LINEAR_GRAD_BLOCK:
        raise ValueError(f"short_linear: K = {k} exceeds {spec.LINEAR_GRAD_BLOCK}, past its binary64 exactness")
    qx, ex, x_finite = quantise_q(lib, x, spec.LINEAR_BX, threads)
    qw, ew, w_finite = quantise_q(lib, weight, spec.LINEAR_BW, threads)
    low = ((qx + (1 << 19)) & ((1 << 20) - 1)) - (1 << 19)
    high = ((qx - low) >> 20).double() @ qw.double().t()
    low = low.double() @ qw.double().t()
    out = torch.empty((m, n), dtype=torch.float32)
    lib.bp_linear_round_f64(high.contiguous().data_ptr(), low.contiguous().data_ptr(), m, n, k, ex.data_ptr(),
                            ew.data_ptr(), x_finite.data_ptr(), w_finite.data_ptr(), x.data_ptr(), weight.data_ptr(),
                            _OFFSET, out.data_ptr(), threads)
    return out


def quantise_q(lib, v, bits, threads):
    """v [R, K] -> (Q int64 [R, K], exponent int32 [R], finite uint8 [R]) (linear.c)."""
    rows, k = v.shape
    q = torch.empty((rows, k), dtype=torch.int64)
    exponent = torch.empty(rows, dtype=torch.int32)
    finite = torch.empty(rows, dtype=torch.uint8)
    lib.bp_linear_quantise_q(v.data_ptr(), rows, k, bits, q.data_ptr(), exponent.data_ptr(), finite.data_ptr(),
                             threads)
    return q, exponent, finite


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {
    "bp_linear_vnni": ([], _INT),
    # w, n, k, kp, bits, packed, exponent, finite, threads
    "bp_linear_pack_w": ([_P, _I64, _I64, _I64, _INT, _P, _P, _P, _INT], None),
    # x, wp, m, n, k, ld, block_rows, bits_x, bits_w, ew, w_finite, w, bias, offset, out, threads
    "bp_linear_fused": ([_P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _P, _P, _P, _P, _INT, _P, _INT], _INT),
    # v, rows, k, bits, slices, digits, exponent, finite, threads
    "bp_linear_quantise": ([_P, _I64, _I64, _INT, _INT, _P, _P, _P, _INT], None),
    # partials, chunks, m, n, k, sx, sw, ex, ew, x_finite, w_finite, x, w, bias, offset, out, threads
    "bp_linear_round": ([_P, _I64, _I64, _I64, _I64, _INT, _INT, _P, _P, _P, _P, _P, _P, _P, _INT, _P, _INT], None),
    # a, b, m, n, k, out, threads
    "bp_int8_gemm": ([_P, _P, _I64, _I64, _I64, _P, _INT], None),
    # v, rows, k, bits, q, exponent, finite, threads
    "bp_linear_quantise_q": ([_P, _I64, _I64, _INT, _P, _P, _P, _INT], None),
    # high, low, m, n, k, ex, ew, x_finite, w_finite, x, w, offset, out, threads
    "bp_linear_round_f64": ([_P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _INT, _P, _INT], None),
}
