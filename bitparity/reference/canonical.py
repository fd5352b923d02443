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
    """w = x * scale, with masked entries set to -inf (spec 8.1)."""
    w = x * F32(scale)
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
    """[R, V], tokens [R] -> [R]: log_softmax(x)[r, tokens[r]], bit for bit."""
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


def masked_whiten(x, mask, shift_mean, unbiased, eps):
    """[R, N] -> [R, N]: (x - mean) * rsqrt(var + eps) per row over counted entries; 0 where not counted (spec 15.3)."""
    mean = masked_mean(x, mask)
    d = x - mean[:, None]
    ss = canonical_sum(np.where(mask, d * d, NEG_ZERO))
    n = mask.sum(axis=1, dtype=np.int64)
    divisor = np.maximum(n - 1 if unbiased else n, 1).astype(F32)
    var = ss * reciprocal(divisor)
    out = d * rsqrt(var + F32(eps))[:, None]
    if not shift_mean:
        out = out + mean[:, None]
    return np.where(mask, out, F32(0.0))


def _k3(d):
    """e^d - 1 - d without cancellation: d*d * phi(d) by its Taylor series for |d| < 1 (spec 16)."""
    phi = _c(spec.K3_SERIES_BITS[0]) * np.ones_like(d)
    for coeff in spec.K3_SERIES_BITS[1:]:
        phi = phi * d + _c(coeff)
    series = (d * d) * phi
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


def ppo_token_losses(logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp):
    """[B, T] -> (loss per token, clipped per token): verl's clipped surrogate (spec 17.1)."""
    d = logp - old_logp
    if ratio_clamp is not None:
        d = _nan_clamp(d, -ratio_clamp, ratio_clamp)
    ratio = exp(d)
    neg_adv = -advantages
    loss1 = neg_adv * ratio
    loss2 = neg_adv * _nan_clamp(ratio, ratio_low, ratio_high)
    clipped = loss2 > loss1
    loss = np.maximum(loss1, loss2)
    if dual_clip is not None:
        loss = np.where(advantages < F32(0.0), np.minimum(neg_adv * F32(dual_clip), loss), loss)
    return loss, clipped


def ppo_policy_loss(logp, old_logp, advantages, mask, ratio_low, ratio_high, dual_clip, ratio_clamp, agg):
    """[B, T] -> (loss, clip fraction) as 0-d float32 arrays (spec 17.2)."""
    loss, clipped = ppo_token_losses(logp, old_logp, advantages, ratio_low, ratio_high, dual_clip, ratio_clamp)
    everything = np.ones((1, logp.shape[0]), dtype=bool)
    if agg == "token-mean":
        total = masked_mean(loss.reshape(1, -1), mask.reshape(1, -1))
    elif agg == "seq-mean-token-sum":
        total = masked_mean(canonical_sum(np.where(mask, loss, NEG_ZERO))[None, :], everything)
    else:
        total = masked_mean(masked_mean(loss, mask)[None, :], everything)
    frac = masked_mean(np.where(clipped, F32(1.0), F32(0.0)).reshape(1, -1), mask.reshape(1, -1))
    return total[0], frac[0]
