"""The `ascend` backend: the canonical order (docs/spec.md) as Ascend C kernels for Atlas A2.

kernels/*.cpp are written to the real Ascend C API (910B, dav-2201): a kernel
class per op family with CopyIn/Compute/CopyOut, TPipe/TQue/TBuf, rows spread
over AI cores by GetBlockIdx/GetBlockNum, and only IEEE add/sub/mul, compare,
select, min/max, exact casts and int32/bit operations in the canonical path.

They run in one of two ways:
  * On an NPU (torch_npu imports and sees a device): the library that
    CMakeLists.txt builds registers torch.ops.bitparity_ascend.*, and the ops
    take NPU tensors.  This path is written to CANN conventions but has never
    been compiled or run in this project: docs/ascend.md says what must be
    checked on hardware, and how.
  * Elsewhere, in the host emulation: the same kernel sources compiled by g++
    against emulation/kernel_operator.h, which models the API subset and
    enforces its constraints (alignment, UB capacity, queue discipline,
    cross-pipe syncs).  It is a test double that runs on CPU tensors, not an NPU.
"""

import math

import torch

from .. import linear_grad, linear_limbs
from . import host_emulation, npu_ops

NAME = "ascend"

# ops.KL_KINDS as kernels/kl.cpp's KlKind codes.
_KL_KIND_CODES = {"k1": 0, "k2": 1, "k3": 2, "abs": 3}

_mode = []


def _on_npu():
    """Whether the ops run on the NPU (decided once per process)."""
    if not _mode:
        _mode.append(npu_ops.npu_present())
    return _mode[0]


def availability():
    if _on_npu():
        try:
            path = npu_ops.load()
        except (OSError, RuntimeError) as err:
            return False, f"an NPU is present but the Ascend C NPU build cannot be loaded: {err}"
        return True, f"Ascend C kernels on the NPU (torch_npu, {path.name})"
    if host_emulation.compiler() is None:
        return False, "no NPU (torch_npu missing or no device) and no g++ for the Ascend C host emulation"
    try:
        host_emulation.library()
    except (RuntimeError, OSError) as err:
        return False, f"the Ascend C host emulation could not be built or loaded: {err}"
    return True, "Ascend C kernels in host emulation (g++ -ffp-contract=off), a test double: not an NPU"


def sum(x, mask):  # noqa: A001 - the op's public name
    if _on_npu():
        return npu_ops.op("sum")(x, mask)
    return host_emulation.row_op("sum", x, mask)


def logsumexp(x, mask, scale):
    if _on_npu():
        return npu_ops.op("logsumexp")(x, mask, scale)
    return host_emulation.row_op("logsumexp", x, mask, scale)


def log_softmax(x, mask, scale):
    if _on_npu():
        return npu_ops.op("log_softmax")(x, mask, scale)
    return host_emulation.map_op("log_softmax", x, mask, scale)


def softmax(x, mask, scale):
    if _on_npu():
        return npu_ops.op("softmax")(x, mask, scale)
    return host_emulation.map_op("softmax", x, mask, scale)


def entropy(x, mask, scale):
    if _on_npu():
        return npu_ops.op("entropy")(x, mask, scale)
    return host_emulation.row_op("entropy", x, mask, scale)


def token_logprobs(x, tokens, scale):
    if _on_npu():
        return npu_ops.op("token_logprobs")(x, tokens, scale)
    return host_emulation.row_op("token_logprobs", x, tokens, scale)


def exp(x):
    if _on_npu():
        return npu_ops.op("exp")(x)
    return host_emulation.elementwise("exp", x)


def log(x):
    if _on_npu():
        return npu_ops.op("log")(x)
    return host_emulation.elementwise("log", x)


def _unset_as_inf(bound):
    """An unset clamp or dual clip becomes +inf, which changes no bit (kernels/kl.cpp, kernels/ppo.cpp)."""
    return math.inf if bound is None else bound


def _masked_mean(x, mask):
    """[R, N] -> [R]; mask None counts every entry (the PPO mean over sequences)."""
    if _on_npu():
        return npu_ops.op("masked_mean")(x, mask)
    return host_emulation.row_op("masked_mean", x, mask)


