"""The Ascend C kernels run in the host emulation: a test double, not an NPU.

kernels/*.cpp are compiled with g++ against emulation/kernel_operator.h (the
subset of the Ascend C API they use, with the A2 constraints enforced) and
emulation/runtime.cpp (the launch: AI cores run one after another), and called
through ctypes on CPU tensors.  Built once by backends/_build.py, cached by the
hash of sources, headers, flags and compiler.
"""

import ctypes
import threading
from pathlib import Path

import torch

from ... import spec
from .._build import build_shared_library, find_compiler

HERE = Path(__file__).resolve().parent
KERNEL_DIR = HERE / "kernels"
EMULATION_DIR = HERE / "emulation"
KERNEL_SOURCES = sorted(KERNEL_DIR.glob("*.cpp"))
KERNEL_HEADERS = sorted(KERNEL_DIR.glob("*.h"))
EMULATION_HEADER = EMULATION_DIR / "kernel_operator.h"
RUNTIME_SOURCE = EMULATION_DIR / "runtime.cpp"

# Added to _build.COMMON_FLAGS (-O2 -ffp-contract=off -fno-fast-math).  The UB is a
# byte array read as float/int32/half, so strict aliasing is off.  The dynamic
# vectoriser cost model lets gcc vectorise the element-wise loops behind runtime
# alias checks; element-wise IEEE operations give the same bits at any width.
FLAGS = ("-std=c++17", "-fno-strict-aliasing", "-fvect-cost-model=dynamic", "-Wall", "-Wextra")

# The Atlas 800T A2 (910B3) has 40 vector cores: a launch uses up to that many
# blocks.  The count changes no bit (each row is computed by one core in the
# spec's order), which the tests check by running other counts.
BLOCKS = 40

# The longest row, kernels/row_limits.h's MAX_ROW: MAX_SEGMENTS = 1024 per-segment partials in UB.
# It also keeps the float32 counts of kernels/masked.cpp exact (every count <= 2**24).
MAX_ROW = 1024 * spec.SEGMENT

# Counters per tile of kernels/sampling.cpp's philox kernel (PHILOX_TILE there).
PHILOX_TILE = 256

# kernels/row_limits.h: attention.cpp keeps a partial row of D floats per segment of keys in UB, and its
# tiles fit head dims up to 256.
ATTENTION_MAX_KEYS = 16 * spec.SEGMENT
ATTENTION_MAX_DIM = 256

# kernels/linear.cpp: balanced int8 digits per quantised value of x and of the weight (s digits hold 8 s - 1 bits),
# int32 partials per chunk of K, the Cube kernel's output tile.
LINEAR_DIGITS_X = (spec.LINEAR_BX + 8) // 8
LINEAR_DIGITS_W = (spec.LINEAR_BW + 8) // 8
LINEAR_CHUNK_K = 8192
LINEAR_TILE = 64

_U32, _F32, _P, _INT = ctypes.c_uint32, ctypes.c_float, ctypes.c_void_p, ctypes.c_int
# The softmax family: scale is f32[rows], one per row.
_SOFTMAX = [_U32, _P, _P, _P, _P, _U32, _U32, _U32]     # blocks, x, mask, scale, out, rows, cols, hasMask
_SOFTMAX_GRAD = [_U32, _P, _P, _P, _P, _P, _U32, _U32, _U32]   # blocks, x or y, mask, scale, g, out, rows, cols,
                                                               # hasMask
