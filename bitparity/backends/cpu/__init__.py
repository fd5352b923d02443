"""The `cpu` backend: the canonical order (docs/spec.md) in compiled C on torch CPU tensors.

The C sources compute the bits of reference/canonical.py in two or three passes
over memory instead of one numpy pass per float32 operation.  One file per op,
named as the cuda and ascend backends name theirs (SOURCES: reduce.c,
softmax.c, ..., silu_mul.c); the pieces several ops share are written once in
canonical.h, softmax_stats.h, selection.h, dot_panels.h and row_fold.h (HEADERS).  They
are built into one library once per machine by backends/_build.py (cached by
sources, headers, flags and compiler) and
called through ctypes on the tensors' own memory; rows (for the RL
reductions, (row, segment) pairs; for GAE, sequences) are split over up to
torch.get_num_threads() threads, or run on one when a call is small (_threads).
The caller computes the chunks no helper thread takes, and helpers are woken only
for idle cores, so on busy cores a call runs as fast as on one thread (parallel.c,
issue 18); a few ops still open OpenMP regions (-fopenmp).

Instruction sets: the library is built for the widest of AVX-512F, AVX2 and the
baseline that this CPU runs, asked at run time (cpu_features.c).  The width
cannot change a bit: the loops are element-wise, so 4, 8 or 16 lanes perform
the same IEEE add/mul/compare/select/int operations on the same operands as
scalar code, and no FMA is emitted (-ffp-contract=off, and no -mfma).
build(level) gives any build this CPU runs, so a test can check each one
against the numpy backend, and Build.path is its library, to disassemble.

Selection and sampling (spec 21-22) take the decisions the spec defines, found
by cheaper searches that cannot change them: top-k's threshold by selection on
order-preserving uint32 keys (ties counted, as the spec counts them); top-p's
floor by walking the kept values down in sorted order while one lane and its
tree paths are recomputed per token, so that each test A(v) < thr reads the
exact canonical sum (positions without a term hold -0.0, the identity); with
top-k off, float64 masses per bucket first pick the few buckets where the mass
crosses thr, and only their tokens are walked (sampling.c, top_p_filter).
Noise is drawn only for the tokens left, in vectorised blocks of 32.
"""

import ctypes
import functools
import threading
from pathlib import Path

import torch

from ... import spec
from .. import linear_grad, linear_limbs
from .._build import build_shared_library, find_compiler
from . import int_linear as _linear
from . import linear_partial as _linear_partial

NAME = "cpu"

_HERE = Path(__file__).resolve().parent

# One C file per op, as backends/cuda and backends/ascend/kernels name theirs, built into one library; the
# headers hold what several ops share (all static inline).  Both are in the build's cache key.
OPS = ("reduce", "softmax", "elementwise", "masked", "kl", "gae", "ppo", "sampling", "topk", "linear", "rms_norm",
       "rotary", "attention", "silu_mul", "fold_rows", "optim")
# parallel.c: the helper threads the ops share (parallel.h).
SOURCES = [_HERE / f"{op}.c" for op in OPS] + [_HERE / "parallel.c"]
HEADERS = sorted(_HERE.glob("*.h"))

# Added to _build.COMMON_FLAGS (-O2 -ffp-contract=off -fno-fast-math): no FMA, no reassociation.
# -O3 vectorises.  -fno-trapping-math lets gcc if-convert the selects (evaluate
# both arms, then blend); without it the exp/log loops stay scalar.  It changes
# no value, only whether a speculated operation may raise a floating-point
# exception flag, which nothing here reads.
FLAGS = ("-std=c99", "-O3", "-fno-trapping-math", "-fopenmp", "-pthread", "-Wall", "-Wextra")

# ISA level reported by cpu_features.c -> (name, extra flags)
ISA_BUILDS = {
    2: ("AVX-512F", ("-mavx512f",)),
    1: ("AVX2", ("-mavx2",)),
    0: ("baseline", ()),
}


