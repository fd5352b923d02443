"""What each op means, computed in float64 from the same float32 inputs.

This is the yardstick for accuracy, not a bit target: float32 inputs are
exact in float64, the temperature-scaled logits are the float32 values
RN32(x * scale) that the spec starts from (any float32 implementation must
round x / T once; spec 8.1 and 10 say what that costs), moe's chosen experts
are the ones the float32 router logits choose (moe_routing), and np.exp/np.log in
float64 are far more accurate than one float32 ulp.  Special values follow
the spec's table (docs/spec.md, section 9), so that a float32 result and its
meaning can be compared element by element.

Arrays have reference/canonical.py's shapes: 2-D [rows, n] (1-D for exp/log
and silu_mul), [groups, tokens, D] for attention.
"""

import numpy as np

from . import canonical

F64 = np.float64


def _scaled(x, mask, scale):
    """The float32 logits w = RN32(x * scale) that every float32 implementation starts from (spec 8.1)."""
    w = (x.astype(np.float32) * np.float32(scale)).astype(F64)
    if mask is not None:
        w = np.where(mask, w, -np.inf)
    return w


def _stats(w):
    """(shift, total, log_total) per row: total = sum exp(w - shift); 0 for an empty row, NaN for NaN/+inf rows.

    log_total is log1p(total - 1) with total - 1 summed without the leading 1s,
    so that it stays accurate when one entry dominates (float64's own
    log(1 + 1e-14) would be off by 1%).
    """
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        row_max = np.max(w, axis=1)
        shift = np.where(row_max == -np.inf, 0.0, row_max)
        e = np.exp(w - shift[:, None])
        ones = np.sum(e == 1.0, axis=1)
        rest = np.sum(np.where(e == 1.0, 0.0, e), axis=1)
        total = ones + rest
        log_total = np.where(ones >= 1, np.log1p((ones - 1) + rest), np.log(total))
    return shift, total, log_total


def sum(x, mask):  # noqa: A001 - the op's public name
    x = x.astype(F64)
    if mask is not None:
        x = np.where(mask, x, 0.0)
    return np.sum(x, axis=1)


def logsumexp(x, mask, scale):
    shift, _, log_total = _stats(_scaled(x, mask, scale))
    return shift + log_total


def log_softmax(x, mask, scale):
    w = _scaled(x, mask, scale)
    shift, total, log_total = _stats(w)
    with np.errstate(invalid="ignore"):
        out = (w - shift[:, None]) - log_total[:, None]
    return np.where((total == 0.0)[:, None], -np.inf, out)


def softmax(x, mask, scale):
    w = _scaled(x, mask, scale)
    shift, total, _ = _stats(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.exp(w - shift[:, None]) / total[:, None]
    return np.where((total == 0.0)[:, None], 0.0, out)


def entropy(x, mask, scale):
    w = _scaled(x, mask, scale)
    shift, total, log_total = _stats(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = w - shift[:, None]
        p = np.exp(d) / total[:, None]
        terms = np.where(p == 0.0, 0.0, p * (log_total[:, None] - d))
    return np.where(total == 0.0, 0.0, np.sum(terms, axis=1))


def token_logprobs(x, tokens, scale):
    logp = log_softmax(x, None, scale)
    return np.take_along_axis(logp, tokens[:, None].astype(np.int64), axis=1)[:, 0]


def exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x.astype(F64))


def log(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x.astype(F64))


# -- RL operators -----------------------------------------------------------------

def masked_mean(x, mask):
    n = mask.sum(axis=1)
    s = np.where(mask, x.astype(F64), 0.0).sum(axis=1)
    return np.where(n == 0, 0.0, s / np.maximum(n, 1))


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode="add"):
    x = x.astype(F64)
    mean = masked_mean(x, mask)
    d = x - mean[:, None]
    n = mask.sum(axis=1)
    var = np.where(mask, d * d, 0.0).sum(axis=1) / np.maximum(n - 1 if unbiased else n, 1)
    eps = F64(np.float32(eps))
    out = d / np.sqrt(var + eps if eps_mode == "add" else np.maximum(var, eps))[:, None]
    if not shift_mean:
        out = out + mean[:, None]
    return np.where(mask, out, 0.0)