_SIGNATURES = {
    "bp_sum": [_U32, _P, _P, _P, _U32, _U32, _U32],
    "bp_logsumexp": _SOFTMAX,
    "bp_log_softmax": _SOFTMAX,
    "bp_softmax": _SOFTMAX,
    "bp_entropy": _SOFTMAX,
    "bp_token_logprobs": [_U32, _P, _P, _P, _P, _U32, _U32],              # blocks, x, tokens, scale, out, rows, cols
    "bp_exp": [_U32, _P, _P, _U32],
    "bp_log": [_U32, _P, _P, _U32],
    "bp_masked_mean": [_U32, _P, _P, _P, _U32, _U32, _U32],          # blocks, x, mask, out, rows, cols, hasMask
    "bp_masked_whiten": [_U32, _P, _P, _P, _U32, _U32, _U32, _U32, _F32, _U32],  # ..., shiftMean, unbiased, eps,
                                                                                 # epsMode
    "bp_kl_penalty": [_U32, _P, _P, _P, _U32, _U32, _F32, _F32],     # blocks, logp, ref, out, n, kind, clamps
    "bp_gae": [_U32, _P, _P, _P, _P, _P, _P, _U32, _U32, _F32, _F32, _U32],
    "bp_ppo_token_losses": [_U32, _P, _P, _P, _P, _P, _U32, _F32, _F32, _F32, _F32],
    "bp_philox": [_U32, _P, _P, _P, _U32],                               # blocks, counters, keys, out, n
    "bp_topk": [_U32, _P, _P, _P, _U32, _U32, _U32],                     # blocks, x, values, indices, rows, cols, k
    "bp_filter_logits": [_U32, _P, _P, _P, _P, _P, _P, _U32, _U32],      # blocks, x, scale, top_k, top_p, min_p, out,
    "bp_sample": [_U32, _P, _P, _P, _P, _P, _P, _P, _P, _P, _U32, _U32],  # ... greedy, seeds, positions, tokens
    "bp_linear": [_U32, *[_P] * 9, _U32, _U32, _U32, _U32],             # blocks, x, weight, bias, y, digitsX,
                                                                         # digitsW, metaX, metaW, t, m, k, n, hasBias
    "bp_linear_exact": [_U32, *[_P] * 7, _U32, _U32, _U32],              # blocks, x, weight, digitsX, digitsW,
                                                                         # metaX, metaW, t, m, k, n
    "bp_rms_norm": [_U32, _P, _P, _P, _U32, _U32, _F32],                 # blocks, x, weight, y, rows, cols, eps
    "bp_rotary": [_U32, _P, _P, _P, _P, _U32, _U32],                     # blocks, x, cos, sin, y, rows, cols
    "bp_attention": [_U32, _P, _P, _P, _P, _P, _U32, _U32, _U32, _U32, _U32, _F32],  # blocks, q, kT, v, kv_lengths,
                                                                         # out, groups, tq, tk, d, causal, scale
    "bp_silu_mul": [_U32, _P, _P, _P, _U32],                             # blocks, gate, up, out, n
    # Backward (spec 26)
    "bp_logsumexp_backward": _SOFTMAX_GRAD,
    "bp_log_softmax_backward": _SOFTMAX_GRAD,
    "bp_softmax_backward": _SOFTMAX_GRAD,
    "bp_entropy_backward": [_U32, _P, _P, _P, _P, _P, _P, _U32, _U32, _U32],     # blocks, x, mask, scale, h, g, out,
                                                                                 # rows, cols, hasMask
    "bp_token_logprobs_backward": [_U32, _P, _P, _P, _P, _P, _U32, _U32],        # blocks, x, tokens, scale, g, out,
                                                                                 # rows, cols
    "bp_masked_mean_backward": [_U32, _P, _P, _P, _U32, _U32],                   # blocks, mask, g, out, rows, cols
    "bp_masked_whiten_backward": [_U32, _P, _P, _P, _P, _U32, _U32, _U32, _U32, _F32, _U32],  # blocks, x, mask, g,
                                                                                 # out, rows, cols, shiftMean,
                                                                                 # unbiased, eps, epsMode
    "bp_kl_penalty_backward": [_U32, _P, _P, _P, _P, _U32, _U32, _F32, _F32],    # blocks, logp, ref, g, out, n, kind,
                                                                                 # clamps
    "bp_ppo_policy_loss_backward": [_U32, _U32, _P, _P, _P, _P, _P, _P, _P, _U32, _U32, _U32, _F32, _F32, _F32,
                                    _F32],  # weightBlocks, blocks, logp, old, adv, mask, g, weights, out, rows, cols,
                                            # agg, ratioLow, ratioHigh, dualClip, ratioClamp
    # Training (spec 29)
    "bp_fold_rows": [_U32, _P, _P, _P, _P, _P, _U32, _U32, _U32, _U32],  # blocks, c, order, positions, starts, out,
                                                                         # m, f, segments, rows
    "bp_rms_norm_backward": [_U32, _P, _P, _P, _P, _P, _U32, _U32, _F32],  # blocks, x, weight, g, dx, terms, rows,
                                                                           # cols, eps
    "bp_silu_mul_backward": [_U32, _P, _P, _P, _P, _P, _U32],           # blocks, gate, up, g, d_gate, d_up, n
    "bp_adamw_step": [_U32, *[_P] * 7, _U32, _U32, *[_F32] * 8],        # blocks, w, g, m, v, w/m/v out, n, hasDecay,
                                                                         # decay, b1, c1, b2, c2, ibc2, eps, step
    "bp_sgd_step": [_U32, *[_P] * 5, _U32, *[_F32] * 4, _U32, _U32],    # blocks, w, g, buffer, w/buffer out, n, lr,
                                                                         # momentum, 1 - dampening, weight decay,
                                                                         # nesterov, hasBuffer
    "bp_attention_backward": [_U32, _U32, *[_P] * 13, _U32, _U32, _U32, _U32, _U32, _F32],  # queryBlocks,
        # keyBlocks, q, kT, k, vT, v, qT, g, gT, kv_lengths, stats, dq, dk, dv, groups, tq, tk, d, causal, scale
}

