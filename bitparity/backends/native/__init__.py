"""The `native` backend: torch's own ops for the same maths, on any device.

This is the baseline the comparison measures against: what an RL pipeline
computes when it calls torch directly (vLLM and verl compute token log-probs
as log_softmax + gather).  Its bits are whatever the platform's kernels give;
they are not expected to match the canonical order.  The temperature is
applied as x * scale, the same scaling the canonical backends use, so that the
comparison isolates the reduction order and the exp/log implementations.
"""

import torch

NAME = "native"


def availability():
    return True, f"torch {torch.__version__} ops on the input's device"


def _scaled(x, mask, scale):
    w = x * scale[:, None]                       # scale: one per row (docs/backend-contract.md)
    return w if mask is None else w.masked_fill(~mask, float("-inf"))


def sum(x, mask):  # noqa: A001 - the op's public name
    return (x if mask is None else x.masked_fill(~mask, 0.0)).sum(dim=-1)


def logsumexp(x, mask, scale):
    return torch.logsumexp(_scaled(x, mask, scale), dim=-1)


def log_softmax(x, mask, scale):
    return torch.log_softmax(_scaled(x, mask, scale), dim=-1)


def softmax(x, mask, scale):
    return torch.softmax(_scaled(x, mask, scale), dim=-1)


def entropy(x, mask, scale):
    # The usual RL formulation (verl's entropy_from_logits): logsumexp - sum p * logits.
    w = _scaled(x, mask, scale)
    p = torch.softmax(w, dim=-1)
    return torch.logsumexp(w, dim=-1) - (p * w.masked_fill(p == 0, 0.0)).sum(dim=-1)


def token_logprobs(x, tokens, scale):
    return torch.log_softmax(x * scale[:, None], dim=-1).gather(-1, tokens[:, None])[:, 0]


def exp(x):
    return torch.exp(x)


def log(x):
    return torch.log(x)


# -- RL operators, as TRL / verl / OpenRLHF write them with torch ops ----------------

def masked_mean(x, mask):
    # verl's masked_mean: (values * mask).sum() / (mask.sum() + 1e-8)
    return (x * mask).sum(dim=-1) / (mask.sum(dim=-1) + 1e-8)


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    # verl's masked_whiten / masked_var: multiply-by-mask sums, Bessel factor n / (n - 1), rsqrt;
    # OpenRLHF's clamp: rsqrt(max(var, eps)).
    mean = masked_mean(x, mask)[:, None]
    centered = x - mean
    var = masked_mean(centered * centered, mask)[:, None]
    if unbiased:
        n = mask.sum(dim=-1, keepdim=True)
        var = var * (n / (n - 1).clamp(min=1))
    out = centered * torch.rsqrt(var + eps if eps_mode == "add" else var.clamp(min=eps))
    if not shift_mean:
        out = out + mean
    return out * mask


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    # verl's kl_penalty: k1 = logp - ref, abs, k2 = 0.5 (logp - ref)^2, k3 = exp(d) - d - 1.
    d = ref_logp - logp
    if log_ratio_clamp is not None:
        d = d.clamp(-log_ratio_clamp, log_ratio_clamp)
    out = {"k1": lambda: logp - ref_logp, "abs": lambda: (logp - ref_logp).abs(),
           "k2": lambda: 0.5 * (logp - ref_logp).square(), "k3": lambda: torch.exp(d) - d - 1}[kind]()
    return out if clamp is None else out.clamp(-clamp, clamp)


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    # The Python reverse loop of verl's compute_gae_advantage_return (carry) and of
    # TRL / OpenRLHF (zero: rewards and values multiplied by the mask first).
    m = mask.to(rewards.dtype)
    if mask_mode == "zero":
        rewards, values = rewards * m, values * m
    next_v, last = bootstrap.clone(), torch.zeros_like(bootstrap)
    out = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        cand = delta + gamma_lambda * last
        if mask_mode == "carry":
            next_v = values[:, t] * m[:, t] + (1 - m[:, t]) * next_v
            last = cand * m[:, t] + (1 - m[:, t]) * last
        else:
            next_v, last = values[:, t], cand
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    ret = adv + values
    return (adv, ret) if mask_mode == "carry" else (adv * m, ret * m)


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    # verl's compute_policy_loss + agg_loss (0.10: sequence modes average over non-empty sequences).
    d = logp - old_logp
    if ratio_clamp is not None:
        d = d.clamp(-ratio_clamp, ratio_clamp)
    ratio = torch.exp(d)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(ratio_low, ratio_high)
    loss = torch.maximum(loss1, loss2)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(-advantages * dual_clip, loss), loss)
    m = mask.to(loss.dtype)
    non_empty = m.sum(dim=-1) > 0
    if agg == "token-mean":
        total = (loss * m).sum() / (m.sum() + 1e-8)
    elif agg == "seq-mean-token-mean":
        total = ((loss * m).sum(dim=-1) / (m.sum(dim=-1) + 1e-8))[non_empty].sum() / non_empty.sum().clamp(min=1)
    else:
        total = (loss * m).sum(dim=-1)[non_empty].sum() / non_empty.sum().clamp(min=1)
        if agg == "seq-mean-token-sum-norm":
            total = total / loss.shape[-1]
    frac = ((loss2 > loss1).to(loss.dtype) * m).sum() / (m.sum() + 1e-8)
    return total, frac