def _spec_defines():
    """spec.py's constants as -D macros, so the C sources hold no copy of them to drift."""
    counts = {name: getattr(spec, name) for name in ("LANES", "SEGMENT", "RECIP_NEWTON_STEPS", "RSQRT_NEWTON_STEPS",
                                                     "PHILOX_ROUNDS", "SAMPLE_STREAM", "UNIFORM_COARSE_MIN")}
    patterns = {name: getattr(spec, name) for name in dir(spec)
                if name.endswith("_BITS") and isinstance(getattr(spec, name), int)}
    patterns["RECIP_MAGIC"] = spec.RECIP_MAGIC
    patterns["RSQRT_MAGIC"] = spec.RSQRT_MAGIC
    patterns.update({name: getattr(spec, name) for name in ("PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1")})
    patterns.update({f"EXP_P{i}": b for i, b in enumerate(spec.EXP_POLY_BITS)})
    patterns.update({f"LOG_P{i}": b for i, b in enumerate(spec.LOG_POLY_BITS)})
    patterns.update({f"K3_P{i}": b for i, b in enumerate(spec.K3_SERIES_BITS)})
    return (tuple(f"-DBP_{k}={v}" for k, v in sorted(counts.items()))
            + tuple(f"-DBP_{k}=0x{v:08X}u" for k, v in sorted(patterns.items())))