def masked_mean(x, mask):
    return _masked_mean(x, mask)


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    args = (x, mask, shift_mean, unbiased, eps, host_emulation.EPS_MODE_CODES[eps_mode])
    if _on_npu():
        return npu_ops.op("masked_whiten")(*args)
    return host_emulation.masked_whiten(*args)


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    args = (logp, ref_logp, _KL_KIND_CODES[kind], _unset_as_inf(clamp), _unset_as_inf(log_ratio_clamp))
    if _on_npu():
        return npu_ops.op("kl_penalty")(*args)
    return host_emulation.kl_penalty(*args)


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    args = (rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode == "zero")
    if _on_npu():
        return tuple(npu_ops.op("gae")(*args))
    return host_emulation.gae(*args)


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    """Per-token losses from kernels/ppo.cpp, then the spec 17.2 aggregation by the reduction kernels:
    token-mean is the masked mean of all B*T tokens as one row; the sequence modes reduce each row
    (masked sum or masked mean), then take the masked mean of the B values as one row, counting the
    non-empty sequences only (e_b = n_b > 0); seq-mean-token-sum-norm then multiplies by reciprocal(T), as
    masked_mean_backward's g * R(T) over a row of T counted entries."""
    args = (logp, old_logp, advantages, ratio_low, ratio_high, _unset_as_inf(dual_clip), _unset_as_inf(ratio_clamp))
    if _on_npu():
        loss, clipped = npu_ops.op("ppo_token_losses")(*args)
    else:
        loss, clipped = host_emulation.ppo_token_losses(*args)
    flat_mask = mask.reshape(1, -1)
    if agg == "token-mean":
        total = _masked_mean(loss.reshape(1, -1), flat_mask)
    else:
        non_empty = mask.any(dim=1).reshape(1, -1).contiguous()    # e_b = n_b > 0: no arithmetic
        per_sequence = _masked_mean(loss, mask) if agg == "seq-mean-token-mean" else sum(loss, mask)
        total = _masked_mean(per_sequence.reshape(1, -1), non_empty)
        if agg == "seq-mean-token-sum-norm":
            every_token = torch.ones((1, mask.shape[1]), dtype=torch.bool, device=mask.device)
            total = masked_mean_backward(every_token, total.reshape(1))[:, 0]
    frac = _masked_mean(clipped.reshape(1, -1), flat_mask)
    return total.reshape(()), frac.reshape(())


# -- Backward (spec 26) ----------------------------------------------------------------

def logsumexp_backward(x, mask, scale, g):
    if _on_npu():
        return npu_ops.op("logsumexp_backward")(x, mask, scale, g)
    return host_emulation.softmax_backward("logsumexp", x, mask, scale, g)


def log_softmax_backward(y, mask, scale, g):
    if _on_npu():
        return npu_ops.op("log_softmax_backward")(y, mask, scale, g)
    return host_emulation.softmax_backward("log_softmax", y, mask, scale, g)


def softmax_backward(p, mask, scale, g):
    if _on_npu():
        return npu_ops.op("softmax_backward")(p, mask, scale, g)
    return host_emulation.softmax_backward("softmax", p, mask, scale, g)


def entropy_backward(x, mask, scale, h, g):
    if _on_npu():
        return npu_ops.op("entropy_backward")(x, mask, scale, h, g)
    return host_emulation.softmax_backward("entropy", x, mask, scale, g, h)


def token_logprobs_backward(x, tokens, scale, g):
    if _on_npu():
        return npu_ops.op("token_logprobs_backward")(x, tokens, scale, g)
    return host_emulation.softmax_backward("token_logprobs", x, tokens, scale, g)


def masked_mean_backward(mask, g):
    if _on_npu():
        return npu_ops.op("masked_mean_backward")(mask, g)
    return host_emulation.masked_mean_backward(mask, g)


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    args = (x, mask, shift_mean, unbiased, eps, host_emulation.EPS_MODE_CODES[eps_mode], g)
    if _on_npu():
        return npu_ops.op("masked_whiten_backward")(*args)
    return host_emulation.masked_whiten_backward(*args)


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    """The gradient w.r.t. ref_logp; ops.py flips its sign for logp."""
    args = (logp, ref_logp, _KL_KIND_CODES[kind], _unset_as_inf(clamp), _unset_as_inf(log_ratio_clamp), g)
    if _on_npu():
        return npu_ops.op("kl_penalty_backward")(*args)
    return host_emulation.kl_penalty_backward(*args)


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg, g):
    """kernels/ppo.cpp's token weights (one per sequence, from g and the counts), then the per-token gradient."""
    args = (logp, old_logp, advantages, mask, ratio_low, ratio_high, _unset_as_inf(dual_clip),
            _unset_as_inf(ratio_clamp), host_emulation.PPO_AGG_CODES[agg], g)
    if _on_npu():
        return npu_ops.op("ppo_policy_loss_backward")(*args)
    return host_emulation.ppo_policy_loss_backward(*args)


def _as_words(t):
    """int64 values in [0, 2**32) -> the same uint32 words as int32 (what the kernel reads)."""
    return torch.where(t >= 2**31, t - 2**32, t).to(torch.int32).contiguous()