def _log_ratio(a, b):
    """The float32 log-ratio RN32(a - b) that every float32 implementation starts from (spec 16)."""
    return (a.astype(np.float32) - b.astype(np.float32)).astype(F64)


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    d = _log_ratio(ref_logp, logp)
    if log_ratio_clamp is not None:
        d = np.clip(d, -log_ratio_clamp, log_ratio_clamp)
    with np.errstate(over="ignore", invalid="ignore"):
        out = {"k1": lambda: -d, "abs": lambda: np.abs(d), "k2": lambda: 0.5 * d * d,
               "k3": lambda: np.where(d == np.inf, np.inf, np.expm1(d) - d)}[kind]()
    if clamp is not None:
        out = np.clip(out, -clamp, clamp)
    return out


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    """The recurrence in float64 with the float32 gamma and gamma*lambda the canonical order uses (spec 14)."""
    r, v = rewards.astype(F64), values.astype(F64)
    if mask_mode == "zero":
        r, v = np.where(mask, r, 0.0), np.where(mask, v, 0.0)
    adv, ret = np.empty_like(r), np.empty_like(r)
    next_v, last = bootstrap.astype(F64), np.zeros(r.shape[0])
    for t in range(r.shape[1] - 1, -1, -1):
        cand = (r[:, t] + gamma * next_v - v[:, t]) + gamma_lambda * last
        if mask_mode == "carry":
            next_v = np.where(mask[:, t], v[:, t], next_v)
            last = np.where(mask[:, t], cand, last)
            adv[:, t], ret[:, t] = last, last + v[:, t]
        else:
            next_v, last = v[:, t], cand
            adv[:, t] = np.where(mask[:, t], last, 0.0)
            ret[:, t] = np.where(mask[:, t], last + v[:, t], 0.0)
    return adv, ret


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    d = _log_ratio(logp, old_logp)
    if ratio_clamp is not None:
        d = np.clip(d, -ratio_clamp, ratio_clamp)
    ratio = np.exp(d)
    a = advantages.astype(F64)
    loss1, loss2 = -a * ratio, -a * np.clip(ratio, ratio_low, ratio_high)
    loss = np.maximum(loss1, loss2)
    if dual_clip is not None:
        loss = np.where(a < 0, np.minimum(-a * dual_clip, loss), loss)
    flat_mask = mask.reshape(1, -1)
    non_empty = mask.any(axis=1)[None, :]
    if agg == "token-mean":
        total = masked_mean(loss.reshape(1, -1), flat_mask)[0]
    elif agg == "seq-mean-token-mean":
        total = masked_mean(masked_mean(loss, mask)[None, :], non_empty)[0]
    else:
        total = masked_mean(np.where(mask, loss, 0.0).sum(axis=1)[None, :], non_empty)[0]
        if agg == "seq-mean-token-sum-norm":
            total = total / mask.shape[1]
    frac = masked_mean((loss2 > loss1).astype(F64).reshape(1, -1), flat_mask)[0]
    return total, frac


# -- Filtering and sampling (spec 21-22) --------------------------------------------

def filter_keep(x, scale, top_k, top_p, min_p, slack=0.0):
    """[R, V] -> bool [R, V]: the tokens spec 21's rule keeps, decided in float64 by exact sorting.

    From the float32 logits w = RN32(x * scale) (per-row parameters as the backend contract passes them):
    p_i = exp(w_i - max w); min-p keeps p_i >= min_p (p relative to the largest); top-k keeps the values
    >= the k-th largest kept value; top-p sorts the kept tokens by value and keeps t iff the kept mass
    of strictly larger values is < top_p times the kept mass.

    slack moves both thresholds by a relative amount (min_p * (1 - slack), the top-p bound times
    (1 + slack)); the kept set grows with slack, so slack = +-s brackets every set that float32
    roundings of relative size s can produce.
    """
    keep = np.zeros(x.shape, dtype=bool)
    for r in range(x.shape[0]):
        w = (x[r].astype(np.float32) * np.float32(scale[r])).astype(F64)
        if np.any(np.isnan(w) | (w == np.inf)) or np.all(w == -np.inf):
            continue
        p = np.exp(w - np.max(w))
        kept = (w != -np.inf) & (p >= min_p[r] * (1 - slack))
        if 0 < top_k[r] < w.size:
            kept &= w >= np.sort(np.where(kept, w, -np.inf))[::-1][top_k[r] - 1]
        if top_p[r] < 1:
            values = np.where(kept, w, -np.inf)
            order = np.argsort(-values, kind="stable")
            values, mass = values[order], np.where(kept, p, 0.0)[order]
            before = np.concatenate([[0.0], np.cumsum(mass)[:-1]])          # mass ranked strictly earlier
            # Tied values share the mass ranked above the first of them.
            first = np.searchsorted(-values, -values, side="left")
            above = np.empty(w.size)
            above[order] = before[first]
            kept &= above < F64(np.float32(top_p[r])) * mass.sum() * (1 + slack)
        keep[r] = kept
    return keep