# -- Selection and sampling, as vLLM v1's PyTorch path does it --------------------
# Sources (vLLM v1): sample/sampler.py (temperature: logits divided by T; greedy: argmax of the
# logits), sample/logits_processor/builtin.py (MinPLogitsProcessor: softmax, then drop p < min_p * p_max),
# sample/ops/topk_topp_sampler.py (apply_top_k_top_p_pytorch: one ascending sort, top-k by the k-th
# sorted value, top-p by a float32 cumsum compared with 1 - p; random_sample: q ~ Exp(1) from a
# per-request torch.Generator, token = argmax(probs / q)). Written from those descriptions, not copied.

def topk(x, k):
    return torch.topk(x, k, dim=-1)


def _temperature(scale):
    # The contract passes scale = RN32(1/RN32(T)); vLLM divides by T, recovered here as RN32(1/scale),
    # which is RN32(T) or one float32 step from it.
    return (1.0 / scale.double()).float()


def _min_p(logits, min_p):
    probs = torch.softmax(logits, dim=-1)
    too_small = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(too_small, float("-inf"))


def _top_k_top_p(logits, k, p):
    # k = V and p = 1 are vLLM's "off" for a row; a filter is skipped when no row uses it, as vLLM's None.
    ordered, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = ordered.gather(1, (ordered.shape[1] - k)[:, None])
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if p is not None:
        mass_up_to = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)   # ascending: mass at and below
        drop = mass_up_to <= 1 - p[:, None]
        drop[:, -1] = False                                                  # keep the largest
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def filter_logits(x, scale, top_k, top_p, min_p):
    logits = x / _temperature(scale)[:, None]
    if bool((min_p > 0).any()):
        logits = _min_p(logits, min_p)
    vocab = x.shape[1]
    k_off = (top_k == 0) | (top_k >= vocab)
    k = None if bool(k_off.all()) else torch.where(k_off, vocab, top_k)
    p = None if bool((top_p >= 1).all()) else top_p
    return logits if k is None and p is None else _top_k_top_p(logits, k, p)


def _row_generator(seed, position):
    # vLLM keeps one generator per seeded request and lets its state advance every step; the contract
    # names the step by its position instead, so each row's generator is seeded from (seed, position).
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + int(position)) & 0xFFFFFFFFFFFFFFFF
    return torch.Generator(device="cpu").manual_seed(mixed)


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    probs = torch.softmax(filter_logits(x, scale, top_k, top_p, min_p), dim=-1)
    q = torch.empty_like(probs, device="cpu")
    for r in range(x.shape[0]):
        q[r].exponential_(generator=_row_generator(seeds[r], positions[r]))
    random = (probs / q.to(probs.device)).argmax(dim=-1)
    return torch.where(greedy, x.argmax(dim=-1), random)


# -- Model building blocks, as HF transformers' Qwen3 / Qwen3-MoE modules write them --------------

def linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


def rms_norm(x, weight, eps):
    # Qwen3RMSNorm: variance = x.pow(2).mean(-1); x * rsqrt(variance + eps); weight * x.
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotary(x, cos, sin):
    # HF's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos and sin repeated over both halves.
    h = x.shape[-1] // 2
    rotated = torch.cat((-x[:, h:], x[:, :h]), dim=-1)
    return x * torch.cat((cos, cos), dim=-1) + rotated * torch.cat((sin, sin), dim=-1)


def attention(q, k, v, kv_lengths, causal, scale):
    # torch's scaled_dot_product_attention with a boolean mask of the keys that count (spec 24.4's mask).
    tq, tk = q.shape[1], k.shape[1]
    j = torch.arange(tk, device=q.device)
    mask = (j[None, None, :] < kv_lengths[:, None, None]).expand(-1, tq, -1)
    if causal:
        mask = mask & (j[None, None, :] <= torch.arange(tq, device=q.device)[None, :, None] + (tk - tq))
    # Unused cache slots may hold anything; SDPA multiplies masked probabilities by v, so zero them as engines do.
    keep = (j[None, :] < kv_lengths[:, None])[:, :, None]
    k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def silu_mul(gate, up):
    return torch.nn.functional.silu(gate) * up