_lock = threading.Lock()
_library = []


def compiler():
    return find_compiler("g++")


def build(name, sources):
    """Compile sources with the emulation header, the kernel headers and the runtime into a cached library."""
    if compiler() is None:
        raise RuntimeError("no g++ on PATH")
    return build_shared_library(name, compiler(), [*sources, RUNTIME_SOURCE],
                                [EMULATION_HEADER, *KERNEL_HEADERS], FLAGS)


def library():
    """The kernels' emulation library, built and loaded once per process."""
    with _lock:
        if not _library:
            lib = ctypes.CDLL(str(build("bitparity_ascend_emulation",
                                        [*KERNEL_SOURCES, EMULATION_DIR / "launch.cpp"])))
            for fname, argtypes in _SIGNATURES.items():
                getattr(lib, fname).argtypes, getattr(lib, fname).restype = argtypes, _INT
            lib.bp_emulation_last_error.restype = ctypes.c_char_p
            _library.append(lib)
    return _library[0]


def check(lib, status):
    if status != 0:
        raise RuntimeError(f"Ascend C host emulation: {lib.bp_emulation_last_error().decode()}")


def _ptr(t):
    return None if t is None else t.data_ptr()


def _dims(x):
    rows, cols = x.shape
    if rows * cols >= 2**32 or cols > MAX_ROW:
        raise ValueError(f"the Ascend C kernels take rows of at most {MAX_ROW} floats and fewer than 2**32 "
                         f"elements; got {rows} x {cols}")
    return rows, cols


def _blocks(items, blocks):
    return max(1, min(items, BLOCKS if blocks is None else blocks))


def row_op(op, x, other, scale=None, blocks=None):
    """[R, N] -> [R]: sum and masked_mean (other = mask or None: every entry counts),
    logsumexp/entropy (mask, scale f32 [R]), token_logprobs (tokens, scale f32 [R])."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, dtype=torch.float32)
    head = [_blocks(rows, blocks), x.data_ptr(), _ptr(other)]
    if op == "token_logprobs":
        args = [*head, scale.data_ptr(), out.data_ptr(), rows, cols]
    elif op in ("sum", "masked_mean"):
        args = [*head, out.data_ptr(), rows, cols, int(other is not None)]
    else:
        args = [*head, scale.data_ptr(), out.data_ptr(), rows, cols, int(other is not None)]
    check(lib, getattr(lib, f"bp_{op}")(*args))
    return out


def map_op(op, x, mask, scale, blocks=None):
    """[R, N] -> [R, N]: log_softmax, softmax; scale f32 [R]."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, getattr(lib, f"bp_{op}")(_blocks(rows, blocks), x.data_ptr(), _ptr(mask), scale.data_ptr(),
                                         out.data_ptr(), rows, cols, int(mask is not None)))
    return out


def _flat_count(x):
    n = x.numel()
    if n >= 2**32:
        raise ValueError(f"the Ascend C kernels take fewer than 2**32 elements; got {n}")
    return n