_P, _I64, _F32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
# The softmax family: scale is f32[rows], one per row.
_ROW_OP = ([_P, _P, _I64, _I64, _P, _P, _INT], _INT)   # x, mask|tokens, rows, n, scale, out, threads
_ROW_BACKWARD = ([_P, _P, _P, _I64, _I64, _P, _P, _INT], _INT)   # x|y|p, mask|tokens, g, rows, n, scale, out, threads
_SIGNATURES = {
    "bp_sum": ([_P, _P, _I64, _I64, _P, _INT], _INT),
    "bp_logsumexp": _ROW_OP,
    "bp_log_softmax": _ROW_OP,
    "bp_softmax": _ROW_OP,
    "bp_entropy": _ROW_OP,
    "bp_token_logprobs": _ROW_OP,
    "bp_exp": ([_P, _I64, _P, _INT], None),
    "bp_log": ([_P, _I64, _P, _INT], None),
    # x, mask, rows, n, out, threads
    "bp_masked_mean": ([_P, _P, _I64, _I64, _P, _INT], _INT),
    # x, mask, rows, n, shift_mean, unbiased, eps, eps_mode (_EPS_MODES), out, threads
    "bp_masked_whiten": ([_P, _P, _I64, _I64, _INT, _INT, _F32, _INT, _P, _INT], _INT),
    # logp, ref_logp, n, kind, clamp, log_ratio_clamp, out, threads
    "bp_kl_penalty": ([_P, _P, _I64, _INT, _F32, _F32, _P, _INT], None),
    # rewards, values, mask, bootstrap, B, T, gamma, gamma_lambda, zero_mode, adv, ret, threads
    "bp_gae": ([_P, _P, _P, _P, _I64, _I64, _F32, _F32, _INT, _P, _P, _INT], None),
    # logp, old_logp, advantages, mask, B, T, ratio_low, ratio_high, dual_clip, ratio_clamp, agg, result[2], threads
    "bp_ppo_policy_loss": ([_P, _P, _P, _P, _I64, _I64, _F32, _F32, _F32, _F32, _INT, _P, _INT], _INT),
    # counters, keys, n, out, threads
    "bp_philox": ([_P, _P, _I64, _P, _INT], None),
    # x, rows, n, k, values, indices, threads
    "bp_topk": ([_P, _I64, _I64, _I64, _P, _P, _INT], _INT),
    # x, rows, n, scale, top_k, top_p, min_p, out, threads
    "bp_filter_logits": ([_P, _I64, _I64, _P, _P, _P, _P, _P, _INT], _INT),
    # x, rows, n, scale, top_k, top_p, min_p, greedy, seeds, positions, out, threads
    "bp_sample": ([_P, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _INT], _INT),
    # x, weight, rows, D, eps, out, threads
    "bp_rms_norm": ([_P, _P, _I64, _I64, _F32, _P, _INT], _INT),
    # x, cos, sin, rows, D, out, threads
    "bp_rotary": ([_P, _P, _P, _I64, _I64, _P, _INT], None),
    # q, k, v, kv_lengths, G, Tq, Tk, D, causal, scale, out, threads
    "bp_attention": ([_P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT, _F32, _P, _INT], _INT),
    # gate, up, n, out, threads
    "bp_silu_mul": ([_P, _P, _I64, _P, _INT], None),
    # on: tests make every call wake all its helpers and wait for them (parallel.h)
    "bp_set_eager_helpers": ([_INT], None),
    # Backward (spec 26): every result is the gradient of the first input, out [rows, n]
    "bp_logsumexp_backward": _ROW_BACKWARD,
    "bp_log_softmax_backward": _ROW_BACKWARD,
    "bp_softmax_backward": _ROW_BACKWARD,
    # x, mask, h, g, rows, n, scale, out, threads
    "bp_entropy_backward": ([_P, _P, _P, _P, _I64, _I64, _P, _P, _INT], _INT),
    "bp_token_logprobs_backward": _ROW_BACKWARD,
    # mask, g, rows, n, out, threads
    "bp_masked_mean_backward": ([_P, _P, _I64, _I64, _P, _INT], _INT),
    # x, mask, g, rows, n, shift_mean, unbiased, eps, eps_mode (_EPS_MODES), out, threads
    "bp_masked_whiten_backward": ([_P, _P, _P, _I64, _I64, _INT, _INT, _F32, _INT, _P, _INT], _INT),
    # logp, ref_logp, g, n, kind, clamp, log_ratio_clamp, out, threads
    "bp_kl_penalty_backward": ([_P, _P, _P, _I64, _INT, _F32, _F32, _P, _INT], None),
    # logp, old_logp, advantages, mask, g[1], B, T, ratio_low, ratio_high, dual_clip, ratio_clamp, agg, out, threads
    "bp_ppo_policy_loss_backward": ([_P, _P, _P, _P, _P, _I64, _I64, _F32, _F32, _F32, _F32, _INT, _P, _INT],
                                    _INT),
    # Training (spec 29)
    # c, segments, positions, M, F, rows, n_segments, out, threads
    "bp_fold_rows": ([_P, _P, _P, _I64, _I64, _I64, _I64, _P, _INT], _INT),
    # x, weight, g, rows, D, eps, dx, terms, threads
    "bp_rms_norm_backward": ([_P, _P, _P, _I64, _I64, _F32, _P, _P, _INT], _INT),
    # gate, up, g, n, d_gate, d_up, threads
    "bp_silu_mul_backward": ([_P, _P, _P, _I64, _P, _P, _INT], None),
    # q, k, v, kv_lengths, G, Tq, Tk, D, causal, scale, g, dq, dk, dv, threads
    "bp_attention_backward": ([_P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT, _F32, _P, _P, _P, _P, _INT], _INT),
    # w, g, m, v, n, decayed, decay, b1, c1, b2, c2, ibc2, eps, step, w_out, m_out, v_out, threads
    "bp_adamw_step": ([_P, _P, _P, _P, _I64, _INT] + [_F32] * 8 + [_P, _P, _P, _INT], None),
    # w, g, buf (NULL: first step), n, lr, momentum, one_minus_dampening, weight_decay, nesterov, w_out, buf_out,
    # threads
    "bp_sgd_step": ([_P, _P, _P, _I64, _F32, _F32, _F32, _F32, _INT, _P, _P, _INT], None),
}

