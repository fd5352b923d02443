"""The `numpy` backend: reference/canonical.py on torch CPU tensors.

It is the spec executed literally, the bit target for every other backend,
and always available.  It is slow (every float32 operation is a full pass over
the array); the `cpu` backend computes the same bits in compiled C.
"""

import numpy as np
import torch

from ... import spec
from ...reference import canonical

NAME = "numpy"


def availability():
    return True, "reference/canonical.py in numpy float32: the spec executed literally"


def _np(t):
    return None if t is None else t.numpy()


def _torch(a):
    a = np.asarray(a, dtype=np.float32)
    return torch.from_numpy(a.copy() if a.ndim == 0 else np.ascontiguousarray(a))   # keeps 0-d results 0-d


def _quiet(fn):
    """IEEE specials are part of the spec (inf - inf = NaN is intended), so numpy's warnings are noise here."""
    def wrapped(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    wrapped.__name__ = fn.__name__
    return wrapped


@_quiet
def sum(x, mask):  # noqa: A001 - the op's public name
    return _torch(canonical.sum(_np(x), _np(mask)))


@_quiet
def logsumexp(x, mask, scale):
    return _torch(canonical.logsumexp(_np(x), _np(mask), _np(scale)))


@_quiet
def log_softmax(x, mask, scale):
    return _torch(canonical.log_softmax(_np(x), _np(mask), _np(scale)))


@_quiet
def softmax(x, mask, scale):
    return _torch(canonical.softmax(_np(x), _np(mask), _np(scale)))


@_quiet
def entropy(x, mask, scale):
    return _torch(canonical.entropy(_np(x), _np(mask), _np(scale)))


@_quiet
def token_logprobs(x, tokens, scale):
    return _torch(canonical.token_logprobs(_np(x), _np(tokens), _np(scale)))


@_quiet
def exp(x):
    return _torch(canonical.exp(_np(x)))


@_quiet
def log(x):
    return _torch(canonical.log(_np(x)))


@_quiet
def masked_mean(x, mask):
    return _torch(canonical.masked_mean(_np(x), _np(mask)))


@_quiet
def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    return _torch(canonical.masked_whiten(_np(x), _np(mask), shift_mean, unbiased, eps, eps_mode))


@_quiet
def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    return _torch(canonical.kl_penalty(_np(logp), _np(ref_logp), kind, clamp, log_ratio_clamp))


@_quiet
def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    adv, ret = canonical.gae(_np(rewards), _np(values), _np(mask), _np(bootstrap), gamma, gamma_lambda, mask_mode)
    return _torch(adv), _torch(ret)


@_quiet
def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    loss, frac = canonical.ppo_policy_loss(_np(logp), _np(old_logp), _np(advantages), _np(mask),
                                           ratio_low, ratio_high, dual_clip, ratio_clamp, agg)
    return _torch(loss), _torch(frac)


def philox(counters, keys):
    return torch.from_numpy(canonical.philox(_np(counters), _np(keys)).astype(np.int64))


@_quiet
def topk(x, k):
    values, indices = canonical.topk(_np(x), k)
    return _torch(values), torch.from_numpy(indices)


@_quiet
def filter_logits(x, scale, top_k, top_p, min_p):
    return _torch(canonical.filter_logits(_np(x), _np(scale), _np(top_k), _np(top_p), _np(min_p)))


@_quiet
def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    return torch.from_numpy(canonical.sample(_np(x), _np(scale), _np(top_k), _np(top_p), _np(min_p), _np(greedy),
                                             _np(seeds), _np(positions)))


@_quiet
def linear(x, weight, bias):
    return _torch(canonical.linear(_np(x), _np(weight), _np(bias)))


def linear_exact(x, weight):
    """Spec 31.1's exact integer S[m, n] = sum_k Qx[m, k] Qw[n, k] of linear (spec 24.1), each row quantised against
    its own largest exponent, as int64 [2, M, N]: S = hi 2^30 + lo, 0 <= lo < 2^30 (backends/linear_limbs.py);
    rows holding NaN or inf contribute 0. Nothing is rounded."""
    qx, _, _ = canonical.quantise_rows(_np(x), spec.LINEAR_BX)
    qw, _, _ = canonical.quantise_rows(_np(weight), spec.LINEAR_BW)
    return torch.from_numpy(np.stack(canonical.exact_products(qx, qw)))


@_quiet
def rms_norm(x, weight, eps):
    return _torch(canonical.rms_norm(_np(x), _np(weight), eps))


@_quiet
def rotary(x, cos, sin):
    return _torch(canonical.rotary(_np(x), _np(cos), _np(sin)))


@_quiet
def attention(q, k, v, kv_lengths, causal, scale):
    return _torch(canonical.attention(_np(q), _np(k), _np(v), _np(kv_lengths), causal, scale))


@_quiet
def silu_mul(gate, up):
    return _torch(canonical.silu_mul(_np(gate), _np(up)))


# -- Backward (spec 26) ---------------------------------------------------------------


@_quiet
def logsumexp_backward(x, mask, scale, g):
    return _torch(canonical.logsumexp_backward(_np(x), _np(mask), _np(scale), _np(g)))


@_quiet
def log_softmax_backward(y, mask, scale, g):
    return _torch(canonical.log_softmax_backward(_np(y), _np(mask), _np(scale), _np(g)))


@_quiet
def softmax_backward(p, mask, scale, g):
    return _torch(canonical.softmax_backward(_np(p), _np(mask), _np(scale), _np(g)))


@_quiet
def entropy_backward(x, mask, scale, h, g):
    return _torch(canonical.entropy_backward(_np(x), _np(mask), _np(scale), _np(h), _np(g)))


@_quiet
def token_logprobs_backward(x, tokens, scale, g):
    return _torch(canonical.token_logprobs_backward(_np(x), _np(tokens), _np(scale), _np(g)))


@_quiet
def masked_mean_backward(mask, g):
    return _torch(canonical.masked_mean_backward(_np(mask), _np(g)))


@_quiet
def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    return _torch(canonical.masked_whiten_backward(_np(x), _np(mask), shift_mean, unbiased, eps, eps_mode, _np(g)))


@_quiet
def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    return _torch(canonical.kl_penalty_backward(_np(logp), _np(ref_logp), kind, clamp, log_ratio_clamp, _np(g)))


@_quiet
def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg, g):
    return _torch(canonical.ppo_policy_loss_backward(_np(logp), _np(old_logp), _np(advantages), _np(mask),
                                                     ratio_low, ratio_high, dual_clip, ratio_clamp, agg, _np(g)))