def elementwise(op, x, blocks=None):
    """[n] -> [n]: exp, log."""
    lib = library()
    n = _flat_count(x)
    out = torch.empty_like(x)
    tiles = -(-n // spec.LANES)
    check(lib, getattr(lib, f"bp_{op}")(_blocks(tiles, blocks), x.data_ptr(), out.data_ptr(), n))
    return out


# masked_whiten's eps_mode as kernels/masked.cpp's EpsMode codes.
EPS_MODE_CODES = {"add": 0, "clamp": 1}


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode, blocks=None):
    """[R, N] -> [R, N]: each row whitened over its counted entries; eps_mode an EpsMode code."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_masked_whiten(_blocks(rows, blocks), x.data_ptr(), mask.data_ptr(), out.data_ptr(), rows, cols,
                                    int(shift_mean), int(unbiased), eps, eps_mode))
    return out


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp, blocks=None):
    """[n] -> [n]; kind is kernels/kl.cpp's KlKind code, an unset clamp +inf."""
    lib = library()
    n = _flat_count(logp)
    out = torch.empty_like(logp)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_kl_penalty(_blocks(tiles, blocks), logp.data_ptr(), ref_logp.data_ptr(), out.data_ptr(), n,
                                 kind, clamp, log_ratio_clamp))
    return out


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, zero_mode, blocks=None):
    """[B, T] -> (advantages, returns), [B, T] each."""
    lib = library()
    rows, cols = _dims(rewards)
    adv = torch.empty(rows, cols, dtype=torch.float32)
    ret = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_gae(_blocks(rows, blocks), rewards.data_ptr(), values.data_ptr(), mask.data_ptr(),
                          bootstrap.data_ptr(), adv.data_ptr(), ret.data_ptr(), rows, cols, gamma, gamma_lambda,
                          int(zero_mode)))
    return adv, ret


def ppo_token_losses(logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp, blocks=None):
    """Tokens -> (loss, clipped as 1.0/0.0), each shaped like logp; an unset dual clip or clamp is +inf."""
    lib = library()
    n = _flat_count(logp)
    loss = torch.empty_like(logp)
    clipped = torch.empty_like(logp)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_ppo_token_losses(_blocks(tiles, blocks), logp.data_ptr(), old_logp.data_ptr(),
                                       advantages.data_ptr(), loss.data_ptr(), clipped.data_ptr(), n, ratio_low,
                                       ratio_high, dual_clip, ratio_clamp))
    return loss, clipped


