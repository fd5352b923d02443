"""The canonical float32 order (docs/spec.md), executed by numpy.

This module is the executable form of the spec and the bit-level truth the
other backends are tested against.  Every float32 operation is one IEEE-754
binary32 add, subtract or multiply (numpy's element-wise ufuncs round each
result once and never contract), a comparison, a select (np.where), an exact
bit reinterpretation or an int32 operation.  There is no np.sum, np.exp,
np.log or np.cumsum on float32 data: their orders and roundings are numpy's,
not the spec's.  np.maximum.reduce is used for maxima, which are
order-independent once NaN propagates and zeros are canonicalised (spec 4).

Arrays are 2-D, [rows, n]; every row is computed independently, so a row's
bits cannot depend on the rows around it.
"""

import numpy as np

from .. import spec

F32 = np.float32
I32 = np.int32


def _c(bits):
    return F32(spec.f32(bits))


NEG_ZERO = _c(spec.NEG_ZERO_BITS)
NEG_INF = F32(-np.inf)
POS_INF = F32(np.inf)


def _next_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


# -- Reduction structure (spec 3) -------------------------------------------

def _segment_view(v, fill):
    """[R, N] -> [R, G, C, W]: G segments of C chunks of W lanes, padded with fill.

    W is LANES, or the next power of two >= N when N <= LANES (same bits as
    LANES lanes, because -0.0 padding is an exact identity: spec 3.2).
    C is SEGMENT // LANES, or fewer for a one-segment row.
    """
    r, n = v.shape
    if n <= spec.LANES:
        w, c, g = _next_pow2(n), 1, 1
    elif n <= spec.SEGMENT:
        w, c, g = spec.LANES, -(-n // spec.LANES), 1
    else:
        w, c, g = spec.LANES, spec.SEGMENT // spec.LANES, -(-n // spec.SEGMENT)
    padded = np.full((r, g * c * w), fill, dtype=F32)
    padded[:, :n] = v
    return padded.reshape(r, g, c, w)


def _halving_tree(v):
    """Fold the last axis (a power of two): acc[i] += acc[i + h], h = W/2, W/4, ..., 1."""
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:]
    return v[..., 0]


def _segment_sums(seg):
    """[R, G, C, W] -> [R, G]: lanes accumulate chunks in order, then the halving tree."""
    acc = seg[:, :, 0, :]
    for c in range(1, seg.shape[2]):
        acc = acc + seg[:, :, c, :]
    return _halving_tree(acc)


def _combine_partials(partials):
    """[R, G] -> [R]: the halving tree over segment partials padded to a power of two with -0.0."""
    r, g = partials.shape
    padded = np.full((r, _next_pow2(g)), NEG_ZERO, dtype=F32)
    padded[:, :g] = partials
    return _halving_tree(padded)


def canonical_sum(v):
    """[R, N] float32 -> [R]: the canonical sum of each row (spec 3)."""
    return _combine_partials(_segment_sums(_segment_view(v, NEG_ZERO)))


def _canonical_max(v, axes):
    """NaN-propagating maximum; +0.0 is added so a zero maximum is always +0.0 (spec 4)."""
    return np.maximum.reduce(v, axis=axes) + F32(0.0)


# -- exp (spec 5) -------------------------------------------------------------

def exp(x):
    """Portable float32 exp: Cody-Waite reduction, Cephes polynomial, two-step scaling."""
    x = np.asarray(x, dtype=F32)
    xc = np.minimum(np.maximum(x, _c(spec.EXP_CLAMP_LO_BITS)), _c(spec.EXP_CLAMP_HI_BITS))
    magic = _c(spec.ROUND_MAGIC_BITS)
    t = xc * _c(spec.LOG2E_BITS) + magic            # round(x / ln2) lands in t's low bits
    k = t.view(I32) - I32(spec.ROUND_MAGIC_BITS)     # k as an int32, no float->int conversion
    kf = t - magic                                   # k as a float32, exact
    r = (xc - kf * _c(spec.LN2_HI_BITS)) - kf * _c(spec.LN2_LO_BITS)
    p = _c(spec.EXP_POLY_BITS[0]) * np.ones_like(r)
    for coeff in spec.EXP_POLY_BITS[1:]:
        p = p * r + _c(coeff)
    y = (p * (r * r) + r) + F32(1.0)
    k1 = k >> 1                                      # arithmetic shift: floor(k / 2)
    k2 = k - k1
    y = (y * ((k1 + I32(127)) << 23).view(F32)) * ((k2 + I32(127)) << 23).view(F32)
    y = np.where(x > _c(spec.EXP_HI_BITS), POS_INF, y)
    y = np.where(x <= _c(spec.EXP_LO_BITS), F32(0.0), y)
    return np.where(x != x, x, y).astype(F32, copy=False)


# -- log (spec 6) -------------------------------------------------------------

def log(x):
    """Portable float32 log: integer mantissa reduction to [sqrt(1/2), sqrt(2)), Cephes polynomial."""
    x = np.asarray(x, dtype=F32)
    subnormal = x < _c(spec.MIN_NORMAL_BITS)
    xs = np.where(subnormal, x * _c(spec.LOG_SUBNORMAL_SCALE_BITS), x)
    ix = xs.view(I32)
    e = (ix - I32(spec.LOG_SQRTHALF_BITS)) >> 23
    m = (ix - (e << 23)).view(F32)
    f = m - F32(1.0)                                 # exact (Sterbenz)
    ef = (e - np.where(subnormal, I32(23), I32(0))).astype(F32)   # exact: |e| < 2**24
    z = f * f
    y = _c(spec.LOG_POLY_BITS[0]) * np.ones_like(f)
    for coeff in spec.LOG_POLY_BITS[1:]:
        y = y * f + _c(coeff)
    y = (y * f) * z
    y = y + ef * _c(spec.LOG_LN2_LO_BITS)
    y = y - _c(spec.HALF_BITS) * z
    out = (f + y) + ef * _c(spec.LOG_LN2_HI_BITS)
    out = np.where(x == POS_INF, POS_INF, out)
    out = np.where(x == F32(0.0), NEG_INF, out)
    out = np.where(x < F32(0.0), F32(np.nan), out)
    return np.where(x != x, x, out).astype(F32, copy=False)


# -- reciprocal (spec 7) ------------------------------------------------------

def _split(a):
    c = _c(spec.SPLIT_BITS) * a
    hi = c - (c - a)
    return hi, a - hi


def reciprocal(s):
    """1/s for s in [1, 2**31] (a softmax denominator): Newton steps, then one Dekker-exact correction."""
    s = np.asarray(s, dtype=F32)
    r = (I32(spec.RECIP_MAGIC) - s.view(I32)).view(F32)
    two = _c(spec.TWO_BITS)
    for _ in range(spec.RECIP_NEWTON_STEPS):
        r = r * (two - s * r)
    p = s * r
    sh, sl = _split(s)
    rh, rl = _split(r)
    err = (((sh * rh - p) + sh * rl) + sl * rh) + sl * rl    # s*r - p, exactly
    e = (_c(spec.ONE_BITS) - p) - err
    return r + r * e


# -- Softmax family (spec 8) ----------------------------------------------------