# The C enums kl_kind and ppo_agg, and masked.c's eps_clamp flag.
_KL_KINDS = {"k1": 0, "k2": 1, "k3": 2, "abs": 3}
_PPO_AGGS = {"token-mean": 0, "seq-mean-token-sum": 1, "seq-mean-token-mean": 2, "seq-mean-token-sum-norm": 3}
_EPS_MODES = {"add": 0, "clamp": 1}


def _unset_is_inf(value):
    """An optional clamp bound for the C ops: None becomes +inf, a clamp that changes no value (NaN included)."""
    return float("inf") if value is None else value


def _compiler():
    compiler = find_compiler("gcc")
    if compiler is None:
        raise RuntimeError("no gcc on PATH")
    return compiler


@functools.cache
def isa_level():
    """The widest ISA_BUILDS level this CPU runs."""
    path = build_shared_library("bitparity_cpu_features", _compiler(),
                                [_HERE / "cpu_features.c"], [], ("-std=c99",))
    return int(ctypes.CDLL(str(path)).bp_isa_level())


# Below this many float operations a call runs on one thread: a parallel region costs microseconds on an
# idle machine and up to a scheduler time slice when another thread pool (torch's) holds the other cores,
# which made the model's small per-token calls 10-100x slower than their arithmetic. Threads change no bit.
_PARALLEL_WORK = 1 << 18


def _threads(work):
    return torch.get_num_threads() if work >= _PARALLEL_WORK else 1


def _per_row(x):
    return torch.empty(x.shape[0], dtype=torch.float32)


def _check(status):
    if status != 0:
        raise MemoryError("cpu backend: could not allocate scratch")