def sample_probabilities(x, scale, top_k, top_p, min_p):
    """[R, V] -> float64 [R, V]: the distribution sample draws from, softmax of w over the kept tokens."""
    keep = filter_keep(x, scale, top_k, top_p, min_p)
    w = (x.astype(np.float32) * np.asarray(scale, dtype=np.float32)[:, None]).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(keep, np.exp(w - np.max(np.where(keep, w, -np.inf), axis=1, keepdims=True)), 0.0)
        return e / e.sum(axis=1, keepdims=True)


# -- Model building blocks (spec 24) ------------------------------------------------
# Each op that spec 24.7 measures against a scale comes with a *_magnitude function: that scale, the same
# computation on the inputs' magnitudes, which bounds how far the roundings of a float32 implementation can move
# the result. It is the floor of the op's ulp measure (spec 10).

def linear(x, weight, bias):
    """x [M, K], weight [N, K], bias [N] or None -> [M, N]: x @ weight.T (+ bias)."""
    y = x.astype(F64) @ weight.astype(F64).T
    return y if bias is None else y + bias.astype(F64)


def linear_magnitude(x, weight, bias):
    """[M, N]: sum_k |x_k w_k| (+ |b|), the scale of the sum over K (spec 10.1)."""
    return linear(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias))


def rms_norm(x, weight, eps):
    """[R, D], weight [D] -> [R, D]: x / sqrt(mean(x^2) + eps) * weight, eps the float32 the op adds (spec 24.2).

    A +-inf entry makes the mean square +inf, so infinite entries give NaN and finite ones +-0, as the spec says;
    squares that overflow float32 but not float64 (|x| >~ 1.8e19) keep their finite meaning, against which the
    spec's +-0 there is about 2^24 ulps off."""
    x = x.astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        ms = np.mean(x * x, axis=1, keepdims=True)
        return x / np.sqrt(ms + F64(np.float32(eps))) * weight.astype(F64)


def _halves(x):
    h = x.shape[-1] // 2
    return x[..., :h].astype(F64), x[..., h:].astype(F64)