def philox(counters, keys):
    """The kernel works on uint32 words: the contract's int64 values go in and come out as such."""
    args = (_as_words(counters), _as_words(keys))
    words = npu_ops.op("philox")(*args) if _on_npu() else host_emulation.philox(*args)
    return words.to(torch.int64) & 0xFFFFFFFF


def topk(x, k):
    if _on_npu():
        return tuple(npu_ops.op("topk")(x, k))
    return host_emulation.topk(x, k)


def filter_logits(x, scale, top_k, top_p, min_p):
    if _on_npu():
        return npu_ops.op("filter_logits")(x, scale, top_k, top_p, min_p)
    return host_emulation.filter_logits(x, scale, top_k, top_p, min_p)


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    if _on_npu():
        return npu_ops.op("sample")(x, scale, top_k, top_p, min_p, greedy, seeds, positions)
    return host_emulation.sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions)


def linear(x, weight, bias):
    if _on_npu():
        return npu_ops.op("linear")(x, weight, bias)
    return host_emulation.linear(x, weight, bias)


def linear_exact(x, weight):
    """Spec 31.1's exact integer of linear as int64 [2, M, N] (hi, lo), S = hi 2^30 + lo (backends/linear_limbs.py):
    kernels/linear.cpp's quantise and Cube launches without the rounding give int32 partials per chunk of K and
    digit weight 256^s; the chunks are added in int64 and the diagonals carried here."""
    partials = npu_ops.op("linear_exact")(x, weight) if _on_npu() else host_emulation.linear_exact(x, weight)
    planes = partials.to(torch.int64).sum(dim=0)[:, :x.shape[0], :weight.shape[0]]
    return linear_limbs.from_planes(planes, 8)


def rms_norm(x, weight, eps):
    if _on_npu():
        return npu_ops.op("rms_norm")(x, weight, eps)
    return host_emulation.rms_norm(x, weight, eps)


def rotary(x, cos, sin):
    if _on_npu():
        return npu_ops.op("rotary")(x, cos, sin)
    return host_emulation.rotary(x, cos, sin)


def attention(q, k, v, kv_lengths, causal, scale):
    if _on_npu():
        return npu_ops.op("attention")(q, k, v, kv_lengths, causal, scale)
    return host_emulation.attention(q, k, v, kv_lengths, causal, scale)


def silu_mul(gate, up):
    if _on_npu():
        return npu_ops.op("silu_mul")(gate, up)
    return host_emulation.silu_mul(gate, up)


# -- Training (spec 29) ----------------------------------------------------------------

def _fold_order(segments, positions, n_segments):
    """The rows in (segment, position) order, their positions in that order, and where each segment's rows start
    (int64 [n_segments + 1]): the order kernels/fold_rows.cpp reads them in, by sorts and counts (integer data
    movement, on the tensors' device)."""
    order = torch.argsort(positions, stable=True)
    order = order[torch.argsort(segments[order], stable=True)]
    starts = torch.zeros(n_segments + 1, dtype=torch.int64, device=segments.device)
    starts[1:] = torch.cumsum(torch.bincount(segments, minlength=n_segments), 0)
    return order, positions[order].contiguous(), starts


def fold_rows(c, segments, positions, rows, n_segments):
    args = (c, *_fold_order(segments, positions, n_segments), rows)
    if _on_npu():
        return npu_ops.op("fold_rows")(*args)
    return host_emulation.fold_rows(*args)


def weight_grad(x, g, positions, rows):
    """spec 29.2: dW over blocks of spec.LINEAR_GRAD_BLOCK rows, each block this backend's linear, row-folded."""
    if _on_npu():
        return linear_grad.weight_grad(lambda a, b, bias: npu_ops.op("linear")(a, b, bias), x, g, positions, rows)
    return linear_grad.weight_grad(host_emulation.linear, x, g, positions, rows)


def rms_norm_backward(x, weight, eps, g):
    if _on_npu():
        return tuple(npu_ops.op("rms_norm_backward")(x, weight, eps, g))
    return host_emulation.rms_norm_backward(x, weight, eps, g)


def silu_mul_backward(gate, up, g):
    if _on_npu():
        return tuple(npu_ops.op("silu_mul_backward")(gate, up, g))
    return host_emulation.silu_mul_backward(gate, up, g)


def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
    if _on_npu():
        return tuple(npu_ops.op("adamw_step")(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step))
    return host_emulation.adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step)


def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
    args = (w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov)
    if _on_npu():
        w, new_buf = npu_ops.op("sgd_step")(*args)
        return w, (new_buf if momentum != 0 else buf)
    return host_emulation.sgd_step(*args)


def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    if _on_npu():
        return tuple(npu_ops.op("attention_backward")(q, k, v, kv_lengths, causal, scale, g))
    return host_emulation.attention_backward(q, k, v, kv_lengths, causal, scale, g)