class Build:
    """The contract ops computed by one ISA build of the C sources (built on first use)."""

    def __init__(self, level):
        self.level = level
        self.isa, isa_flags = ISA_BUILDS[level]
        self.flags = FLAGS + isa_flags + _spec_defines()
        self.path = build_shared_library(f"bitparity_cpu_{self.isa.lower().replace('-', '')}",
                                         _compiler(), SOURCES, HEADERS, self.flags)
        self._lib = ctypes.CDLL(str(self.path))
        for fname, (argtypes, restype) in {**_SIGNATURES, **_linear.SIGNATURES}.items():
            fn = getattr(self._lib, fname)
            fn.argtypes, fn.restype = argtypes, restype

    def _rows(self, fname, out, x, other, *scale):
        """Run a row op into out (f32[R] or f32[R, N]); other is the mask (or None) or the tokens."""
        rows, n = x.shape
        _check(getattr(self._lib, fname)(x.data_ptr(), None if other is None else other.data_ptr(),
                                         rows, n, *scale, out.data_ptr(), _threads(x.numel())))
        return out

    def _elementwise(self, fname, x):
        out = torch.empty_like(x)
        getattr(self._lib, fname)(x.data_ptr(), x.numel(), out.data_ptr(), _threads(x.numel()))
        return out

    def sum(self, x, mask):  # noqa: A003 - the op's public name
        return self._rows("bp_sum", _per_row(x), x, mask)

    def logsumexp(self, x, mask, scale):
        return self._rows("bp_logsumexp", _per_row(x), x, mask, scale.data_ptr())

    def log_softmax(self, x, mask, scale):
        return self._rows("bp_log_softmax", torch.empty_like(x), x, mask, scale.data_ptr())

    def softmax(self, x, mask, scale):
        return self._rows("bp_softmax", torch.empty_like(x), x, mask, scale.data_ptr())

    def entropy(self, x, mask, scale):
        return self._rows("bp_entropy", _per_row(x), x, mask, scale.data_ptr())

    def token_logprobs(self, x, tokens, scale):
        return self._rows("bp_token_logprobs", _per_row(x), x, tokens, scale.data_ptr())

    def exp(self, x):
        return self._elementwise("bp_exp", x)

    def log(self, x):
        return self._elementwise("bp_log", x)

    def masked_mean(self, x, mask):
        return self._rows("bp_masked_mean", _per_row(x), x, mask)

    def masked_whiten(self, x, mask, shift_mean, unbiased, eps, eps_mode):
        out = torch.empty_like(x)
        rows, n = x.shape
        _check(self._lib.bp_masked_whiten(x.data_ptr(), mask.data_ptr(), rows, n, shift_mean, unbiased, eps,
                                          _EPS_MODES[eps_mode], out.data_ptr(), _threads(x.numel())))
        return out

    def kl_penalty(self, logp, ref_logp, kind, clamp, log_ratio_clamp):
        out = torch.empty_like(logp)
        self._lib.bp_kl_penalty(logp.data_ptr(), ref_logp.data_ptr(), logp.numel(), _KL_KINDS[kind],
                                _unset_is_inf(clamp), _unset_is_inf(log_ratio_clamp), out.data_ptr(),
                                _threads(logp.numel()))
        return out

    def gae(self, rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
        adv, ret = torch.empty_like(rewards), torch.empty_like(rewards)
        b, t = rewards.shape
        self._lib.bp_gae(rewards.data_ptr(), values.data_ptr(), mask.data_ptr(), bootstrap.data_ptr(), b, t,
                         gamma, gamma_lambda, mask_mode == "zero", adv.data_ptr(), ret.data_ptr(),
                         _threads(rewards.numel()))
        return adv, ret

    def ppo_policy_loss(self, logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp,
                        agg):
        result = torch.empty(2, dtype=torch.float32)    # (loss, clip fraction)
        b, t = logp.shape
        _check(self._lib.bp_ppo_policy_loss(logp.data_ptr(), old_logp.data_ptr(), advantages.data_ptr(),
                                            mask.data_ptr(), b, t, ratio_low, ratio_high, _unset_is_inf(dual_clip),
                                            _unset_is_inf(ratio_clamp), _PPO_AGGS[agg], result.data_ptr(),
                                            _threads(logp.numel())))
        return result[0].clone(), result[1].clone()

    def philox(self, counters, keys):
        out = torch.empty_like(counters)
        self._lib.bp_philox(counters.data_ptr(), keys.data_ptr(), counters.shape[0], out.data_ptr(),
                            _threads(counters.numel()))
        return out

    def topk(self, x, k):
        rows, n = x.shape
        values = torch.empty((rows, k), dtype=torch.float32)
        indices = torch.empty((rows, k), dtype=torch.int64)
        _check(self._lib.bp_topk(x.data_ptr(), rows, n, k, values.data_ptr(), indices.data_ptr(),
                                 _threads(x.numel())))
        return values, indices

    def filter_logits(self, x, scale, top_k, top_p, min_p):
        out = torch.empty_like(x)
        rows, n = x.shape
        _check(self._lib.bp_filter_logits(x.data_ptr(), rows, n, scale.data_ptr(), top_k.data_ptr(), top_p.data_ptr(),
                                          min_p.data_ptr(), out.data_ptr(), _threads(x.numel())))
        return out

    def sample(self, x, scale, top_k, top_p, min_p, greedy, seeds, positions):
        out = torch.empty(x.shape[0], dtype=torch.int64)
        rows, n = x.shape
        _check(self._lib.bp_sample(x.data_ptr(), rows, n, scale.data_ptr(), top_k.data_ptr(), top_p.data_ptr(),
                                   min_p.data_ptr(), greedy.data_ptr(), seeds.data_ptr(), positions.data_ptr(),
                                   out.data_ptr(), _threads(x.numel())))
        return out

    def linear(self, x, weight, bias):
        # M K N, not the 20 digit pairs' count: at 4 int8 products per lane-cycle (VNNI) a pair costs about a
        # quarter of a float32 multiply-add, and the decode steps' small calls ran slower when 20 M K N woke a
        # helper for them (rl-check's step: 0.243 -> 0.227 s wall, idle machine).
        return _linear.linear(self._lib, x, weight, bias, _threads(x.shape[0] * x.shape[1] * weight.shape[0]))

    def linear_exact(self, x, weight):
        work = _linear.X_SLICES * _linear.W_SLICES * x.shape[0] * x.shape[1] * weight.shape[0]
        return linear_limbs.from_planes(_linear_partial.digit_planes(self._lib, x, weight, _threads(work)), 8)

    def rms_norm(self, x, weight, eps):
        out = torch.empty_like(x)
        rows, d = x.shape
        _check(self._lib.bp_rms_norm(x.data_ptr(), weight.data_ptr(), rows, d, eps, out.data_ptr(),
                                     _threads(rows * d)))
        return out

    def rotary(self, x, cos, sin):
        out = torch.empty_like(x)
        rows, d = x.shape
        self._lib.bp_rotary(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, d, out.data_ptr(), _threads(rows * d))
        return out

    def attention(self, q, k, v, kv_lengths, causal, scale):
        out = torch.empty_like(q)
        groups, tq, d = q.shape
        _check(self._lib.bp_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), kv_lengths.data_ptr(), groups, tq,
                                      k.shape[1], d, causal, scale, out.data_ptr(),
                                      _threads(groups * tq * k.shape[1] * d)))
        return out

    def silu_mul(self, gate, up):
        out = torch.empty_like(gate)
        self._lib.bp_silu_mul(gate.data_ptr(), up.data_ptr(), gate.numel(), out.data_ptr(), _threads(gate.numel()))
        return out

    # -- Backward (spec 26) --------------------------------------------------------------------------

    def _row_backward(self, fname, x, other, g, scale):
        """A softmax-family backward: out f32[R, N], the gradient of x; other is the mask (or None) or the tokens."""
        out = torch.empty_like(x)
        rows, n = x.shape
        _check(getattr(self._lib, fname)(x.data_ptr(), None if other is None else other.data_ptr(), g.data_ptr(),
                                         rows, n, scale.data_ptr(), out.data_ptr(), _threads(x.numel())))
        return out

    def logsumexp_backward(self, x, mask, scale, g):
        return self._row_backward("bp_logsumexp_backward", x, mask, g, scale)

    def log_softmax_backward(self, y, mask, scale, g):
        return self._row_backward("bp_log_softmax_backward", y, mask, g, scale)

    def softmax_backward(self, p, mask, scale, g):
        return self._row_backward("bp_softmax_backward", p, mask, g, scale)

    def entropy_backward(self, x, mask, scale, h, g):
        out = torch.empty_like(x)
        rows, n = x.shape
        _check(self._lib.bp_entropy_backward(x.data_ptr(), None if mask is None else mask.data_ptr(), h.data_ptr(),
                                             g.data_ptr(), rows, n, scale.data_ptr(), out.data_ptr(),
                                             _threads(x.numel())))
        return out

    def token_logprobs_backward(self, x, tokens, scale, g):
        return self._row_backward("bp_token_logprobs_backward", x, tokens, g, scale)

    def masked_mean_backward(self, mask, g):
        out = torch.empty(mask.shape, dtype=torch.float32)
        rows, n = mask.shape
        _check(self._lib.bp_masked_mean_backward(mask.data_ptr(), g.data_ptr(), rows, n, out.data_ptr(),
                                                 _threads(mask.numel())))
        return out

    def masked_whiten_backward(self, x, mask, shift_mean, unbiased, eps, eps_mode, g):
        out = torch.empty_like(x)
        rows, n = x.shape
        _check(self._lib.bp_masked_whiten_backward(x.data_ptr(), mask.data_ptr(), g.data_ptr(), rows, n, shift_mean,
                                                   unbiased, eps, _EPS_MODES[eps_mode], out.data_ptr(),
                                                   _threads(x.numel())))
        return out

    def kl_penalty_backward(self, logp, ref_logp, kind, clamp, log_ratio_clamp, g):
        out = torch.empty_like(logp)
        self._lib.bp_kl_penalty_backward(logp.data_ptr(), ref_logp.data_ptr(), g.data_ptr(), logp.numel(),
                                         _KL_KINDS[kind], _unset_is_inf(clamp), _unset_is_inf(log_ratio_clamp),
                                         out.data_ptr(), _threads(logp.numel()))
        return out

    def ppo_policy_loss_backward(self, logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip,
                                 ratio_clamp, agg, g):
        out = torch.empty_like(logp)
        b, t = logp.shape
        _check(self._lib.bp_ppo_policy_loss_backward(logp.data_ptr(), old_logp.data_ptr(), advantages.data_ptr(),
                                                     mask.data_ptr(), g.data_ptr(), b, t, ratio_low, ratio_high,
                                                     _unset_is_inf(dual_clip), _unset_is_inf(ratio_clamp),
                                                     _PPO_AGGS[agg], out.data_ptr(), _threads(logp.numel())))
        return out

    # -- Training (spec 29) --------------------------------------------------------------------------

    def fold_rows(self, c, segments, positions, rows, n_segments):
        out = torch.empty((n_segments, c.shape[1]), dtype=torch.float32)
        m, f = c.shape
        _check(self._lib.bp_fold_rows(c.data_ptr(), segments.data_ptr(), positions.data_ptr(), m, f, rows,
                                      n_segments, out.data_ptr(), _threads(c.numel())))
        return out

    def weight_grad(self, x, g, positions, rows):
        # Each block holds at most LINEAR_GRAD_BLOCK rows: its product is block_linear's (uncached weight).
        threads = _threads(x.shape[1] * g.shape[1] * spec.LINEAR_GRAD_BLOCK)
        return linear_grad.weight_grad(lambda a, b, _: _linear.block_linear(self._lib, a, b, threads), x, g,
                                       positions, rows)

    def rms_norm_backward(self, x, weight, eps, g):
        dx, terms = torch.empty_like(x), torch.empty_like(x)
        rows, d = x.shape
        _check(self._lib.bp_rms_norm_backward(x.data_ptr(), weight.data_ptr(), g.data_ptr(), rows, d, eps,
                                              dx.data_ptr(), terms.data_ptr(), _threads(rows * d)))
        return dx, terms

    def silu_mul_backward(self, gate, up, g):
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(gate)
        self._lib.bp_silu_mul_backward(gate.data_ptr(), up.data_ptr(), g.data_ptr(), gate.numel(), d_gate.data_ptr(),
                                       d_up.data_ptr(), _threads(gate.numel()))
        return d_gate, d_up

    def attention_backward(self, q, k, v, kv_lengths, causal, scale, g):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        groups, tq, d = q.shape
        _check(self._lib.bp_attention_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), kv_lengths.data_ptr(),
                                               groups, tq, k.shape[1], d, causal, scale, g.data_ptr(),
                                               dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                               _threads(groups * tq * k.shape[1] * d)))
        return dq, dk, dv

    def adamw_step(self, w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
        w_out, m_out, v_out = torch.empty_like(w), torch.empty_like(w), torch.empty_like(w)
        self._lib.bp_adamw_step(w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), w.numel(), decay is not None,
                                0.0 if decay is None else decay, b1, c1, b2, c2, ibc2, eps, step, w_out.data_ptr(),
                                m_out.data_ptr(), v_out.data_ptr(), _threads(w.numel()))
        return w_out, m_out, v_out

    def sgd_step(self, w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
        w_out = torch.empty_like(w)
        buf_out = None if momentum == 0 else torch.empty_like(w)
        self._lib.bp_sgd_step(w.data_ptr(), g.data_ptr(), None if buf is None else buf.data_ptr(), w.numel(), lr,
                              momentum, one_minus_dampening, weight_decay, nesterov, w_out.data_ptr(),
                              None if buf_out is None else buf_out.data_ptr(), _threads(w.numel()))
        return w_out, buf_out


_lock = threading.Lock()
_builds = {}


def build(level=None):
    """The Build for ISA level (default: the widest this CPU runs), compiled and loaded once."""
    level = isa_level() if level is None else level
    if level > isa_level():
        raise ValueError(f"this CPU cannot run the {ISA_BUILDS[level][0]} build")
    with _lock:
        if level not in _builds:
            _builds[level] = Build(level)
    return _builds[level]


def availability():
    try:
        isa = build().isa
    except (RuntimeError, OSError) as err:
        return False, f"the C sources could not be built or loaded: {err}"
    return True, (f"compiled C (gcc -O3 -ffp-contract=off, {isa} build), "
                  f"{torch.get_num_threads()} threads")


def sum(x, mask):  # noqa: A001 - the op's public name
    return build().sum(x, mask)


def logsumexp(x, mask, scale):
    return build().logsumexp(x, mask, scale)


def log_softmax(x, mask, scale):
    return build().log_softmax(x, mask, scale)


def softmax(x, mask, scale):
    return build().softmax(x, mask, scale)


def entropy(x, mask, scale):
    return build().entropy(x, mask, scale)


def token_logprobs(x, tokens, scale):
    return build().token_logprobs(x, tokens, scale)


def exp(x):
    return build().exp(x)


def log(x):
    return build().log(x)


def masked_mean(x, mask):
    return build().masked_mean(x, mask)


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    return build().masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode)


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    return build().kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp)


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    return build().gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode)


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    return build().ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip,
                                   ratio_clamp, agg)