def rotary(x, cos, sin):
    """x [..., D], cos and sin broadcasting to [..., D/2] -> [..., D]: [x1 cos - x2 sin, x2 cos + x1 sin]."""
    (x1, x2), c, s = _halves(x), cos.astype(F64), sin.astype(F64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rotary_magnitude(x, cos, sin):
    """[..., D]: |x1 cos| + |x2 sin| and |x2 cos| + |x1 sin|, the scale of each output's one add."""
    (x1, x2), c, s = _halves(np.abs(x)), np.abs(cos).astype(F64), np.abs(sin).astype(F64)
    return np.concatenate([x1 * c + x2 * s, x2 * c + x1 * s], axis=-1)


def attention(q, k, v, kv_lengths, causal, scale):
    """q [G, Tq, D], k and v [G, Tk, D] -> [G, Tq, D]: softmax(q k^T * scale) v over the keys that count
    (canonical.attention_mask, spec 24.4), scale the float32 RN32(1/sqrt(D)) the op uses. Keys that do not count
    are never read, so NaN or inf in unused cache slots changes nothing, as in the spec."""
    mask = canonical.attention_mask(q.shape[1], k.shape[1], kv_lengths, causal)
    used = mask.any(axis=1)[..., None]                                   # [G, Tk, 1]: keys some query reads
    k, v = np.where(used, k, 0.0).astype(F64), np.where(used, v, 0.0).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(mask, np.einsum("gid,gjd->gij", q.astype(F64), k) * scale, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.einsum("gij,gjd->gid", p / p.sum(axis=-1, keepdims=True), v)


def attention_magnitude(q, k, v, kv_lengths, causal, scale):
    """[G, Tq, D]: sum_j p_j |v_jd|, the scale of the sum over the keys."""
    return attention(q, k, np.abs(v), kv_lengths, causal, scale)


def silu_mul(gate, up):
    """[n] twice -> [n]: gate * sigmoid(gate) * up; gate = -inf gives NaN (-inf / inf), as spec 24.5 says."""
    g = gate.astype(F64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g)) * up.astype(F64)


def moe_routing(x, router, top_k, norm_topk_prob=True):
    """(chosen int64 [M, k], weights float64 [M, k]) of Qwen3-MoE's router: the softmax over all E experts in
    float64, taken at the chosen experts, and with norm_topk_prob (the default) divided by their sum; without it
    (HF's norm_topk_prob=False) not divided.

    The chosen experts, in rank order, are those spec 24.6 chooses: the k largest float32 router logits
    linear(x, router) (spec 24.1's bits, which every canonical backend shares), ties to the lowest expert index
    (spec 21). Which experts count is a discrete decision: choosing by the float64 logits would make the meaning
    jump wherever two logits lie within a float32 rounding of each other, which no float32 implementation can
    resolve. So, like RN32(x * scale) for the softmax family, the choice is the float32 one the spec starts from.
    Logits that tie exactly in float64 (equal router rows, an all-zero token) tie in float32 too and resolve
    the same way."""
    _, chosen = canonical.topk(canonical.linear(x, router, None), top_k)
    logits = linear(x, router, None)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    weights = np.take_along_axis(probs, chosen, axis=1)
    return chosen, (weights / weights.sum(axis=1, keepdims=True) if norm_topk_prob else weights)


def _experts(x, gate, up, down, chosen, weights, act):
    """[M, D]: sum over slots s of weights_s * down_e act(gate_e x, up_e x), e = chosen_s, per token."""
    x = x.astype(F64)
    out = np.zeros(x.shape)
    for s in range(chosen.shape[1]):
        e = chosen[:, s]
        g = np.einsum("md,mid->mi", x, gate[e].astype(F64))
        u = np.einsum("md,mid->mi", x, up[e].astype(F64))
        out += weights[:, s:s + 1] * np.einsum("mi,mdi->md", act(g, u), down[e].astype(F64))
    return out


def moe(x, router, gate, up, down, top_k, norm_topk_prob=True):
    """x [M, D], router [E, D], gate and up [E, I, D], down [E, D, I] -> [M, D]: Qwen3-MoE's block, the chosen
    experts' SwiGLU MLPs weighted by moe_routing's weights (norm_topk_prob as there)."""
    chosen, weights = moe_routing(x, router, top_k, norm_topk_prob)
    return _experts(x, gate, up, down, chosen, weights, silu_mul)


def moe_magnitude(x, router, gate, up, down, top_k, norm_topk_prob=True):
    """[M, D]: sum_s wt_s |down_s| (|gate_s| |x| * |up_s| |x|), the magnitude path, wt_s moe_routing's weights
    (norm_topk_prob as there). It bounds how far any rounding inside an expert can move the output
    (|silu(g)| <= |g|, sigmoid' <= 1/4), where the sums inside cancel."""
    chosen, weights = moe_routing(x, router, top_k, norm_topk_prob)
    return _experts(np.abs(x), np.abs(gate), np.abs(up), np.abs(down), chosen, weights, np.multiply)


# -- Backward (spec 26.12, 29.14) ---------------------------------------------------------------
# The gradients' meanings, in float64 from the same binary32 inputs: closed forms of the derivative of the formulas
# above (what float64 autograd of them computes, without its cancellations: entropy's 1 - d(log S)/dw at a dominant
# token, spec 26.12), and float64 torch autograd for moe, whose routing weights make a closed form long. The softmax
# family starts from w = RN32(x * scale) and ends with the multiply by scale; kl_penalty and ppo_policy_loss from the
# binary32 log-ratio; moe at the experts the binary32 router logits choose. Each *_backward returns the gradients
# in the op's argument order; the softmax family and the RL losses also return the floor of spec 26.12's measure.

def _probabilities(w):
    """(p [R, n], d = w - shift, log_total, W) of scaled logits w (-inf where masked): p accurate at a dominant
    token (exp(d - log S) with spec 10's log S), 0 in rows without a finite maximum; W = max(1, max |w| counted)."""
    shift, total, log_total = _stats(w)
    with np.errstate(invalid="ignore", over="ignore"):
        d = w - shift[:, None]
        p = np.where((total == 0.0)[:, None], 0.0, np.exp(d - log_total[:, None]))
    counted = np.where(np.isfinite(w), np.abs(w), 0.0)
    return p, d, log_total, np.maximum(1.0, counted.max(axis=1, keepdims=True))


def softmax_family_backward(op, x, second, scale, g):
    """(dx [R, n], floor [R, 1]) of op in sum, logsumexp, log_softmax, softmax, entropy, token_logprobs: second is
    the mask (None: all counted) or, for token_logprobs, the token ids; g the upstream gradient ([R] for the ops
    with one value per row). Floors are spec 26.12's table (sum: exact data movement, None)."""
    if op == "sum":
        keep = np.ones(x.shape, dtype=bool) if second is None else second
        return np.where(keep, g.astype(F64)[:, None], 0.0), None
    mask = None if op == "token_logprobs" else second
    keep = np.ones(x.shape, dtype=bool) if mask is None else mask
    p, d, log_total, big_w = _probabilities(_scaled(x, mask, scale))
    g64 = g.astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        if op in ("logsumexp", "entropy", "token_logprobs"):
            gr = g64[:, None]
            if op == "logsumexp":
                dx, floor = gr * p, big_w * np.abs(gr) * p.max(axis=1, keepdims=True)
            elif op == "token_logprobs":
                onehot = np.arange(x.shape[1])[None, :] == second[:, None]
                dx, floor = (onehot - p) * gr, big_w * np.abs(gr)
            else:
                # -log p without cancellation; entries with exp(w - shift) = 0 add nothing and get 0 (spec 26.5's
                # select, which keeps them 0 in a NaN row too); NaN propagates elsewhere
                a = np.where(keep, log_total[:, None] - d, 0.0)
                zero = np.exp(d) == 0
                h = np.where(zero, 0.0, p * a).sum(axis=1, keepdims=True)
                dx = np.where(zero, 0.0, p * (a - h)) * gr
                floor = big_w * np.abs(gr) * np.where(zero, 0.0, p * (a + h)).max(axis=1, keepdims=True)
        else:
            gm = np.where(keep, g64, 0.0)
            if op == "log_softmax":
                dx = gm - p * gm.sum(axis=1, keepdims=True)
                floor = big_w * (np.abs(gm) + p * np.abs(gm).sum(axis=1, keepdims=True)).max(axis=1, keepdims=True)
            else:
                dx = p * (gm - (gm * p).sum(axis=1, keepdims=True))
                floor = (p * (np.abs(gm) + (p * np.abs(gm)).sum(axis=1, keepdims=True))).max(axis=1, keepdims=True)
        return np.where(keep, dx * F64(np.float32(scale)), 0.0), floor


def masked_mean_backward(mask, g):
    """dx [R, n] of masked_mean over rows [R, n] (g [R]): g / n at counted entries; the floor |g| / n is dx's own
    magnitude, so the measure is relative (None)."""
    n = mask.sum(axis=1, keepdims=True)
    return np.where(mask, g.astype(F64)[:, None] / np.maximum(n, 1), 0.0), None


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    """(dx [R, n], floor [R, 1]) of masked_whiten over each row: inv (g - gbar) - d inv^3 sum(g d) / k, where the
    clamp holds (var < eps with eps_mode="clamp") inv is a constant and the second term drops; + gbar without
    shift_mean. Floor: spec 26.12's inv * max_i (|g_i| + mean|g| + |z_i| mean|g z|)."""
    x, g = x.astype(F64), np.where(mask, g.astype(F64), 0.0)
    n = np.maximum(mask.sum(axis=1, keepdims=True), 1)
    d = np.where(mask, x - np.where(mask, x, 0.0).sum(axis=1, keepdims=True) / n, 0.0)
    k = np.maximum(mask.sum(axis=1, keepdims=True) - 1, 1) if unbiased else n
    var = (d * d).sum(axis=1, keepdims=True) / k
    eps = F64(np.float32(eps))
    clamped = (var < eps) if eps_mode == "clamp" else np.zeros(var.shape, dtype=bool)
    inv = 1.0 / np.sqrt(np.maximum(var, eps) if eps_mode == "clamp" else var + eps)
    gbar = g.sum(axis=1, keepdims=True) / n
    z = d * inv
    c = np.where(clamped, 0.0, (g * d).sum(axis=1, keepdims=True) / k * inv)
    dx = inv * ((g - gbar) - z * c) + (0.0 if shift_mean else gbar)
    floor = inv * (np.abs(g) + np.abs(g).sum(axis=1, keepdims=True) / n
                   + np.abs(z) * np.abs(g * z).sum(axis=1, keepdims=True) / n).max(axis=1, keepdims=True)
    return np.where(mask, dx, 0.0), floor


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    """(dlogp, dref_logp): g * the estimator's derivative in d = RN32(ref_logp - logp), 0 where a clamp holds (a
    value on a bound passes, spec 26.9), and its sign flip for logp."""
    d0 = _log_ratio(ref_logp, logp)
    d = d0 if log_ratio_clamp is None else np.clip(d0, -log_ratio_clamp, log_ratio_clamp)
    with np.errstate(over="ignore", invalid="ignore"):
        slope = {"k1": lambda: -np.ones_like(d), "abs": lambda: np.sign(d), "k2": lambda: d,
                 "k3": lambda: np.expm1(d)}[kind]()
        gd = g.astype(F64) * slope
        if clamp is not None:
            out = kl_penalty(logp, ref_logp, kind, None, log_ratio_clamp)
            gd = np.where((out < -clamp) | (out > clamp), 0.0, gd)
        if log_ratio_clamp is not None:
            gd = np.where((d0 < -log_ratio_clamp) | (d0 > log_ratio_clamp), 0.0, gd)
    return -gd, gd


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg,
                             g):
    """dlogp [B, T] of the loss (g the scalar upstream gradient): w_b * loss1 where the unclipped loss counts
    (spec 26.10's passes: not clipped, not bounded by the dual clip, the log-ratio within the clamp)."""
    d0 = _log_ratio(logp, old_logp)
    d = d0 if ratio_clamp is None else np.clip(d0, -ratio_clamp, ratio_clamp)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(d)
        a = advantages.astype(F64)
        loss1, loss2 = -a * ratio, -a * np.clip(ratio, ratio_low, ratio_high)
        passes = mask & ~(loss2 > loss1)
        if dual_clip is not None:
            passes &= ~((a < 0) & (-a * dual_clip < np.maximum(loss1, loss2)))
        if ratio_clamp is not None:
            passes &= ~((d0 < -ratio_clamp) | (d0 > ratio_clamp))
        n_b = mask.sum(axis=1, keepdims=True)
        sequences = max(int((n_b > 0).sum()), 1)
        weight = {"token-mean": 1.0 / max(int(mask.sum()), 1), "seq-mean-token-sum": 1.0 / sequences,
                  "seq-mean-token-mean": 1.0 / (sequences * np.maximum(n_b, 1)),
                  "seq-mean-token-sum-norm": 1.0 / (mask.shape[1] * sequences)}[agg]
        return np.where(passes, F64(g) * weight * loss1, 0.0)