def _scaled(x, mask, scale):
    """w = x * scale_r, one multiply per entry with its row's scale (f32 [R]); masked entries -inf (spec 8.1)."""
    w = x * scale[:, None]
    if mask is not None:
        w = np.where(mask, w, NEG_INF)
    return w


def _two_sum(a, b):
    """s = RN(a + b) and its exact rounding error (Knuth's TwoSum: six operations, no branch)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _softmax_stats(w):
    """[R, N] -> (shift, total, log_total, recip), each [R], by segments (spec 8.2).

    Each segment's exponentials are split into the ones that are exactly 1
    (counted: n_g) and the rest (summed: t_g), so that total - 1 is never
    rounded away when one token dominates: log_total is then accurate to the
    last bit of t, which is what keeps log-probs near 0 and low entropies
    accurate (spec 8.3).
    """
    seg = _segment_view(w, NEG_INF)
    seg_max = _canonical_max(seg, (2, 3))                      # [R, G]
    seg_shift = np.where(seg_max == NEG_INF, F32(0.0), seg_max)
    e = exp(seg - seg_shift[:, :, None, None])                 # [R, G, C, W]
    one = e == F32(1.0)
    # Zeros (masked entries, padding, underflow) enter both sums as -0.0, the exact
    # identity, so an implementation may skip them without changing a bit (spec 8.2).
    seg_count = _segment_sums(np.where(one, F32(1.0), NEG_ZERO))
    seg_rest = _segment_sums(np.where(one | (e == F32(0.0)), NEG_ZERO, e))
    return combine_segment_stats(seg_max, seg_count, seg_rest)


def combine_segment_stats(seg_max, seg_count, seg_rest):
    """The per-segment m_g, n_g, t_g ([R, G] each, segments in order) -> (shift, total, log_total, recip) [R]
    (spec 8.2's second half). The vocab-parallel ops (spec 31.3) gather the segments' values from the ranks
    that hold them and call this on every rank."""
    row_max = _canonical_max(seg_max, 1)                       # [R]
    shift = np.where(row_max == NEG_INF, F32(0.0), row_max)
    c = exp(seg_max - shift[:, None])                          # [R, G]
    top = c == F32(1.0)
    count = _combine_partials(np.where(top, seg_count, NEG_ZERO))
    rest = _combine_partials(np.where(top, seg_rest, c * (seg_count + seg_rest)))
    total, err = _two_sum(count, rest)
    recip = np.where(total == F32(0.0), F32(0.0), reciprocal(total))   # 0 for an empty row
    return shift, total, log(total) + err * recip, recip


def logsumexp(x, mask, scale):
    shift, _, log_total, _ = _softmax_stats(_scaled(x, mask, scale))
    return shift + log_total


def log_softmax(x, mask, scale):
    w = _scaled(x, mask, scale)
    shift, total, log_total, _ = _softmax_stats(w)
    out = (w - shift[:, None]) - log_total[:, None]
    return np.where((total == F32(0.0))[:, None], NEG_INF, out)


def softmax(x, mask, scale):
    w = _scaled(x, mask, scale)
    shift, _, _, recip = _softmax_stats(w)
    return exp(w - shift[:, None]) * recip[:, None]


def entropy(x, mask, scale):
    """H = sum_i p_i * (log S - (w_i - shift)): every term >= 0, so nothing cancels (spec 8.5)."""
    w = _scaled(x, mask, scale)
    shift, _, log_total, recip = _softmax_stats(w)
    d = w - shift[:, None]
    e = exp(d)
    terms = (e * recip[:, None]) * (log_total[:, None] - d)
    terms = np.where(e == F32(0.0), NEG_ZERO, terms)
    return canonical_sum(terms) + F32(0.0)


def token_logprobs(x, tokens, scale):
    """[R, V], tokens [R], scale f32 [R] -> [R]: log_softmax(x)[r, tokens[r]], bit for bit."""
    w = _scaled(x, None, scale)
    shift, total, log_total, _ = _softmax_stats(w)
    chosen = np.take_along_axis(w, tokens[:, None].astype(np.int64), axis=1)[:, 0]
    out = (chosen - shift) - log_total
    return np.where(total == F32(0.0), NEG_INF, out)


def sum(x, mask):  # noqa: A001 - the op's public name
    if mask is not None:
        x = np.where(mask, x, NEG_ZERO)
    return canonical_sum(x)


# -- RL operators (spec 14-17) --------------------------------------------------

def _nan_clamp(v, low, high):
    """min(max(v, low), high) with NaN propagated (np.maximum/np.minimum propagate NaN)."""
    return np.minimum(np.maximum(v, F32(low)), F32(high))


def count(mask):
    """[R, N] bool -> [R] float32: how many entries count, as an exact integer rounded once to float32."""
    return mask.sum(axis=1, dtype=np.int64).astype(F32)


def _count_reciprocal(n):
    """1/n for a count n >= 1 (spec 7's domain), and 0 for n = 0, so that an empty mean is 0."""
    return np.where(n == F32(0.0), F32(0.0), reciprocal(np.maximum(n, F32(1.0))))


def masked_mean(x, mask):
    """[R, N] -> [R]: canonical sum of the counted entries times 1/count; +0.0 for an empty row (spec 15.1)."""
    return canonical_sum(np.where(mask, x, NEG_ZERO)) * _count_reciprocal(count(mask)) + F32(0.0)


def rsqrt(y):
    """1/sqrt(y) for y > 0 (a variance plus eps): Newton steps from the bit-trick guess (spec 15.2)."""
    y = np.asarray(y, dtype=F32)
    r = (I32(spec.RSQRT_MAGIC) - (y.view(I32) >> 1)).view(F32)
    h = _c(spec.HALF_BITS) * y
    for _ in range(spec.RSQRT_NEWTON_STEPS):
        r = r * (_c(spec.THREE_HALVES_BITS) - (h * r) * r)
    return np.where(y == POS_INF, F32(0.0), r)


def _floored(var, eps, eps_mode):
    """var + eps ("add", verl/TRL) or max(var, eps) ("clamp", OpenRLHF), NaN-propagating (spec 15.3)."""
    return var + F32(eps) if eps_mode == "add" else np.maximum(var, F32(eps))


def _whiten_stats(x, mask, unbiased, eps, eps_mode):
    """[R, N] -> (mean, d, rk, var, inv) of spec 15.3, which masked_whiten and its backward both use:
    d = x - mean, rk = reciprocal(float(max(n - 1, 1))) (unbiased; max(n, 1) biased), var = ss * rk."""
    mean = masked_mean(x, mask)
    d = x - mean[:, None]
    ss = canonical_sum(np.where(mask, d * d, NEG_ZERO))
    n = mask.sum(axis=1, dtype=np.int64)
    rk = reciprocal(np.maximum(n - 1 if unbiased else n, 1).astype(F32))
    var = ss * rk
    return mean, d, rk, var, rsqrt(_floored(var, eps, eps_mode))


def masked_whiten(x, mask, shift_mean, unbiased, eps, eps_mode):
    """[R, N] -> [R, N]: (x - mean) * rsqrt(var + eps) (or max(var, eps)) per row over counted entries; 0 where not
    counted (spec 15.3)."""
    mean, d, _, _, inv = _whiten_stats(x, mask, unbiased, eps, eps_mode)
    out = d * inv[:, None]
    if not shift_mean:
        out = out + mean[:, None]
    return np.where(mask, out, F32(0.0))


def _k3_phi(d):
    """phi(d) = (e^d - 1 - d) / d^2 by Horner from the highest degree (spec 16)."""
    phi = _c(spec.K3_SERIES_BITS[0]) * np.ones_like(d)
    for coeff in spec.K3_SERIES_BITS[1:]:
        phi = phi * d + _c(coeff)
    return phi


def _k3(d):
    """e^d - 1 - d without cancellation: d*d * phi(d) by its Taylor series for |d| < 1 (spec 16)."""
    series = (d * d) * _k3_phi(d)
    direct = (exp(d) - F32(1.0)) - d
    out = np.where(np.abs(d) < _c(spec.K3_SERIES_LIMIT_BITS), series, direct)
    return np.where(d == POS_INF, POS_INF, out)


def kl_penalty(logp, ref_logp, kind, clamp, log_ratio_clamp):
    """[n] -> [n]: KL estimators of d = ref_logp - logp (verl's convention, spec 16)."""
    d = ref_logp - logp
    if log_ratio_clamp is not None:
        d = _nan_clamp(d, -log_ratio_clamp, log_ratio_clamp)
    if kind == "k1":
        out = -d
    elif kind == "abs":
        out = np.abs(d)
    elif kind == "k2":
        out = (d * d) * _c(spec.HALF_BITS)
    else:
        out = _k3(d)
    if clamp is not None:
        out = _nan_clamp(out, -clamp, clamp)
    return out


def gae(rewards, values, mask, bootstrap, gamma, gamma_lambda, mask_mode):
    """[B, T] -> (advantages, returns): the reverse recurrence, one float32 operation at a time (spec 14)."""
    g, gl = F32(gamma), F32(gamma_lambda)
    adv = np.empty_like(rewards)
    ret = np.empty_like(rewards)
    next_v = bootstrap.astype(F32, copy=True)
    last = np.zeros_like(next_v)
    if mask_mode == "zero":
        rewards = np.where(mask, rewards, F32(0.0))
        values = np.where(mask, values, F32(0.0))
    for t in range(rewards.shape[1] - 1, -1, -1):
        r, v, m = rewards[:, t], values[:, t], mask[:, t]
        delta = (r + g * next_v) - v
        cand = delta + gl * last
        if mask_mode == "carry":
            next_v = np.where(m, v, next_v)
            last = np.where(m, cand, last)
            adv[:, t] = last
            ret[:, t] = last + v
        else:
            next_v = v
            last = cand
            adv[:, t] = np.where(m, last, F32(0.0))
            ret[:, t] = np.where(m, last + v, F32(0.0))
    return adv, ret


def _ppo_surrogates(logp, old_logp, advantages, ratio_low, ratio_high, ratio_clamp):
    """[B, T] -> (d0, neg_adv, loss1, loss2) of spec 17.1, which the loss and its backward both use:
    d0 = logp - old_logp, the ratio exp(d0 clamped to +-ratio_clamp), loss1 and the clipped loss2."""
    d0 = logp - old_logp
    d = d0 if ratio_clamp is None else _nan_clamp(d0, -ratio_clamp, ratio_clamp)
    ratio = exp(d)
    neg_adv = -advantages
    return d0, neg_adv, neg_adv * ratio, neg_adv * _nan_clamp(ratio, ratio_low, ratio_high)


def ppo_token_losses(logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp):
    """[B, T] -> (loss per token, clipped per token): verl's clipped surrogate (spec 17.1)."""
    _, neg_adv, loss1, loss2 = _ppo_surrogates(logp, old_logp, advantages, ratio_low, ratio_high, ratio_clamp)
    clipped = loss2 > loss1
    loss = np.maximum(loss1, loss2)
    if dual_clip is not None:
        loss = np.where(advantages < F32(0.0), np.minimum(neg_adv * F32(dual_clip), loss), loss)
    return loss, clipped


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    """[B, T] -> (loss, clip fraction) as 0-d float32 arrays (spec 17.2): the sequence modes average over the
    non-empty sequences."""
    loss, clipped = ppo_token_losses(logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp)
    non_empty = mask.any(axis=1)[None, :]
    if agg == "token-mean":
        total = masked_mean(loss.reshape(1, -1), mask.reshape(1, -1))
    elif agg == "seq-mean-token-mean":
        total = masked_mean(masked_mean(loss, mask)[None, :], non_empty)
    else:
        total = masked_mean(canonical_sum(np.where(mask, loss, NEG_ZERO))[None, :], non_empty)
        if agg == "seq-mean-token-sum-norm":
            total = total * reciprocal(F32(mask.shape[1]))
    frac = masked_mean(np.where(clipped, F32(1.0), F32(0.0)).reshape(1, -1), mask.reshape(1, -1))
    return total[0], frac[0]


# -- Backward (spec 26) ----------------------------------------------------------------
# Each function takes the forward's inputs (or its output, where spec 26 says so) and the
# upstream gradient g, and returns the gradient of the first differentiable input.  Entries
# that do not count (mask False) get +0.0.  The softmax family's scale is f32 [R], one per row,
# as in the forward.

def _counted(mask, v):
    """select(mask, v, +0.0); mask None means every entry counts."""
    return v if mask is None else np.where(mask, v, F32(0.0))


def _log_probs(w):
    """[R, N] scaled, masked logits -> the forward's log_softmax of them, bit for bit (spec 8.3)."""
    shift, total, log_total, _ = _softmax_stats(w)
    out = (w - shift[:, None]) - log_total[:, None]
    return np.where((total == F32(0.0))[:, None], NEG_INF, out)


def logsumexp_backward(x, mask, scale, g):
    """dx_i = (g * P_i) * scale with P_i = exp(log_softmax_i) (spec 26.2)."""
    p = exp(_log_probs(_scaled(x, mask, scale)))
    return _counted(mask, (g[:, None] * p) * scale[:, None])


def _counted_or_neg_zero(mask, v):
    """select(mask, v, -0.0): the summand of a canonical sum over the entries that count."""
    return v if mask is None else np.where(mask, v, NEG_ZERO)


def log_softmax_backward(y, mask, scale, g):
    """From the forward's output y: dx_i = (g_i - exp(y_i) * G) * scale, G = canonical sum of g (spec 26.3)."""
    big_g = canonical_sum(_counted_or_neg_zero(mask, g))
    return _counted(mask, (g - exp(y) * big_g[:, None]) * scale[:, None])


def softmax_backward(p, mask, scale, g):
    """From the forward's output p: dx_i = (p_i * (g_i - G)) * scale, G = canonical sum of g * p (spec 26.4)."""
    big_g = canonical_sum(_counted_or_neg_zero(mask, g * p))
    return _counted(mask, (p * (g - big_g[:, None])) * scale[:, None])


def entropy_backward(x, mask, scale, h, g):
    """dx_i = ((q_i * (a_i - H)) * g) * scale with the forward's q_i = e_i * recip, a_i = log S - d_i (spec 26.5)."""
    w = _scaled(x, mask, scale)
    shift, _, log_total, recip = _softmax_stats(w)
    d = w - shift[:, None]
    e = exp(d)
    q = e * recip[:, None]
    a = log_total[:, None] - d
    out = ((q * (a - h[:, None])) * g[:, None]) * scale[:, None]
    return _counted(mask, np.where(e == F32(0.0), F32(0.0), out))


def token_logprobs_backward(x, tokens, scale, g):
    """dx_i = (select(i == t, g, +0.0) - P_i * g) * scale, P_i = exp(log_softmax_i) (spec 26.6)."""
    p = exp(_log_probs(_scaled(x, None, scale)))
    hit = np.arange(x.shape[1])[None, :] == tokens[:, None]
    return (np.where(hit, g[:, None], F32(0.0)) - p * g[:, None]) * scale[:, None]


def masked_mean_backward(mask, g):
    """dx_i = select(m_i, g * R, +0.0), R the forward's 1/count (spec 26.7)."""
    return np.where(mask, g[:, None] * _count_reciprocal(count(mask))[:, None], F32(0.0))


def masked_whiten_backward(x, mask, shift_mean, unbiased, eps, eps_mode, g):
    """The forward's mean, d, 1/divisor and inv, then (spec 26.8):
    dx = ((g - gbar) - z * c) * inv (+ gbar when shift_mean is False), z = d * inv, c = (gd * rk) * inv,
    and c = +0.0 where eps_mode="clamp" holds the variance at eps (var < eps)."""
    _, d, rk, var, inv = _whiten_stats(x, mask, unbiased, eps, eps_mode)
    g_bar = masked_mean(g, mask)
    gd = canonical_sum(np.where(mask, g * d, NEG_ZERO))
    z = d * inv[:, None]
    c = (gd * rk) * inv
    if eps_mode == "clamp":
        c = np.where(var < F32(eps), F32(0.0), c)
    out = ((g - g_bar[:, None]) - z * c[:, None]) * inv[:, None]
    if not shift_mean:
        out = out + g_bar[:, None]
    return np.where(mask, out, F32(0.0))


def _k3_derivative(d):
    """e^d - 1 without cancellation: d + d*d * phi(d) (the forward's series) for |d| < 1 (spec 26.9)."""
    series = d + (d * d) * _k3_phi(d)
    direct = exp(d) - F32(1.0)
    return np.where(np.abs(d) < _c(spec.K3_SERIES_LIMIT_BITS), series, direct)


def _outside(v, bound):
    """v < -bound or v > bound: False for NaN, so a NaN gradient passes every clamp (spec 26.9)."""
    return (v < F32(-bound)) | (v > F32(bound))


def kl_penalty_backward(logp, ref_logp, kind, clamp, log_ratio_clamp, g):
    """[n] -> [n]: the gradient w.r.t. ref_logp; logp's is its sign flip (spec 26.9)."""
    d0 = ref_logp - logp
    d = d0 if log_ratio_clamp is None else _nan_clamp(d0, -log_ratio_clamp, log_ratio_clamp)
    if kind == "k1":
        gd = -g
    elif kind == "abs":
        sign = np.where(d > F32(0.0), F32(1.0), np.where(d < F32(0.0), F32(-1.0), F32(0.0)))
        gd = g * np.where(d != d, d, sign)
    elif kind == "k2":
        gd = g * d
    else:
        gd = g * _k3_derivative(d)
    if clamp is not None:
        gd = np.where(_outside(kl_penalty(logp, ref_logp, kind, None, log_ratio_clamp), clamp), F32(0.0), gd)
    if log_ratio_clamp is not None:
        gd = np.where(_outside(d0, log_ratio_clamp), F32(0.0), gd)
    return gd


def ppo_token_weights(mask, agg, g):
    """[B, T] -> f32 [B, 1]: d(loss)/d(token loss) of each sequence's counted tokens (spec 26.10)."""
    sequences = _count_reciprocal(F32(mask.any(axis=1).sum()))        # R(E), E the non-empty sequences
    if agg == "token-mean":
        weight = np.full(mask.shape[0], g * _count_reciprocal(F32(mask.sum())), dtype=F32)
    elif agg == "seq-mean-token-sum":
        weight = np.full(mask.shape[0], g * sequences, dtype=F32)
    elif agg == "seq-mean-token-sum-norm":
        weight = np.full(mask.shape[0], (g * reciprocal(F32(mask.shape[1]))) * sequences, dtype=F32)
    else:
        weight = (g * sequences) * _count_reciprocal(count(mask))
    return weight[:, None]


def ppo_policy_loss_backward(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp,
                             agg, g):
    """[B, T] -> f32 [B, T]: the gradient w.r.t. logp; g is the loss's upstream gradient, f32 [1] (spec 26.10).

    A token passes its slope d(loss1)/d(logp) = loss1 unless the clip, the dual clip or the log-ratio
    clamp holds its loss constant there."""
    d0, neg_adv, loss1, loss2 = _ppo_surrogates(logp, old_logp, advantages, ratio_low, ratio_high, ratio_clamp)
    passes = mask & ~(loss2 > loss1)
    if dual_clip is not None:
        passes &= ~((advantages < F32(0.0)) & (neg_adv * F32(dual_clip) < np.maximum(loss1, loss2)))
    if ratio_clamp is not None:
        passes &= ~_outside(d0, ratio_clamp)
    return np.where(passes, ppo_token_weights(mask, agg, F32(g[0])) * loss1, F32(0.0))


# -- Counter-based random numbers (spec 19) ------------------------------------------

_U32 = np.uint64(0xFFFFFFFF)


def philox(counters, keys):
    """Philox4x32-10: uint32 counters [..., 4] and keys [..., 2] -> uint32 [..., 4] (Random123's order).

    Each round: (c0, c1, c2, c3) <- (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)),
    then the key is bumped by (W0, W1). The 32x32 -> 64-bit products are exact in uint64.
    """
    c = [np.asarray(counters, dtype=np.uint64)[..., i] for i in range(4)]
    k0, k1 = (np.asarray(keys, dtype=np.uint64)[..., i] for i in range(2))
    for _ in range(spec.PHILOX_ROUNDS):
        p0 = np.uint64(spec.PHILOX_M0) * c[0]
        p1 = np.uint64(spec.PHILOX_M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
        k0 = (k0 + np.uint64(spec.PHILOX_W0)) & _U32
        k1 = (k1 + np.uint64(spec.PHILOX_W1)) & _U32
    return np.stack(c, axis=-1).astype(np.uint32)


def _split64(v):
    """int64 [R] -> (low, high) uint32 words of the two's-complement pattern."""
    u = np.asarray(v, dtype=np.int64).view(np.uint64)
    return (u & _U32).astype(np.uint32), (u >> np.uint64(32)).astype(np.uint32)


def race_noise(seeds, positions, n):
    """[R] seeds and positions (int64) -> f32 [R, n]: log(E) of token i's Exp(1) variate (spec 20).

    Token i of a row takes two words of Philox(counter = (i >> 1, pos_lo, pos_hi, SAMPLE_STREAM),
    key = (seed_lo, seed_hi)): words 0, 1 for even i, words 2, 3 for odd i.
    """
    rows = len(seeds)
    pairs = (n + 1) // 2
    counters = np.zeros((rows, pairs, 4), dtype=np.uint32)
    counters[:, :, 0] = np.arange(pairs, dtype=np.uint32)[None, :]
    counters[:, :, 1], counters[:, :, 2] = (w[:, None] for w in _split64(positions))
    counters[:, :, 3] = spec.SAMPLE_STREAM
    keys = np.stack(_split64(seeds), axis=-1)[:, None, :].repeat(pairs, axis=1)
    words = philox(counters, keys).reshape(rows, 2 * pairs, 2)[:, :n]     # [R, n, 2]: (a, b) per token
    return log(_exponential(words[..., 0], words[..., 1]))


def _exponential(a_word, b_word):
    """Two uint32 words -> an Exp(1) variate E = -log(1 - U), U uniform in (0, 1) (spec 20).

    U has 24 random bits where U >= 2**-8, and 23 more below, so that small E (which is what
    lets an unlikely token win the race) is resolved down to 2**-47 rather than 2**-24.
    """
    a = (a_word >> np.uint32(8)).astype(I32)                     # 24 bits
    b = (b_word >> np.uint32(9)).astype(I32)                     # 23 bits
    coarse_v = a.astype(F32) * _c(spec.TWO_M24_BITS)             # exact
    coarse = a >= I32(spec.UNIFORM_COARSE_MIN)
    v = np.where(coarse, coarse_v,
                 coarse_v + (I32(2) * b + I32(1)).astype(F32) * _c(spec.TWO_M48_BITS))
    big = -log(F32(1.0) - v)                                     # 1 - v is exact on the coarse grid
    s = v * _c(spec.THIRD_BITS)
    s = s + _c(spec.HALF_BITS)
    s = (v * v) * s
    small = v + s                                                # v + v**2/2 + v**3/3, relative error < 2**-26
    return np.where(coarse, big, small)


# -- Selection and sampling (spec 21-22) ------------------------------------------------

def _order_keys(x):
    """f32 [...] -> int64 [...], ordered as the spec orders values: numerically, -0.0 == +0.0, NaN lowest."""
    b = (x + F32(0.0)).view(I32).astype(np.int64)               # -0.0 -> +0.0
    key = np.where(b < 0, np.int64(-(1 << 31)) - 1 - (b & 0x7FFFFFFF), b)
    return np.where(x != x, np.int64(-(1 << 33)), key)


def topk(x, k):
    """[R, N] -> (values f32 [R, k], indices int64 [R, k]): by value descending, then index ascending (spec 21)."""
    order = np.argsort(-_order_keys(x), axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=1), order.astype(np.int64)


def _invalid_rows(w):
    """Rows holding a NaN or +inf logit: they have no distribution (spec 22)."""
    return np.any((w != w) | (w == POS_INF), axis=1)


def _kth_largest(w, k):
    """[R, V], k [R] (1 <= k <= V) -> [R]: the k-th largest value of each row, counting repeats."""
    return np.array([np.partition(row, row.size - kk)[row.size - kk] for row, kk in zip(w, k)], dtype=F32)


def _mass_above(keep, w, e, v):
    """[R] -> [R]: canonical sum of e_j over the kept j with w_j > v_r (spec 21, top-p)."""
    return canonical_sum(np.where(keep & (w > v[:, None]), e, NEG_ZERO))


def _top_p_floor(keep, w, e, thr):
    """[R] -> [R]: the smallest kept value v with mass_above(v) < thr, by bisection over each row's
    distinct kept values. mass_above is non-increasing in v, so any search gives this value."""
    rows = w.shape[0]
    # Distinct kept values, descending, behind a +inf sentinel: mass_above(+inf) = -0.0 < thr.
    values = [np.concatenate([[POS_INF], np.unique(w[r][keep[r]])[::-1]]).astype(F32) for r in range(rows)]
    lo = np.zeros(rows, dtype=np.int64)                               # mass_above(values[lo]) < thr holds
    hi = np.array([len(v) for v in values], dtype=np.int64)           # it fails at hi (or hi is past the end)
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        probe = np.array([values[r][min(mid[r], len(values[r]) - 1)] for r in range(rows)], dtype=F32)
        below = _mass_above(keep, w, e, probe) < thr
        active = hi - lo > 1
        lo = np.where(active & below, mid, lo)
        hi = np.where(active & ~below, mid, hi)
    return np.array([values[r][lo[r]] for r in range(rows)], dtype=F32)


def filter_logits(x, scale, top_k, top_p, min_p):
    """[R, V] -> [R, V]: w = x * scale with the tokens min-p, top-k and top-p remove set to -inf (spec 21).

    scale f32 [R]; top_k int [R] (0: off); top_p f32 [R] (1: off); min_p f32 [R] (0: off).
    Rows holding a NaN or +inf logit come out all NaN.
    """
    w = x * scale[:, None]
    bad = _invalid_rows(w)
    w = np.where(bad[:, None], NEG_INF, w)                           # keeps the steps below NaN-free
    row_max = _canonical_max(w, 1)
    shift = np.where(row_max == NEG_INF, F32(0.0), row_max)
    e = exp(w - shift[:, None])
    keep = w != NEG_INF
    # min-p: p_i >= min_p * p_max  <=>  exp(w_i - max) >= min_p.
    use = min_p > F32(0.0)
    keep &= ~use[:, None] | (e >= min_p[:, None])
    # top-k: keep the values >= the k-th largest value left (ties with it stay).
    use = (top_k > 0) & (top_k < w.shape[1])
    if np.any(use):
        left = np.where(keep, w, NEG_INF)
        tau = _kth_largest(left[use], top_k[use])
        keep[use] &= left[use] >= tau[:, None]
    # top-p: keep t iff the mass of the kept tokens above t is < p * (the kept mass).
    use = top_p < F32(1.0)
    if np.any(use):
        ek = np.where(keep, e, NEG_ZERO)[use]
        thr = top_p[use] * canonical_sum(ek)
        floor = _top_p_floor(keep[use], w[use], ek, thr)
        keep[use] &= w[use] >= floor[:, None]
    out = np.where(keep, w, NEG_INF)
    return np.where(bad[:, None], F32(np.nan), out)


def _first_argmax(v):
    """[R, V] -> int64 [R]: the lowest index holding the row's maximum; -1 where every value is -inf."""
    idx = np.argmax(v, axis=1).astype(np.int64)                   # numpy returns the first maximum
    return np.where(np.max(v, axis=1) == NEG_INF, np.int64(-1), idx)


def sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions):
    """[R, V] -> int64 [R]: the sampled token of each row, -1 where there is none (spec 22).

    A greedy row takes the lowest-index maximum of x. Any other row takes the lowest-index
    maximum of (f_i - shift) - log(E_i), f = filter_logits(...), shift its row maximum, E_i token i's
    Exp(1) variate (the exponential
    race, i.e. Gumbel-max in log space). A row holding a NaN or +inf logit, or no finite one, gives -1.
    """
    f = filter_logits(x, scale, top_k, top_p, min_p)
    bad = np.isnan(f[:, 0])
    # Scores relative to the row maximum (kept whenever anything is): f - shift rounds at the scale of
    # the difference for every token that can win, so ties do not grow with the logits' magnitude.
    top = np.max(np.where(bad[:, None], NEG_INF, f), axis=1) + F32(0.0)
    shift = np.where(top == NEG_INF, F32(0.0), top)
    scores = (f - shift[:, None]) - race_noise(seeds, positions, x.shape[1])
    w = np.where(greedy[:, None], x, scores)
    return np.where(bad, np.int64(-1), _first_argmax(np.where(bad[:, None], NEG_INF, w)))


# -- Model building blocks (spec 24) ----------------------------------------------

# linear (spec 24.1) is exact integer arithmetic. The exact sums S are formed from base-2^13 digits (three per
# entry: |Q| <= 2^38) multiplied in binary64 matrix products: every digit, product (at most (2^12 + 1)^2) and
# partial sum (K <= 2^28 per product) is an integer below 2^53, so every binary64 operation on them is exact in any
# order, and the products are read back as int64 and carried into 30-bit limbs. Nothing is rounded until
# round_scaled rounds S once, with integer operations. (The two-limb form below holds S for K < 2^26.)
_DIGIT_BITS = 13
_DIGITS = 3
_EXACT_K = 1 << 28
_LIMB_BITS = 30           # S = hi * 2^30 + lo with 0 <= lo < 2^30, both int64


def _bit_length(v):
    """int64 [...] >= 0 -> the number of significant bits (0 for 0), by shifts and compares."""
    v = v.astype(np.int64)
    n = np.zeros(v.shape, dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= (np.int64(1) << shift)
        n = np.where(big, n + shift, n)
        v = np.where(big, v >> shift, v)
    return n + (v > 0)


def _rne_shift(m, r):
    """m in [0, 2^63) and r >= 0 (int64 arrays) -> RNE(m / 2^r), ties to even (0 for r >= 64)."""
    s = np.clip(r, 1, 63)
    q = m >> s
    rem = m - (q << s)
    half = np.int64(1) << (s - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    return np.where(r == 0, m, np.where(r >= 64, np.int64(0), q))


def quantise_rows(v, bits):
    """v [R, K] binary32 -> (Q int64 [R, K], E int64 [R], finite bool [R]) (spec 24.1): E the largest exponent
    e(v) = floor(log2|v|) of the row's nonzero entries, read from the bit patterns (subnormals by the bit length of
    their significand), and Q = RNE(v * 2^(bits - 2 - E)) in [-2^(bits-1), 2^(bits-1)]. An all-zero row has E = 0
    and Q = 0. A row holding NaN or +-inf is not finite; its Q and E are 0 (spec 24.1 decides its outputs)."""
    finite = np.all(np.isfinite(v), axis=1)
    pattern = np.where(np.isfinite(v), v, F32(0.0)).view(I32).astype(np.int64)
    magnitude = pattern & 0x7FFFFFFF
    biased = magnitude >> 23
    fraction = magnitude & 0x7FFFFF
    normal = biased >= 1
    m = np.where(normal, fraction | 0x800000, fraction)                    # |v| = m * 2^s
    s = np.where(normal, biased - 150, np.int64(-149))
    e = np.where(normal, biased - 127, _bit_length(fraction) - 150)
    nonzero = magnitude != 0
    exponent = np.max(np.where(nonzero, e, np.int64(-1 << 20)), axis=1, initial=-1 << 20)
    exponent = np.where(np.any(nonzero, axis=1) & finite, exponent, np.int64(0))
    t = s + (bits - 2) - exponent[:, None]                                  # |Q| = RNE(m * 2^t)
    q = np.where(t >= 0, m << np.clip(t, 0, 62), _rne_shift(m, np.maximum(-t, 0)))
    q = np.where(finite[:, None], np.where(pattern < 0, -q, q), np.int64(0))
    return q, exponent, finite


def _digits(q):
    """int64 Q, |Q| <= 2^38 -> _DIGITS binary64 planes d_i with Q = sum_i d_i 2^(13 i), d_i in [-2^12, 2^12) below
    the top one."""
    out = []
    for _ in range(_DIGITS - 1):
        low = ((q + (1 << (_DIGIT_BITS - 1))) & ((1 << _DIGIT_BITS) - 1)) - (1 << (_DIGIT_BITS - 1))
        out.append(low.astype(np.float64))
        q = (q - low) >> _DIGIT_BITS
    return out + [q.astype(np.float64)]


def exact_products(qx, qw):
    """Qx [M, K], Qw [N, K] int64 -> (hi, lo) int64 [M, N] with S = sum_k Qx[m, k] Qw[n, k] = hi * 2^30 + lo,
    0 <= lo < 2^30, exactly: the digit products per K chunk (each exact, see above), each split at 2^30 and added
    at its weight 2^(13 (i + j)) into three 30-bit limbs, then carried."""
    m, n = qx.shape[0], qw.shape[0]
    limbs = [np.zeros((m, n), dtype=np.int64) for _ in range(3)]
    mask = (1 << _LIMB_BITS) - 1
    for start in range(0, max(qx.shape[1], 1), _EXACT_K):
        xd, wd = _digits(qx[:, start:start + _EXACT_K]), _digits(qw[:, start:start + _EXACT_K])
        for i in range(_DIGITS):
            for j in range(_DIGITS):
                p = (xd[i] @ wd[j].T).astype(np.int64)                      # |p| < 2^53
                limb, shift = divmod(_DIGIT_BITS * (i + j), _LIMB_BITS)     # limb <= 1, shift < 30
                limbs[limb] = limbs[limb] + ((p & mask) << shift)           # < 2^59
                limbs[limb + 1] = limbs[limb + 1] + ((p >> _LIMB_BITS) << shift)
        for j in range(2):                                                    # carry: 0 <= limbs[0], limbs[1] < 2^30
            limbs[j + 1] = limbs[j + 1] + (limbs[j] >> _LIMB_BITS)
            limbs[j] = limbs[j] & mask
    return (limbs[2] << _LIMB_BITS) + limbs[1], limbs[0]


def round_scaled(hi, lo, p):
    """(hi, lo) int64 [...] holding S = hi * 2^30 + lo, p int64 [...] -> binary32 [...]: S * 2^p rounded once to
    nearest, ties to even, on the subnormal grid below 2^-126, +-inf from 2^128 (1 - 2^-25) up; +0.0 for S = 0
    (spec 24.1). Integer work only: |S| is cut to its top 62 bits (the bits below kept as a sticky bit), shifted
    right with round-half-even to 24 bits (fewer on the subnormal grid), and packed with its exponent."""
    negative = hi < 0
    borrow = negative & (lo > 0)                                             # |S| = mag_hi * 2^30 + mag_lo
    mag_hi = np.where(negative, -hi - borrow, hi)
    mag_lo = np.where(borrow, (1 << _LIMB_BITS) - lo, np.where(negative, np.int64(0), lo))
    length = np.where(mag_hi > 0, _bit_length(mag_hi) + _LIMB_BITS, _bit_length(mag_lo))
    drop = np.maximum(length - 62, 0)                                        # <= 30 while mag_hi < 2^62
    window = (mag_hi << (_LIMB_BITS - drop)) | (mag_lo >> drop)              # |S| >> drop, below 2^62
    sticky = ((mag_lo & ((np.int64(1) << drop) - 1)) != 0).astype(np.int64)
    r = np.maximum(length - 24, -149 - p)                                    # the result's lsb is 2^(r + p)
    shift = r - drop                                                         # > 0 wherever drop > 0
    # The dropped bits enter as one sticky bit below the window: a tie can then only be a true tie.
    q = np.where(shift <= 0, window << np.clip(-shift, 0, 62), _rne_shift((window << 1) | sticky, shift + 1))
    pattern = ((r + p + 149) << 23) + q                                      # q = 2^24 carries into the exponent
    pattern = np.where(length == 0, np.int64(0), np.minimum(pattern, np.int64(0x7F800000)))
    pattern = np.where(negative, pattern | 0x80000000, pattern)
    return pattern.astype(np.uint32).view(F32)


def _nonfinite_pairs(x, weight):
    """x [M, K], weight [N, K] -> (special bool [M, N], value binary32 [M, N]): the pairs whose x row or weight
    row holds NaN or +-inf, and their IEEE result over the exact products (spec 24.1): NaN if a product is NaN
    (a NaN factor or +-inf * +-0) or +inf and -inf both occur, else the infinity the products hold. Counts of
    0/1 indicators are exact in binary64 products."""
    special = (~np.all(np.isfinite(x), axis=1))[:, None] | (~np.all(np.isfinite(weight), axis=1))[None, :]
    value = np.zeros(special.shape, dtype=F32)
    if not special.any():
        return special, value
    def count(a, b):
        return (a.astype(np.float64) @ b.astype(np.float64).T) > 0
    x_inf, w_inf = np.isinf(x), np.isinf(weight)
    nan = (count(np.isnan(x), np.ones_like(weight, dtype=bool)) | count(np.ones_like(x, dtype=bool), np.isnan(weight))
           | count(x_inf, weight == 0) | count(x == 0, w_inf))
    x_pos, x_neg, w_pos, w_neg = x > 0, x < 0, weight > 0, weight < 0
    pos = count(x_inf & x_pos, w_pos) | count(x_inf & x_neg, w_neg) | count(x_pos, w_inf & w_pos) | count(x_neg, w_inf & w_neg)
    neg = count(x_inf & x_pos, w_neg) | count(x_inf & x_neg, w_pos) | count(x_pos, w_inf & w_neg) | count(x_neg, w_inf & w_pos)
    value = np.where(nan | (pos & neg), F32(np.nan), np.where(pos, POS_INF, NEG_INF))
    return special, value


def linear(x, weight, bias):
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] (spec 24.1): the exact integer product of the rows'
    29-bit quantisations, rounded once to binary32 (+0.0 for an exact zero); pairs with a non-finite row take
    their IEEE value; then the bias, one add."""
    qx, ex, _ = quantise_rows(x, spec.LINEAR_BX)
    qw, ew, _ = quantise_rows(weight, spec.LINEAR_BW)
    hi, lo = exact_products(qx, qw)
    p = ex[:, None] + ew[None, :] - (spec.LINEAR_BX - 2) - (spec.LINEAR_BW - 2)
    out = round_scaled(hi, lo, p)
    special, value = _nonfinite_pairs(x, weight)
    out = np.where(special, value, out)
    return out if bias is None else out + bias[None, :]


def rms_norm(x, weight, eps):
    """[R, D], weight [D] -> [R, D]: (x * rsqrt(canonical_sum(x*x) * (1/D) + eps)) * weight (spec 24.2)."""
    return (x * _rms_stats(x, eps)[:, None]) * weight[None, :]


def rotary(x, cos, sin):
    """[R, D], cos and sin [R, D/2] -> [R, D]: the rotate-half rotation, two products and one add each (spec 24.3)."""
    h = x.shape[1] // 2
    x1, x2 = x[:, :h], x[:, h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)


def attention_mask(tq, tk, kv_lengths, causal):
    """[G, Tq, Tk] bool: key j counts for query i iff j < kv_lengths[g] and, when causal, j <= i + (Tk - Tq)."""
    j = np.arange(tk)
    mask = np.broadcast_to(j[None, None, :] < np.asarray(kv_lengths)[:, None, None], (len(kv_lengths), tq, tk))
    if causal:
        mask = mask & (j[None, None, :] <= np.arange(tq)[None, :, None] + (tk - tq))
    return mask


def attention(q, k, v, kv_lengths, causal, scale):
    """q [G, Tq, D], k and v [G, Tk, D] -> [G, Tq, D] (spec 24.4): scores by canonical dots over D, the
    softmax of spec 8 over the keys that count (scaled by `scale`), then out_d = canonical_sum_j(p_j * v_jd)
    with the keys that do not count as -0.0, so trailing masked keys change no bit."""
    g, tq, d = q.shape
    tk = k.shape[1]
    mask = attention_mask(tq, tk, kv_lengths, causal)
    out = np.empty((g, tq, d), dtype=F32)
    for i in range(g):
        dots = canonical_sum((q[i][:, None, :] * k[i][None, :, :]).reshape(-1, d)).reshape(tq, tk)
        p = softmax(dots, mask[i], np.full(tq, scale, dtype=F32))       # [Tq, Tk], every query the same scale
        terms = np.where(mask[i][:, :, None], p[:, :, None] * v[i][None, :, :], NEG_ZERO)   # [Tq, Tk, D]
        out[i] = canonical_sum(terms.transpose(0, 2, 1).reshape(-1, tk)).reshape(tq, d)
    return out


def silu_mul(gate, up):
    """[n] twice -> [n]: SwiGLU's silu(gate) * up with sigmoid = 1/(1 + e) or e/(1 + e), e = exp(-|g|) (spec 24.5)."""
    return (gate * _sigmoid(gate)) * up


# -- Training (spec 29) -------------------------------------------------------

def fold_rows(c, segments, positions, rows, n_segments):
    """c [M, F] with segments [M] and positions [M] (distinct within a segment) -> [n_segments, F]: per segment,
    the row fold (spec 29.1) of `rows` leaves holding c[i] at positions[i] and -0.0 elsewhere. Level by level,
    on the rows sorted by (segment, position): siblings 2p and 2p + 1 that are both present add (left + right);
    a node with one present child is that child, since adding the -0.0 of an absent subtree changes no bit."""
    out = np.full((n_segments, c.shape[1]), NEG_ZERO, dtype=F32)
    order = np.lexsort((np.asarray(positions), np.asarray(segments)))
    values = np.asarray(c, dtype=F32)[order]
    keys = np.asarray(segments, dtype=np.int64)[order]
    pos = np.asarray(positions, dtype=np.int64)[order]
    width = _next_pow2(rows)
    while width > 1:
        parent = pos >> 1
        pair = np.zeros(len(pos), dtype=bool)
        pair[:-1] = (keys[:-1] == keys[1:]) & (parent[:-1] == parent[1:])     # a left child with its right sibling
        right = np.zeros(len(pos), dtype=bool)
        right[1:] = pair[:-1]
        merged = np.where(pair[:, None], values + np.roll(values, -1, axis=0), values)
        keep = ~right
        values, keys, pos = merged[keep], keys[keep], parent[keep]
        width >>= 1
    out[keys] = values
    return out


def row_fold(c):
    """[R, F] -> [F]: the row fold of the R rows in order (spec 29.1)."""
    rows = c.shape[0]
    return fold_rows(c, np.zeros(rows, dtype=np.int64), np.arange(rows), rows, 1)[0]


def weight_grad(x, g, positions, rows):
    """x [M, K], g [M, N] -> [N, K] (spec 29.2): rows at positions (distinct, below `rows`) fall in blocks of
    LINEAR_GRAD_BLOCK positions; each block with rows gives linear(g_b^T, x_b^T), the exact sum over its rows
    rounded once; the blocks are row-folded (spec 29.1), a block without rows being the fold's -0.0."""
    block = np.asarray(positions, dtype=np.int64) // spec.LINEAR_GRAD_BLOCK
    present = np.unique(block)
    parts = np.stack([linear(np.ascontiguousarray(g[block == j].T), np.ascontiguousarray(x[block == j].T), None)
                      .reshape(-1) for j in present]) if len(present) else np.zeros((0, g.shape[1] * x.shape[1]), F32)
    n_blocks = -(-int(rows) // spec.LINEAR_GRAD_BLOCK)
    return fold_rows(parts, np.zeros(len(present), dtype=np.int64), present, n_blocks, 1)[0].reshape(g.shape[1],
                                                                                                   x.shape[1])


def _rms_stats(x, eps):
    """r = rsqrt(canonical_sum(x*x) * (1/D) + eps) per row (spec 24.2); rms_norm and its backward share it."""
    ms = canonical_sum(x * x) * reciprocal(F32(x.shape[1]))
    return rsqrt(ms + F32(eps))


def rms_norm_backward(x, weight, eps, g):
    """rms_norm's (dx [R, D], terms [R, D]) (spec 29.3): dx = (u - n * a) * r with u = g * weight and
    a = canonical_sum(u * n) * (1/D); terms = g * n, which the weight's gradient folds over the rows."""
    r = _rms_stats(x, eps)[:, None]
    n = x * r
    u = g * weight[None, :]
    a = canonical_sum(u * n) * reciprocal(F32(x.shape[1]))
    return (u - n * a[:, None]) * r, g * n


def _sigmoid(gate):
    """1/(1 + e) or e/(1 + e), e = exp(-|gate|) (spec 24.5); silu_mul and its backward share it."""
    e = exp(-np.abs(gate))
    r = reciprocal(F32(1.0) + e)                    # 1 + e in [1, 2]: inside reciprocal's domain
    return np.where(gate >= F32(0.0), r, e * r)


def silu_mul_backward(gate, up, g):
    """(d_gate, d_up) of silu_mul (spec 29.5): d_up = g * silu, d_gate = (g * up) * (sig * (1 + gate * (1 - sig)))."""
    sig = _sigmoid(gate)
    d_silu = sig * (F32(1.0) + gate * (F32(1.0) - sig))
    return (g * up) * d_silu, g * (gate * sig)


def attention_backward(q, k, v, kv_lengths, causal, scale, g):
    """(dq, dk, dv) of attention (spec 29.6), per group: dp = dots of g with v over d; ds = (p * (dp - G)) * scale
    on counted pairs (softmax's backward, spec 26.4); dq, dk, dv are canonical sums over keys or queries with the
    pairs that do not count as -0.0."""
    groups, tq, d = q.shape
    tk = k.shape[1]
    mask = attention_mask(tq, tk, kv_lengths, causal)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    scales = np.full(tq, scale, dtype=F32)
    for i in range(groups):
        scores = canonical_sum((q[i][:, None, :] * k[i][None, :, :]).reshape(-1, d)).reshape(tq, tk)
        p = softmax(scores, mask[i], scales)                                               # [Tq, Tk]
        dp = canonical_sum((g[i][:, None, :] * v[i][None, :, :]).reshape(-1, d)).reshape(tq, tk)
        ds = softmax_backward(p, mask[i], scales, dp)                                      # +0.0 where not counted
        counted = mask[i][:, :, None]
        dq[i] = canonical_sum(np.where(counted, ds[:, :, None] * k[i][None, :, :], NEG_ZERO)
                              .transpose(0, 2, 1).reshape(-1, tk)).reshape(tq, d)
        dk[i] = canonical_sum(np.where(counted, ds[:, :, None] * q[i][:, None, :], NEG_ZERO)
                              .transpose(1, 2, 0).reshape(-1, tq)).reshape(tk, d)
        dv[i] = canonical_sum(np.where(counted, p[:, :, None] * g[i][:, None, :], NEG_ZERO)
                              .transpose(1, 2, 0).reshape(-1, tq)).reshape(tk, d)
    return dq, dk, dv


def sqrt32(y):
    """sqrt for y >= 0 (spec 29.10): y * rsqrt(y) (spec 15.2), then one correction by the Dekker-exact residual
    y - s*s; +0.0 below the smallest normal, +inf at +inf, NaN propagates."""
    y = np.asarray(y, dtype=F32)
    small = y < _c(spec.MIN_NORMAL_BITS)
    safe = np.where(small, F32(1.0), y)
    r = rsqrt(safe)
    s = safe * r
    p = s * s
    sh, sl = _split(s)
    err = ((sh * sh - p) + (sh * sl + sh * sl)) + sl * sl          # s*s - p, exactly
    s = s + ((safe - p) - err) * (_c(spec.HALF_BITS) * r)
    return np.where(small, F32(0.0), np.where(y == POS_INF, POS_INF, s))


def recip(d):
    """1/d for d in [2^-126, +inf] or NaN (spec 29.11): spec 7's reciprocal of the mantissa in [1, 2), scaled by
    2^-e; +0.0 at +inf (e = 128 would scale by -inf), NaN propagates. AdamW's denominator is never below eps32."""
    d = np.asarray(d, dtype=F32)
    bits = d.view(I32)
    e = (bits >> 23) - 127
    mantissa = ((bits & I32(0x007FFFFF)) | I32(0x3F800000)).view(F32)
    r = reciprocal(mantissa)
    low = e == 127
    scale = ((I32(127) - np.where(low, 126, e)) << 23).astype(I32).view(F32)
    out = np.where(low, (r * F32(0.5)) * scale, r * scale)
    return np.where(d == POS_INF, F32(0.0), np.where(np.isnan(d), d, out))


def _scaled_square_term(g, c2):
    """c2 * (g * g) as if g * g had an unbounded exponent (spec 29.12): where g * g overflows (|g| >= 2^64),
    ((c2 * (h * h)) * 2^64) * 2^64 with h = g * 2^-64, whose roundings are the unscaled ones (powers of two
    scale exactly); +inf only where the term itself exceeds binary32."""
    gg = g * g
    h = g * _c(spec.TWO_M64_BITS)
    up = _c(spec.TWO_P64_BITS)
    return np.where(gg == POS_INF, ((F32(c2) * (h * h)) * up) * up, F32(c2) * gg)


def adamw_step(w, g, m, v, decay, b1, c1, b2, c2, ibc2, eps, step):
    """One AdamW step, element-wise (spec 29.12) -> (w, m, v). decay is None when weight_decay is 0."""
    if decay is not None:
        w = w * F32(decay)
    m = F32(b1) * m + F32(c1) * g
    v = F32(b2) * v + _scaled_square_term(g, c2)
    den = (sqrt32(v) * F32(ibc2)) + F32(eps)
    return w - (m * recip(den)) * F32(step), m, v


def sgd_step(w, g, buf, lr, momentum, one_minus_dampening, weight_decay, nesterov):
    """One SGD step, element-wise (spec 29.12) -> (w, buf): buf None is the first step (or momentum 0)."""
    if weight_decay != 0:
        g = g + F32(weight_decay) * w
    if momentum != 0:
        buf = g if buf is None else F32(momentum) * buf + F32(one_minus_dampening) * g
        g = g + F32(momentum) * buf if nesterov else buf
    return w - F32(lr) * g, buf