def philox(counters, keys):
    return build().philox(counters, keys)


def topk(x, k):
    return build().topk(x, k)


def filter_logits(x, scale, top_k, top_p, min_p):
    return build().filter_logits(x, scale, top_k, top_p, min_p)


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    return build().sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions)


def linear(x, weight, bias):
    return build().linear(x, weight, bias)


def linear_exact(x, weight):
    """Spec 31.1's exact integer of linear as int64 [2, M, N] (hi, lo), S = hi 2^30 + lo (backends/linear_limbs.py)."""
    return build().linear_exact(x, weight)


def rms_norm(x, weight, eps):
    return build().rms_norm(x, weight, eps)


def rotary(x, cos, sin):
    return build().rotary(x, cos, sin)


def attention(q, k, v, kv_lengths, causal, scale):
    return build().attention(q, k, v, kv_lengths, causal, scale)


def silu_mul(gate, up):
    return build().silu_mul(gate, up)


def logsumexp_backward(x, mask, scale, g):
    return build().logsumexp_backward(x, mask, scale, g)


def log_softmax_backward(y, mask, scale, g):
    return build().log_softmax_backward(y, mask, scale, g)


def softmax_backward(p, mask, scale, g):
    return build().softmax_backward(p, mask, scale, g)


def entropy_backward(x, mask, scale, h, g):
    return build().entropy_backward(x, mask, scale, h, g)


def token_logprobs_backward(x, tokens, scale, g):
    return build().token_logprobs_backward(x, tokens, scale, g)


def masked_mean_backward(mask, g):
    return build().masked_mean_backward(mask, g)


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    return build().masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g)


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    return build().kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g)


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg, g):
    return build().ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip,
                                            ratio_clamp, agg, g)


def fold_rows(c, segments, positions, rows, n_segments):
    return build().fold_rows(c, segments, positions, rows, n_segments)


def weight_grad(x, g, positions, rows):
    return build().weight_grad(x, g, positions, rows)


def rms_norm_backward(x, weight, eps, g):
    return build().rms_norm_backward(x, weight, eps, g)


def silu_mul_backward(gate, up, g):
    return build().silu_mul_backward(gate, up, g)


def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    return build().attention_backward(q, k, v, kv_lengths, causal, scale, g)


def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
    return build().adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step)


def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
    return build().sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov)