# -- Training (spec 29) ---------------------------------------------------------------

@_quiet
def fold_rows(c, segments, positions, rows, n_segments):
    return _torch(canonical.fold_rows(_np(c), _np(segments), _np(positions), rows, n_segments))


@_quiet
def weight_grad(x, g, positions, rows):
    return _torch(canonical.weight_grad(_np(x), _np(g), _np(positions), rows))


@_quiet
def rms_norm_backward(x, weight, eps, g):
    return tuple(map(_torch, canonical.rms_norm_backward(_np(x), _np(weight), eps, _np(g))))


@_quiet
def silu_mul_backward(gate, up, g):
    return tuple(map(_torch, canonical.silu_mul_backward(_np(gate), _np(up), _np(g))))


@_quiet
def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    return tuple(map(_torch, canonical.attention_backward(_np(q), _np(k), _np(v), _np(kv_lengths), causal, scale,
                                                          _np(g))))


@_quiet
def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
    return tuple(map(_torch, canonical.adamw_step(_np(w), _np(g), _np(m), _np(v), decay, b1, c1, b2, c2, ibc2, eps,
                                                  step)))


@_quiet
def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
    w, buf = canonical.sgd_step(_np(w), _np(g), _np(buf), lr, momentum, one_minus_dampening, weight_decay, nesterov)
    return _torch(w), (None if buf is None else _torch(buf))