def philox(counters, keys, blocks=None):
    """uint32 words as int32: [n, 4] counters, [n, 2] keys -> [n, 4] (spec 19)."""
    lib = library()
    n = _flat_count(counters) // 4
    out = torch.empty(n, 4, dtype=torch.int32)
    tiles = -(-n // PHILOX_TILE)
    check(lib, lib.bp_philox(_blocks(tiles, blocks), counters.data_ptr(), keys.data_ptr(), out.data_ptr(), n))
    return out


def topk(x, k, blocks=None):
    """[R, N] -> (values f32 [R, k], indices int64 [R, k]) in spec 21's order."""
    lib = library()
    rows, cols = _dims(x)
    values = torch.empty(rows, k, dtype=torch.float32)
    indices = torch.empty(rows, k, dtype=torch.int64)
    check(lib, lib.bp_topk(_blocks(rows, blocks), x.data_ptr(), values.data_ptr(), indices.data_ptr(), rows, cols, k))
    return values, indices


def filter_logits(x, scale, top_k, top_p, min_p, blocks=None):
    """[R, V] -> [R, V]; per-row scale f32, top_k int64, top_p f32, min_p f32 (spec 21)."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_filter_logits(_blocks(rows, blocks), x.data_ptr(), scale.data_ptr(), top_k.data_ptr(),
                                    top_p.data_ptr(), min_p.data_ptr(), out.data_ptr(), rows, cols))
    return out


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions, blocks=None):
    """[R, V] -> int64 [R] tokens (spec 22); per-row parameters as filter_logits, plus greedy bool,
    seeds and positions int64."""
    lib = library()
    rows, cols = _dims(x)
    tokens = torch.empty(rows, dtype=torch.int64)
    check(lib, lib.bp_sample(_blocks(rows, blocks), x.data_ptr(), scale.data_ptr(), top_k.data_ptr(),
                             top_p.data_ptr(), min_p.data_ptr(), greedy.data_ptr(), seeds.data_ptr(),
                             positions.data_ptr(), tokens.data_ptr(), rows, cols))
    return tokens


def _tree_width(k):
    return min(1 << max(0, (k - 1).bit_length()), spec.LANES)


def _linear_workspaces(m, k, n):
    """kernels/linear.cpp's GM workspaces for x [M, K] and weight [N, K]: (digits of x and of the weight, their
    exponents and flags, the Cube unit's int32 partials [chunks, 8, mPad, nPad], the tiles the launches spread)."""
    m_pad, n_pad, k_pad = -(-m // 16) * 16, -(-n // 16) * 16, -(-k // 32) * 32
    chunks = -(-k_pad // LINEAR_CHUNK_K)
    diagonals = LINEAR_DIGITS_X + LINEAR_DIGITS_W - 1
    if max(m_pad, n_pad) * k_pad * LINEAR_DIGITS_X >= 2**32 or chunks * diagonals * m_pad * n_pad >= 2**32:
        raise ValueError(f"the Ascend C linear takes operands of fewer than 2**32 digits; got x {m} x {k}, weight "
                         f"{n} x {k}")
    digits_x = torch.empty(LINEAR_DIGITS_X * m_pad * k_pad, dtype=torch.int8)
    digits_w = torch.empty(LINEAR_DIGITS_W * n_pad * k_pad, dtype=torch.int8)
    meta_x = torch.empty(m_pad, 8, dtype=torch.int32)
    meta_w = torch.empty(n_pad, 8, dtype=torch.int32)
    partials = torch.empty(chunks, diagonals, m_pad, n_pad, dtype=torch.int32)
    tiles = -(-m_pad // LINEAR_TILE) * -(-n_pad // LINEAR_TILE) * diagonals * chunks
    return digits_x, digits_w, meta_x, meta_w, partials, max(tiles, m_pad, n_pad)


def linear(x, weight, bias, blocks=None):
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] (spec 24.1): kernels/linear.cpp's four launches, with
    their GM workspaces (digits, exponents and flags of both operands, the Cube unit's int32 partials)."""
    lib = library()
    (m, k), n = x.shape, weight.shape[0]
    digits_x, digits_w, meta_x, meta_w, partials, tiles = _linear_workspaces(m, k, n)
    y = torch.empty(m, n, dtype=torch.float32)
    check(lib, lib.bp_linear(_blocks(tiles, blocks), x.data_ptr(), weight.data_ptr(), _ptr(bias), y.data_ptr(),
                             digits_x.data_ptr(), digits_w.data_ptr(), meta_x.data_ptr(), meta_w.data_ptr(),
                             partials.data_ptr(), m, k, n, int(bias is not None)))
    return y


def linear_exact(x, weight, blocks=None):
    """x [M, K], weight [N, K] -> the Cube unit's int32 partials [chunks, 8, mPad, nPad] of spec 24.1's exact S (per
    chunk of K and digit weight 256^s), from kernels/linear.cpp's quantise and Cube launches without the rounding
    (bp_linear_exact; the tensor-parallel linear's partial, spec 31.1)."""
    lib = library()
    (m, k), n = x.shape, weight.shape[0]
    digits_x, digits_w, meta_x, meta_w, partials, tiles = _linear_workspaces(m, k, n)
    check(lib, lib.bp_linear_exact(_blocks(tiles, blocks), x.data_ptr(), weight.data_ptr(), digits_x.data_ptr(),
                                   digits_w.data_ptr(), meta_x.data_ptr(), meta_w.data_ptr(), partials.data_ptr(), m,
                                   k, n))
    return partials


def rms_norm(x, weight, eps, blocks=None):
    """[R, D], weight [D] -> [R, D]."""
    lib = library()
    rows, cols = _dims(x)
    y = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_rms_norm(_blocks(rows, blocks), x.data_ptr(), weight.data_ptr(), y.data_ptr(), rows, cols, eps))
    return y


def rotary(x, cos, sin, blocks=None):
    """[R, D], cos and sin [R, D/2] -> [R, D].  Launched on as many cores as there are rows (the kernel
    tiles rows and columns; a core without a tile does nothing)."""
    lib = library()
    rows, cols = _dims(x)
    y = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_rotary(_blocks(rows, blocks), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                             rows, cols))
    return y


def attention(q, k, v, kv_lengths, causal, scale, blocks=None):
    """q [G, Tq, D], k and v [G, Tk, D], kv_lengths int64 [G] -> [G, Tq, D].  The kernel reads k as
    [G, D, Tk]: the transpose here is a copy (no arithmetic)."""
    lib = library()
    groups, tq, d = q.shape
    tk = k.shape[1]
    if tk > ATTENTION_MAX_KEYS or d > ATTENTION_MAX_DIM:
        raise ValueError(f"the Ascend C attention kernel takes at most {ATTENTION_MAX_KEYS} keys (16 segments of "
                         f"{spec.SEGMENT}: it keeps one partial row per segment in UB) and head dimensions of at "
                         f"most {ATTENTION_MAX_DIM} (its tiles' UB); got Tk = {tk}, D = {d}")
    if groups * max(tq, tk) * d >= 2**32:
        raise ValueError(f"the Ascend C kernels take fewer than 2**32 elements; got {groups} x {max(tq, tk)} x {d}")
    k_t = k.transpose(1, 2).contiguous()
    out = torch.empty(groups, tq, d, dtype=torch.float32)
    check(lib, lib.bp_attention(_blocks(groups * tq, blocks), q.data_ptr(), k_t.data_ptr(), v.data_ptr(),
                                kv_lengths.contiguous().data_ptr(), out.data_ptr(), groups, tq, tk, d,
                                int(causal), scale))
    return out


def silu_mul(gate, up, blocks=None):
    """[n] twice -> [n]."""
    lib = library()
    n = _flat_count(gate)
    out = torch.empty_like(gate)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_silu_mul(_blocks(tiles, blocks), gate.data_ptr(), up.data_ptr(), out.data_ptr(), n))
    return out


# ---- Backward (spec 26) ------------------------------------------------------------

# ops.PPO_AGGS as kernels/ppo.cpp's PpoAgg codes.
PPO_AGG_CODES = {"token-mean": 0, "seq-mean-token-sum": 1, "seq-mean-token-mean": 2, "seq-mean-token-sum-norm": 3}


def softmax_backward(op, x, other, scale, g, h=None, blocks=None):
    """[R, N] -> dx [R, N] (spec 26.2-26.6), scale f32 [R].  op: logsumexp and entropy (x, other = mask or None,
    g [R], entropy's h [R]), log_softmax and softmax (x = the forward's output, other = mask or None, g [R, N]),
    token_logprobs (x, other = tokens int64 [R], g [R])."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, cols, dtype=torch.float32)
    head = [_blocks(rows, blocks), x.data_ptr(), _ptr(other), scale.data_ptr()]
    if op == "token_logprobs":
        args = [*head, g.data_ptr(), out.data_ptr(), rows, cols]
    elif op == "entropy":
        args = [*head, h.data_ptr(), g.data_ptr(), out.data_ptr(), rows, cols, int(other is not None)]
    else:
        args = [*head, g.data_ptr(), out.data_ptr(), rows, cols, int(other is not None)]
    check(lib, getattr(lib, f"bp_{op}_backward")(*args))
    return out


def masked_mean_backward(mask, g, blocks=None):
    """mask [R, N], g [R] -> dx [R, N] (spec 26.7)."""
    lib = library()
    rows, cols = _dims(mask)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_masked_mean_backward(_blocks(rows, blocks), mask.data_ptr(), g.data_ptr(), out.data_ptr(),
                                           rows, cols))
    return out


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g, blocks=None):
    """x, mask, g [R, N] -> dx [R, N] (spec 26.8); eps_mode an EpsMode code."""
    lib = library()
    rows, cols = _dims(x)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_masked_whiten_backward(_blocks(rows, blocks), x.data_ptr(), mask.data_ptr(), g.data_ptr(),
                                             out.data_ptr(), rows, cols, int(shift_mean), int(unbiased), eps,
                                             eps_mode))
    return out


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g, blocks=None):
    """[n] -> the gradient w.r.t. ref_logp [n] (spec 26.9); kind a KlKind code, an unset clamp +inf."""
    lib = library()
    n = _flat_count(logp)
    out = torch.empty_like(logp)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_kl_penalty_backward(_blocks(tiles, blocks), logp.data_ptr(), ref_logp.data_ptr(), g.data_ptr(),
                                          out.data_ptr(), n, kind, clamp, log_ratio_clamp))
    return out


def ppo_weight_blocks(agg, rows, blocks=None):
    """Cores of kernels/ppo.cpp's token-weight launch: one for token-mean, which counts the whole mask."""
    return 1 if agg == PPO_AGG_CODES["token-mean"] else _blocks(rows, blocks)


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg,
                             g, blocks=None):
    """[B, T] -> the gradient w.r.t. logp [B, T] (spec 26.10); agg a PpoAgg code, g f32 [1], an unset dual clip or
    clamp +inf.  The forward's limits hold: token-mean averages all B * T tokens as one row, the sequence modes
    rows of T and then one row of B."""
    lib = library()
    rows, cols = _dims(logp)
    longest = rows * cols if agg == PPO_AGG_CODES["token-mean"] else max(rows, cols)
    if longest > MAX_ROW:
        raise ValueError(f"the Ascend C kernels take rows of at most {MAX_ROW} floats (the PPO mean runs over all "
                         f"B * T tokens for token-mean, over B sequences otherwise); got {rows} x {cols}")
    weights = torch.empty(rows, dtype=torch.float32)
    out = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_ppo_policy_loss_backward(ppo_weight_blocks(agg, rows, blocks), _blocks(rows, blocks),
                                               logp.data_ptr(), old_logp.data_ptr(), advantages.data_ptr(),
                                               mask.data_ptr(), g.data_ptr(), weights.data_ptr(), out.data_ptr(), rows,
                                               cols, agg, ratio_low, ratio_high, dual_clip, ratio_clamp))
    return out