def linear_backward(x, weight, bias, g):
    """(dx [M, K], dweight [N, K], dbias [N] or None) of x @ weight.T + bias."""
    g = g.astype(F64)
    return g @ weight.astype(F64), g.T @ x.astype(F64), None if bias is None else g.sum(axis=0)


def rms_norm_backward(x, weight, eps, g):
    """(dx [R, D], dweight [D]): r (u - n sum(u n) / D) with n = x r, u = g weight; dweight = sum over rows of g n."""
    x, g = x.astype(F64), g.astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        r = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + F64(np.float32(eps)))
        n = x * r
        u = g * weight.astype(F64)
        return r * (u - n * (u * n).mean(axis=1, keepdims=True)), (g * n).sum(axis=0)


def rotary_backward(cos, sin, g):
    """dx [..., D]: the transpose of the rotation, [g1 cos + g2 sin, g2 cos - g1 sin]."""
    (g1, g2), c, s = _halves(g), cos.astype(F64), sin.astype(F64)
    return np.concatenate([g1 * c + g2 * s, g2 * c - g1 * s], axis=-1)


def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    """(dq, dk, dv) per group ([G, Tq, D], [G, Tk, D] twice): ds = p (dp - sum_j p dp) * scale with dp = g v^T;
    dq = ds k, dk = ds^T q, dv = p^T g; keys that do not count get 0 (and are never read)."""
    mask = canonical.attention_mask(q.shape[1], k.shape[1], kv_lengths, causal)
    used = mask.any(axis=1)[..., None]
    k, v = np.where(used, k, 0.0).astype(F64), np.where(used, v, 0.0).astype(F64)
    q, g = q.astype(F64), g.astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(mask, np.einsum("gid,gjd->gij", q, k) * scale, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = np.where(mask, p / p.sum(axis=-1, keepdims=True), 0.0)
        dp = np.einsum("gid,gjd->gij", g, v)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * scale
        # dk as a select over the counted (query, key) pairs: a NaN query adds nothing to keys it does not see
        dk = np.where(mask[..., None], ds[..., None] * q[:, :, None, :], 0.0).sum(axis=1)
        return np.einsum("gij,gjd->gid", ds, k), dk, np.einsum("gij,gid->gjd", p, g)


def silu_mul_backward(gate, up, g):
    """(dgate, dup): g up sig (1 + gate (1 - sig)) and g gate sig, sig = 1 / (1 + exp(-gate))."""
    gate, g = gate.astype(F64), g.astype(F64)
    with np.errstate(over="ignore", invalid="ignore"):
        sig = 1.0 / (1.0 + np.exp(-gate))
        return g * up.astype(F64) * sig * (1.0 + gate * (1.0 - sig)), g * gate * sig


def moe_backward(x, router, gate, up, down, top_k, norm_topk_prob, g):
    """(dx, drouter, dgate, dup, ddown) by float64 torch autograd of moe() at moe_routing's chosen experts."""
    import torch
    chosen, _ = moe_routing(x, router, top_k, norm_topk_prob)
    leaves = [torch.tensor(a.astype(F64), requires_grad=True) for a in (x, router, gate, up, down)]
    tx, tr, tg, tu, td = leaves
    ids = torch.from_numpy(chosen)
    weights = torch.softmax(tx @ tr.T, dim=1).gather(1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=1, keepdim=True)
    out = torch.zeros_like(tx)
    for s in range(top_k):
        e = ids[:, s]
        z, u = torch.einsum("md,mid->mi", tx, tg[e]), torch.einsum("md,mid->mi", tx, tu[e])
        out = out + weights[:, s:s + 1] * torch.einsum("mi,mdi->md", z * torch.sigmoid(z) * u, td[e])
    return tuple(t.numpy() for t in torch.autograd.grad(out, leaves, torch.from_numpy(g.astype(F64))))


def embedding_backward(tokens, vocab, g):
    """dweight [V, D]: row v the sum of g's rows at positions holding token v, 0 for tokens that do not occur."""
    out = np.zeros((vocab, g.shape[1]))
    np.add.at(out, tokens, g.astype(F64))
    return out


def adamw_steps(weight, grads, lr, betas, eps, weight_decay):
    """(weight, exp_avg, exp_avg_sq) after torch's AdamW steps (amsgrad off) in float64 from binary32 values."""
    w, m, v = weight.astype(F64), np.zeros(weight.shape), np.zeros(weight.shape)
    b1, b2 = betas
    with np.errstate(over="ignore", invalid="ignore"):
        for t, g in enumerate(grads, 1):
            g = g.astype(F64)
            w = w * (1.0 - lr * weight_decay) if weight_decay else w                    # torch skips a zero decay
            m, v = b1 * m + (1.0 - b1) * g, b2 * v + (1.0 - b2) * g * g
            w = w - lr / (1.0 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1.0 - b2 ** t) + eps)
    return w, m, v


def sgd_steps(weight, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """(weight, momentum buffer or None) after torch's SGD steps in float64 from binary32 values."""
    w, buf = weight.astype(F64), None
    with np.errstate(over="ignore", invalid="ignore"):
        for g in grads:
            g = g.astype(F64) + weight_decay * w if weight_decay else g.astype(F64)      # torch skips a zero decay
            if momentum:
                buf = g if buf is None else momentum * buf + (1.0 - dampening) * g
                g = g + momentum * buf if nesterov else buf
            w = w - lr * g
    return w, buf


def clip_grad_norm(grads, max_norm):
    """(norm, clipped gradients): torch's clip_grad_norm_ in float64: coef = min(1, max_norm / (norm + 1e-6)) in
    IEEE arithmetic (an infinite norm gives 0, a NaN norm NaN)."""
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(np.sum([np.sum(g.astype(F64) ** 2) for g in grads]))
        coef = np.minimum(1.0, max_norm / (norm + 1e-6))
        return norm, [g.astype(F64) * coef for g in grads]