# ---- Training (spec 29) ------------------------------------------------------------

# kernels/row_fold.h: a fold entry's tile, and the stack of at most 25 subtrees that bounds a fold to MAX_ROW leaves.
FOLD_TILE_FLOATS = 1024
FOLD_MAX_ROWS = MAX_ROW


def _fold_limits(rows, *sizes):
    """A fold over at most FOLD_MAX_ROWS leaves, and fewer than 2**32 elements in each (rows, cols) of sizes."""
    if rows > FOLD_MAX_ROWS:
        raise ValueError(f"the Ascend C row fold takes at most {FOLD_MAX_ROWS} rows (kernels/row_fold.h keeps at most "
                         f"25 subtrees in UB); got rows = {rows}")
    for size in sizes:
        if size[0] * size[1] >= 2**32:
            raise ValueError(f"the Ascend C kernels take fewer than 2**32 elements; got {size[0]} x {size[1]}")


def fold_rows(c, order, positions, starts, rows, blocks=None):
    """c [M, F] -> [S, F] (spec 29.1), S = len(starts) - 1: segment s folds rows order[starts[s] .. starts[s + 1]) of
    c at positions (in that order: ascend/__init__.py's sorts by segment, then position)."""
    lib = library()
    m, f = c.shape
    segments = starts.numel() - 1
    _fold_limits(rows, (m, f), (segments, f))
    out = torch.empty(segments, f, dtype=torch.float32)
    tiles = -(-f // FOLD_TILE_FLOATS)
    check(lib, lib.bp_fold_rows(_blocks(segments * tiles, blocks), c.data_ptr(), order.data_ptr(),
                                positions.data_ptr(), starts.data_ptr(), out.data_ptr(), m, f, segments, rows))
    return out


def rms_norm_backward(x, weight, eps, g, blocks=None):
    """x, g [R, D], weight [D] -> (dx, terms) [R, D] each (spec 29.3)."""
    lib = library()
    rows, cols = _dims(x)
    dx = torch.empty(rows, cols, dtype=torch.float32)
    terms = torch.empty(rows, cols, dtype=torch.float32)
    check(lib, lib.bp_rms_norm_backward(_blocks(rows, blocks), x.data_ptr(), weight.data_ptr(), g.data_ptr(),
                                        dx.data_ptr(), terms.data_ptr(), rows, cols, eps))
    return dx, terms


def silu_mul_backward(gate, up, g, blocks=None):
    """[n] three times -> (d_gate, d_up) (spec 29.5)."""
    lib = library()
    n = _flat_count(gate)
    d_gate = torch.empty_like(gate)
    d_up = torch.empty_like(gate)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_silu_mul_backward(_blocks(tiles, blocks), gate.data_ptr(), up.data_ptr(), g.data_ptr(),
                                        d_gate.data_ptr(), d_up.data_ptr(), n))
    return d_gate, d_up


def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step, blocks=None):
    """[n] four times -> new (w, m, v) (spec 29.12); decay None skips the weight decay."""
    lib = library()
    n = _flat_count(w)
    w_out, m_out, v_out = torch.empty_like(w), torch.empty_like(w), torch.empty_like(w)
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_adamw_step(_blocks(tiles, blocks), w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(),
                                 w_out.data_ptr(), m_out.data_ptr(), v_out.data_ptr(), n, int(decay is not None),
                                 0.0 if decay is None else decay, b1, c1, b2, c2, ibc2, eps, step))
    return w_out, m_out, v_out


def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov, blocks=None):
    """[n] twice, buf [n] or None (the first step) -> (w, buf) (spec 29.12); buf stays as it is without momentum."""
    lib = library()
    n = _flat_count(w)
    w_out = torch.empty_like(w)
    new_buf = torch.empty_like(w) if momentum != 0 else None
    tiles = -(-n // spec.LANES)
    check(lib, lib.bp_sgd_step(_blocks(tiles, blocks), w.data_ptr(), g.data_ptr(), _ptr(buf), w_out.data_ptr(),
                               _ptr(new_buf), n, lr, momentum, one_minus_dampening, weight_decay, int(nesterov),
                               int(buf is not None)))
    return w_out, buf if new_buf is None else new_buf


def attention_backward(q, k, v, kv_lengths, causal, scale, g, blocks=None):
    """q, g [G, Tq, D], k and v [G, Tk, D], kv_lengths int64 [G] -> (dq, dk, dv) (spec 29.6).  The kernels read k and
    v also as [G, D, Tk], q and g also as [G, D, Tq] (the transposes here are copies: no arithmetic), and keep each
    query's shift, recip and G in a workspace [3, G * Tq] between their two launches."""
    lib = library()
    groups, tq, d = q.shape
    tk = k.shape[1]
    if max(tq, tk) > ATTENTION_MAX_KEYS or d > ATTENTION_MAX_DIM:
        raise ValueError(f"the Ascend C attention backward takes at most {ATTENTION_MAX_KEYS} keys and queries (16 "
                         f"segments of {spec.SEGMENT}: it keeps one partial row per segment of either in UB) and head "
                         f"dimensions of at most {ATTENTION_MAX_DIM} (its tiles' UB); got Tq = {tq}, Tk = {tk}, "
                         f"D = {d}")
    if groups * max(tq, tk) * d >= 2**32:
        raise ValueError(f"the Ascend C kernels take fewer than 2**32 elements; got {groups} x {max(tq, tk)} x {d}")
    k_t, v_t = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    q_t, g_t = q.transpose(1, 2).contiguous(), g.transpose(1, 2).contiguous()
    stats = torch.empty(3, groups * tq, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    check(lib, lib.bp_attention_backward(_blocks(groups * tq, blocks), _blocks(groups * tk, blocks), q.data_ptr(),
                                         k_t.data_ptr(), k.data_ptr(), v_t.data_ptr(), v.data_ptr(), q_t.data_ptr(),
                                         g.data_ptr(), g_t.data_ptr(), kv_lengths.contiguous().data_ptr(),
                                         stats.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), groups, tq, tk,
                                         d, int(causal), scale))
    return dq, dk, dv


PROBE_SOURCE = HERE / "probe" / "probe.cpp"
PROBE_OPS = {"add": 0, "mul": 1}      # probe.cpp's ProbeOp codes
_probe_library = []


def probe_binary(op, a, b):
    """out = a op b by one Add or Mul instruction per element (probe/probe.cpp), for bitparity probe."""
    with _lock:
        if not _probe_library:
            lib = ctypes.CDLL(str(build("bitparity_ascend_probe", [PROBE_SOURCE])))
            lib.bp_probe.argtypes, lib.bp_probe.restype = [_P, _P, _P, _U32, _U32], _INT
            lib.bp_emulation_last_error.restype = ctypes.c_char_p
            _probe_library.append(lib)
    lib = _probe_library[0]
    a = torch.as_tensor(a, dtype=torch.float32).contiguous()
    b = torch.as_tensor(b, dtype=torch.float32).contiguous()
    out = torch.empty_like(a)
    check(lib, lib.bp_probe(a.data_ptr(), b.data_ptr(), out.data_ptr(), _flat_count(a), PROBE_OPS[op]))
    return out
