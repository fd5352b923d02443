"""Vocab-parallel log-probabilities, entropy and sampling with the bits of one process (spec 31.3).

The vocabulary is cut into whole segments of spec.SEGMENT entries (spec 3), and each rank of a tensor-parallel
group holds a contiguous run of them (vocab_shard): the lm_head's output rows, so its logits [..., V_r] are a
column-parallel linear's output. Spec 8.2's row statistics are per segment (m_g, n_g, t_g) and are combined by
spec 3's partial tree over the G segments in order, so each rank computes its own segments' statistics with its
backend's exp and sum, the ranks all-gather those few binary32 values (whole values, rank order), and every rank
runs the combine itself in segment order (reference/canonical.combine_segment_stats, on R x G values). No float
addition crosses the network, so the result is one process's bits at every world size. Entropy adds one more
gather, of each segment's sum of terms; sampling gathers the row maximum and invalid flags, the local top-k
values (top-k's threshold is a count, exact), for top-p each bisection probe's segment partials of the kept mass
above it, and each rank's best (score, index).

Gradients (spec 26.5, 26.6, 26.2): every rank returns the global result, and the gradient w.r.t. its shard is its
slice of the single-process gradient for the same upstream gradient (which every rank has when the loss is
computed from the replicated results), from the forward's global statistics with no communication.

Errors are the same on every rank: before any collective that depends on them, the ranks exchange a description
of their arguments (bitparity.distributed._exchange) and check every rank's in one order.
"""

import hashlib
import math
import numbers

import numpy as np
import torch
import torch.distributed as dist

from .. import autograd as _autograd
from .. import distributed as _distributed
from .. import ops, spec
from ..backends import resolve as _resolve
from ..reference import canonical

_NEG_INF = float("-inf")


def _positive(name, value, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}; got {value}")
    return int(value)


def vocab_shard(vocab_size, world_size, rank):
    """The global vocabulary indices rank holds, a range: whole segments of spec.SEGMENT (16384) entries, the
    G = ceil(vocab_size / SEGMENT) segments split contiguously in rank order, the first G mod world_size ranks
    holding one segment more (torch.tensor_split's rule). The last segment may be short; no padding is needed;
    ranks past the G-th hold nothing (an empty range). Shard lm_head's rows, and pass the logits, by this rule."""
    vocab_size = _positive("vocab_size", vocab_size, 1)
    world_size = _positive("world_size", world_size, 1)
    rank = _positive("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}; got {rank}")
    segments = -(-vocab_size // spec.SEGMENT)
    base, extra = divmod(segments, world_size)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    return range(min(first * spec.SEGMENT, vocab_size), min((first + count) * spec.SEGMENT, vocab_size))


# -- The argument exchange: the same error on every rank --------------------------------------------------------

def _digest(value):
    """A value every rank must agree on, as plain data: a tensor's description and a hash of its bytes (tokens,
    seeds, per-row temperatures are replicated: every rank must pass the same), else repr."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    described = _distributed._describe(value)
    if value.layout != torch.strided or value.is_nested or value.device.type == "meta":
        return described
    data = value.detach().resolve_conj().resolve_neg().contiguous().cpu()
    return described, hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class _Shard:
    """What a call knows after the exchange: the group, this rank's range, every rank's, the backend module."""

    def __init__(self, group, world, rank, vocab, module, rows):
        self.group, self.world, self.rank, self.vocab, self.module, self.rows = group, world, rank, vocab, module, rows
        self.ranges = [vocab_shard(vocab, world, r) for r in range(world)]
        self.start, self.stop = self.ranges[rank].start, self.ranges[rank].stop

    def gather(self, op, what, payload):
        """[W, *payload.shape]: every rank's payload in rank order (all_gather of whole values)."""
        parts = [torch.empty_like(payload) for _ in range(self.world)]
        _distributed._collective(f"parallel.{op}", f"all_gather of {what}",
                                 lambda: dist.all_gather(parts, payload.contiguous(), group=self.group))
        return torch.stack(parts)


def _check_logits(op, table, dims):
    """The same error on every rank, in this order: logits that is not a dense float tensor with data and the
    right number of dimensions; a dtype, leading shape or device type other than rank 0's; a shard whose length
    is not vocab_shard's for the vocabulary the shards add up to."""
    where = f"bitparity.parallel.{op}: logits"
    for rank, entry in enumerate(table):
        _distributed._check_tensor(f"parallel.{op}", "logits", rank, entry[0], ops._FLOAT_DTYPES)
        shape = entry[0][2]
        if len(shape) < dims[0] or (dims[1] is not None and len(shape) > dims[1]):
            wanted = "2 dimensions [B, V_r]" if dims[0] == dims[1] else f"at least {dims[0]} dimension [..., V_r]"
            raise ValueError(f"{where} on rank {rank} must have {wanted} (this rank's vocabulary shard last); got "
                             f"shape {shape}")
    first = table[0][0]
    for rank, entry in enumerate(table[1:], 1):
        if (entry[0][1], entry[0][2][:-1], entry[0][3]) != (first[1], first[2][:-1], first[3]):
            raise ValueError(f"{where} must have the same dtype, leading shape and device type on every rank; rank "
                             f"0 has {(first[1], first[2][:-1], first[3])}, rank {rank} has "
                             f"{(entry[0][1], entry[0][2][:-1], entry[0][3])}")
    if math.prod(first[2][:-1]) == 0:
        raise ValueError(f"{where} must have at least one row; got shape {first[2]}")
    lengths = [entry[0][2][-1] for entry in table]
    vocab = sum(lengths)
    if vocab == 0:
        raise ValueError(f"{where} must hold a vocabulary of at least one entry over the ranks; every shard is empty")
    for rank, length in enumerate(lengths):
        wanted = len(vocab_shard(vocab, len(table), rank))
        if length != wanted:
            raise ValueError(f"{where} on rank {rank} must hold vocab_shard({vocab}, {len(table)}, {rank}), "
                             f"{wanted} entries (whole segments of {spec.SEGMENT}, spec 31.3), for the vocabulary "
                             f"of {vocab} the shards add up to; got {length} (shards {lengths})")
    return vocab


def _prepare(op, group, logits, replicated, options, dims=(1, None)):
    """Exchange every rank's description of its arguments, check them the same way on every rank, and return the
    _Shard. replicated: tensors every rank must pass identically (tokens, seeds, positions); options: the other
    arguments (tensors compared by their bytes, the rest by repr)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"bitparity.parallel.{op}: torch.distributed is not initialised; call "
                         f"torch.distributed.init_process_group first")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    description = (_distributed._describe(logits), {name: _digest(t) for name, t in replicated.items()},
                   {name: _digest(value) for name, value in options.items()})
    table = _distributed._exchange(f"parallel.{op}", group, world, description)
    vocab = _check_logits(op, table, dims)
    for key, kind in ((1, "must be the same on every rank (replicated)"), (2, "must be the same on every rank")):
        for name in table[0][key]:
            for other, entry in enumerate(table[1:], 1):
                if entry[key][name] != table[0][key][name]:
                    raise ValueError(f"bitparity.parallel.{op}: {name} {kind}; rank {other} differs from rank 0")
    module = _resolve(options["backend"], logits.device)
    if module.NAME == "native":
        raise ValueError(f"bitparity.parallel.{op}: backend must be a canonical one (numpy, cpu, cuda, ascend); "
                         f"native is torch's own ops, which have no segment statistics")
    return _Shard(group, world, rank, vocab, module, math.prod(logits.shape[:-1]))


def _proxy(logits):
    """A tensor with logits' leading shape and a last dimension of 1, for ops.py's per-row parameter checks
    (which divide by the row length: a rank's shard may be empty)."""
    return torch.empty((*logits.shape[:-1], 1), device=logits.device)


def _rows(logits, shard):
    """logits [..., V_r] -> float32 [R, V_r] (exact upcast), differentiable."""
    return logits.reshape(shard.rows, logits.shape[-1]).to(torch.float32)


# -- Per-segment statistics on this rank (spec 8.2), combined on every rank -------------------------------------

def _segment_count(n):
    return -(-n // spec.SEGMENT)


def _g_max(shard):
    return _segment_count(len(shard.ranges[0]))               # rank 0 holds the most segments


def _exp(module, t):
    """The backend's exp (spec 5) of a tensor of any shape; an empty shard has nothing to compute."""
    return module.exp(t.reshape(-1).contiguous()).reshape(t.shape) if t.numel() else t.clone()


def _segments(v, fill):
    """[R, n] -> [R, ceil(n / S), S], the last segment padded with fill (-inf: no element for the maximum and an
    exponential of 0; -0.0: the sum's identity)."""
    rows, n = v.shape
    count = _segment_count(n)
    padded = torch.full((rows, count * spec.SEGMENT), fill, dtype=torch.float32, device=v.device)
    padded[:, :n] = v
    return padded.reshape(rows, count, spec.SEGMENT)


def _segment_sums(module, terms):
    """[R, g, S] -> [R, g]: each segment's canonical sum (spec 3 steps 2-3: the backend's sum of a one-segment row)."""
    rows, count, _ = terms.shape
    if count == 0:
        return terms.new_empty((rows, 0))
    return module.sum(terms.reshape(rows * count, spec.SEGMENT).contiguous(), None).reshape(rows, count)


def _local_segment_stats(module, w):
    """[R, V_r] scaled logits -> [R, g_r, 3]: (m_g, n_g, t_g) of each segment this rank holds (spec 8.2)."""
    seg = _segments(w, _NEG_INF)
    top = torch.amax(seg, dim=2) + 0.0                         # spec 4: NaN propagates, -0.0 becomes +0.0
    shift = torch.where(top == _NEG_INF, 0.0, top)
    e = _exp(module, seg - shift[:, :, None])
    one = e == 1.0
    neg_zero = torch.full_like(e, -0.0)
    count = _segment_sums(module, torch.where(one, 1.0, neg_zero))
    rest = _segment_sums(module, torch.where(one | (e == 0.0), neg_zero, e))
    return torch.stack([top, count, rest], dim=2)


def _by_segment(shard, gathered, width):
    """[W, R, g_max * width] (each rank's segments, padded to the longest) -> numpy [R, G, width] in segment order."""
    parts = [gathered[r, :, :_segment_count(len(shard.ranges[r])) * width] for r in range(shard.world)]
    return torch.cat(parts, dim=1).reshape(shard.rows, -1, width).cpu().numpy()


class _Stats:
    """Spec 8.2's (shift, total, log_total, recip), [R] float32 each on the logits' device, the same bits on every
    rank; token: the scaled logit w_t at each row's token (gathered from the rank that holds it), or None."""

    def __init__(self, shard, w, tokens, op):
        extra = 0 if tokens is None else 1
        local = _local_segment_stats(shard.module, w).reshape(shard.rows, -1)            # [R, g_r * 3]
        payload = torch.zeros(shard.rows, _g_max(shard) * 3 + extra, dtype=torch.float32, device=w.device)
        payload[:, :local.shape[1]] = local
        if tokens is not None:
            mine = (tokens >= shard.start) & (tokens < shard.stop)
            local_index = (tokens - shard.start).clamp(0, max(w.shape[1] - 1, 0))
            if w.shape[1]:
                payload[:, -1] = torch.where(mine, w.gather(1, local_index[:, None])[:, 0], 0.0)
        gathered = shard.gather(op, "the segment statistics", payload)                  # [W, R, ...]
        stats = _by_segment(shard, gathered[:, :, :payload.shape[1] - extra], 3)
        with np.errstate(all="ignore"):                   # IEEE specials are the spec's (inf - inf = NaN)
            values = canonical.combine_segment_stats(stats[..., 0], stats[..., 1], stats[..., 2])
        self.shift, self.total, self.log_total, self.recip = (torch.from_numpy(np.ascontiguousarray(v)).to(w.device)
                                                              for v in values)
        self.token = None
        if tokens is not None:
            # The rank holding each token: the last one whose range starts at or below it (empty ranges come last).
            starts = torch.tensor([r.start for r in shard.ranges if len(r)], device=w.device)
            owner = (tokens[:, None] >= starts[None, :]).sum(dim=1) - 1
            self.token = gathered[owner, torch.arange(shard.rows, device=w.device), -1]

    def log_probs(self, w):
        """Spec 8.3's log_softmax of this rank's columns: select(total == 0, -inf, (w - shift) - log_total)."""
        out = (w - self.shift[:, None]) - self.log_total[:, None]
        return torch.where((self.total == 0.0)[:, None], _NEG_INF, out)


def _row_sum(shard, op, what, terms):
    """Spec 3's canonical sum of each full row from this rank's terms [R, V_r]: segment partials here, gathered,
    and the partial tree over all G in segment order on every rank."""
    local = _segment_sums(shard.module, _segments(terms, -0.0))                       # [R, g_r]
    payload = torch.zeros(shard.rows, _g_max(shard), dtype=torch.float32, device=terms.device)
    payload[:, :local.shape[1]] = local
    partials = _by_segment(shard, shard.gather(op, what, payload), 1)[..., 0]
    with np.errstate(all="ignore"):
        return torch.from_numpy(np.ascontiguousarray(canonical._combine_partials(partials))).to(terms.device)


# -- The differentiable ops ------------------------------------------------------------------------------------

class _LogProbs(torch.autograd.Function):
    """token_logprobs (kind "token") and logsumexp (kind "lse") over the sharded vocabulary; the backward is
    spec 26.6 / 26.2 on this rank's columns with the forward's global statistics."""

    @staticmethod
    def forward(ctx, x, kind, tokens, scale, shard, op):
        w = x * scale[:, None]                                                 # spec 8.1: one multiply
        stats = _Stats(shard, w, tokens if kind == "token" else None, op)
        ctx.kind, ctx.shard, ctx.stats, ctx.op = kind, shard, stats, op
        ctx.save_for_backward(x, tokens, scale)
        if kind == "lse":
            return stats.shift + stats.log_total
        out = (stats.token - stats.shift) - stats.log_total
        return torch.where(stats.total == 0.0, _NEG_INF, out)

    @staticmethod
    def backward(ctx, g):
        _autograd._refuse_double_backward(f"parallel.{ctx.op}")
        x, tokens, scale = ctx.saved_tensors
        g = g.to(torch.float32).contiguous()[:, None]
        w = x * scale[:, None]
        p = _exp(ctx.shard.module, ctx.stats.log_probs(w))                             # spec 26.1's P_i
        if ctx.kind == "lse":
            return (g * p) * scale[:, None], None, None, None, None, None              # spec 26.2
        columns = torch.arange(ctx.shard.start, ctx.shard.stop, device=x.device)
        hit = torch.where(columns[None, :] == tokens[:, None], g, 0.0)
        return (hit - p * g) * scale[:, None], None, None, None, None, None           # spec 26.6


class _Entropy(torch.autograd.Function):
    """Spec 8.4 over the sharded vocabulary: each segment's sum of terms here, the partial tree on every rank;
    the backward is spec 26.5 on this rank's columns."""

    @staticmethod
    def forward(ctx, x, scale, shard, op):
        w = x * scale[:, None]
        stats = _Stats(shard, w, None, op)
        d = w - stats.shift[:, None]
        e = _exp(shard.module, d)
        terms = (e * stats.recip[:, None]) * (stats.log_total[:, None] - d)
        terms = torch.where(e == 0.0, torch.full_like(terms, -0.0), terms)
        h = _row_sum(shard, op, "the entropy's segment sums", terms) + 0.0
        ctx.shard, ctx.stats = shard, stats
        ctx.save_for_backward(x, scale, h)
        return h

    @staticmethod
    def backward(ctx, g):
        _autograd._refuse_double_backward("parallel.entropy")
        x, scale, h = ctx.saved_tensors
        stats = ctx.stats
        g = g.to(torch.float32).contiguous()
        d = x * scale[:, None] - stats.shift[:, None]
        e = _exp(ctx.shard.module, d)
        q = e * stats.recip[:, None]
        a = stats.log_total[:, None] - d
        out = ((q * (a - h[:, None])) * g[:, None]) * scale[:, None]
        return torch.where(e == 0.0, 0.0, out), None, None, None                      # spec 26.5


def _softmax_call(op, logits, tokens, temperature, group, backend):
    replicated = {} if tokens is None else {"tokens": tokens}
    shard = _prepare(op, group, logits, replicated, {"temperature": temperature, "backend": backend})
    # Every rank agrees on these arguments now, so ops.py's checks raise the same error on every rank.
    if tokens is not None:
        ops._check_index_tensor("tokens", tokens, "logits.shape[:-1]", logits.shape[:-1], logits.device)
        flat = tokens.reshape(-1).contiguous()
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= shard.vocab:
            raise ValueError(f"tokens must lie in [0, {shard.vocab}) (the vocabulary size, over all ranks); got "
                             f"{low if low < 0 else high}")
        tokens = flat
    scale, _ = ops._row_scales(temperature, _proxy(logits), allow_zero=False)
    return shard, tokens, scale


def token_logprobs(logits, tokens, *, group=None, temperature=1.0, backend=None):
    """bitparity.token_logprobs over a vocabulary sharded by vocab_shard (spec 31.3): logits [..., V_r] this
    rank's shard (float32, bfloat16 or float16), tokens int64 [...] global ids in [0, V), the same on every rank;
    returns float32 [...], the single-process bits, on every rank. temperature: a scalar or a tensor of shape
    tokens.shape, the same on every rank. Differentiable in logits: this rank's slice of the single-process
    gradient (spec 26.6). One all_gather of 4 * (3 * ceil(G / W) + 1) bytes per row."""
    shard, flat, scale = _softmax_call("token_logprobs", logits, tokens, temperature, group, backend)
    x = _rows(logits, shard)
    return _LogProbs.apply(x, "token", flat, scale, shard, "token_logprobs").reshape(logits.shape[:-1])


def logsumexp(logits, *, group=None, temperature=1.0, backend=None):
    """bitparity.logsumexp over a vocabulary sharded by vocab_shard: the log-softmax statistic shift + log_total
    (spec 8.3), float32 [...] on every rank. Arguments as token_logprobs'. Differentiable in logits (spec 26.2).
    One all_gather of 12 * ceil(G / W) bytes per row."""
    shard, _, scale = _softmax_call("logsumexp", logits, None, temperature, group, backend)
    empty = torch.empty(0, dtype=torch.int64, device=logits.device)
    return _LogProbs.apply(_rows(logits, shard), "lse", empty, scale, shard, "logsumexp").reshape(logits.shape[:-1])


def entropy(logits, *, group=None, temperature=1.0, backend=None):
    """bitparity.entropy over a vocabulary sharded by vocab_shard (spec 8.4, 31.3): float32 [...] on every rank.
    Arguments as token_logprobs'. Differentiable in logits (spec 26.5). Two all_gathers: 12 * ceil(G / W) and
    4 * ceil(G / W) bytes per row."""
    shard, _, scale = _softmax_call("entropy", logits, None, temperature, group, backend)
    return _Entropy.apply(_rows(logits, shard), scale, shard, "entropy").reshape(logits.shape[:-1])


# -- Sampling (spec 19-22) ---------------------------------------------------------------------------------------

def _f32(bits, device):
    return torch.tensor(spec.f32(bits), dtype=torch.float32, device=device)


def _race_noise(module, seeds, positions, start, stop):
    """[R] seeds, positions -> f32 [R, stop - start]: log(E) of global tokens start ... stop - 1 (spec 19-20), by the
    backend's philox and log; the steps between are single binary32 operations and exact integer ones."""
    device = seeds.device
    first, last = start >> 1, (stop - 1) >> 1
    pairs = last - first + 1
    low = 0xFFFFFFFF
    counters = torch.empty((seeds.shape[0], pairs, 4), dtype=torch.int64, device=device)
    counters[:, :, 0] = torch.arange(first, last + 1, device=device)[None, :]
    counters[:, :, 1] = (positions & low)[:, None]
    counters[:, :, 2] = ((positions >> 32) & low)[:, None]
    counters[:, :, 3] = spec.SAMPLE_STREAM
    keys = torch.stack([seeds & low, (seeds >> 32) & low], dim=1)[:, None, :].expand(-1, pairs, -1)
    words = module.philox(counters.reshape(-1, 4), keys.reshape(-1, 2).contiguous())
    words = words.reshape(seeds.shape[0], 2 * pairs, 2)[:, start - 2 * first:stop - 2 * first]   # (a, b) per token
    a, b = words[..., 0] >> 8, words[..., 1] >> 9                            # 24 and 23 bits
    coarse = a >= spec.UNIFORM_COARSE_MIN
    u = a.to(torch.float32) * _f32(spec.TWO_M24_BITS, device)                  # exact
    u = torch.where(coarse, u, u + (2 * b + 1).to(torch.float32) * _f32(spec.TWO_M48_BITS, device))
    big = torch.neg(module.log((_f32(spec.ONE_BITS, device) - u).reshape(-1)).reshape(u.shape))
    s = u * _f32(spec.THIRD_BITS, device)
    s = s + _f32(spec.HALF_BITS, device)
    s = (u * u) * s
    small = u + s
    return module.log(torch.where(coarse, big, small).reshape(-1)).reshape(u.shape)


def _top_k_threshold(shard, left, top_k):
    """tau [R]: each row's top_k-th largest value of left over the whole vocabulary, counting repeats (spec 21).
    The union of every rank's top_k largest holds the row's top_k largest, so its top_k-th is the row's."""
    most = int(top_k.max())
    local = torch.full((shard.rows, most), _NEG_INF, dtype=torch.float32, device=left.device)
    if left.shape[1]:
        held = min(most, left.shape[1])
        local[:, :held] = shard.module.topk(left.contiguous(), held)[0]
    union = shard.gather("sample", "the local top-k values", local).permute(1, 0, 2).reshape(shard.rows, -1)
    ordered = torch.sort(union, dim=1, descending=True).values
    return ordered.gather(1, (top_k.clamp(1, ordered.shape[1]) - 1)[:, None])[:, 0]


def _order_key(v):
    """float32 -> int64 keys in binary32's numeric order (-0.0 and +0.0 adjacent, both before 2^-149)."""
    bits = v.view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, -1 - (bits & 0x7FFFFFFF))


def _key_value(key):
    """The inverse of _order_key: int64 keys -> float32."""
    return torch.where(key >= 0, key, -1 - key - 2 ** 31).to(torch.int32).view(torch.float32)


def _top_p_floor(shard, keep, w, u, thr, use):
    """[R] float32: the smallest value v with A(v) < thr (spec 21), by bisection over binary32's order between -inf
    (A = the kept mass Z >= thr) and +inf (A = -0.0 < thr). A(v), the canonical sum of the kept u_j with w_j > v,
    is non-increasing in v, so the keys where it holds are a final segment, and its first value is the smallest
    kept value that passes: every search finds the same set. Each probe gathers the rows' segment partials of A.
    Rows not in use take no probe; every rank runs the same probes, decided by the same gathered values."""
    infinities = torch.tensor([float("-inf"), float("inf")], device=w.device)
    low_key, high_key = _order_key(infinities).tolist()
    low = torch.where(use, low_key, high_key - 1)
    high = torch.full_like(low, high_key)
    while bool((high - low > 1).any()):
        active = high - low > 1
        middle = low + (high - low) // 2
        v = _key_value(middle)
        above = torch.where(keep & (w > v[:, None]), u, torch.full_like(u, -0.0))
        holds = _row_sum(shard, "sample", "top-p's mass above a probe", above) < thr
        high = torch.where(active & holds, middle, high)
        low = torch.where(active & ~holds, middle, low)
    return _key_value(high)


def sample(logits, seeds, positions, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logprobs="processed",
           group=None, backend=None):
    """bitparity.sample over a vocabulary sharded by vocab_shard (spec 22, 31.3): logits [B, V_r] this rank's shard;
    seeds, positions int64 [B] and every option the same on every rank. Returns (tokens int64 [B] global ids,
    logprobs float32 [B]) on every rank, the single-process bits: temperature (0 = greedy), min_p, top_k and every
    logprobs kind. top_p < 1 costs a bisection of at most 32 probes, each a gather of the segment partials of the
    kept mass above the probe (spec 31.3). Not differentiable."""
    options = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "logprobs": logprobs,
               "backend": backend,
               "logits.requires_grad": isinstance(logits, torch.Tensor) and logits.requires_grad}
    shard = _prepare("sample", group, logits, {"seeds": seeds, "positions": positions}, options, dims=(2, 2))
    _autograd.refuse_grad("sample", logits=logits)
    batch = logits.shape[:1]
    seeds = ops._check_index_tensor("seeds", seeds, "[B]", batch, logits.device)
    positions = ops._check_index_tensor("positions", positions, "[B]", batch, logits.device)
    if bool((positions < 0).any()):
        raise ValueError(f"positions must be >= 0; got {int(positions.min())}")
    ops._check_choice("logprobs", logprobs, ops.LOGPROB_KINDS)
    scale, greedy = ops._row_scales(temperature, _proxy(logits), allow_zero=True)
    top_k, top_p, min_p = ops._filter_params(_proxy(logits), top_k, top_p, min_p)
    x = _rows(logits.detach(), shard)
    w = x * scale[:, None]
    # Round 1: the row's invalid flag (a NaN or +inf scaled logit) and its maximum, both order-free.
    highest = torch.amax(w, dim=1) if w.shape[1] else torch.full((shard.rows,), _NEG_INF, device=w.device)
    local = torch.stack([((w != w) | (w == float("inf"))).any(dim=1).to(torch.float32), highest], dim=1)
    gathered = shard.gather("sample", "the row maxima", local)                               # [W, R, 2]
    bad = (gathered[:, :, 0] > 0).any(dim=0)
    w = torch.where(bad[:, None], _NEG_INF, w)                   # keeps the steps below NaN-free (spec 21)
    top = torch.where(bad, _NEG_INF, torch.amax(gathered[:, :, 1], dim=0)) + 0.0
    shift = torch.where(top == _NEG_INF, 0.0, top)
    # Spec 21's filters on this rank's columns, with the global shift and threshold.
    e = _exp(shard.module, w - shift[:, None])
    keep = (w != _NEG_INF) & (~(min_p > 0.0)[:, None] | (e >= min_p[:, None]))
    use = (top_k > 0) & (top_k < shard.vocab)
    if bool(use.any()):
        left = torch.where(keep, w, _NEG_INF)
        tau = _top_k_threshold(shard, left, torch.where(use, top_k, 1))
        keep &= ~use[:, None] | (left >= tau[:, None])
    use = top_p < 1.0
    if bool(use.any()):
        u = torch.where(keep, e, torch.full_like(e, -0.0))
        thr = top_p * _row_sum(shard, "sample", "top-p's kept mass", u)                 # one rounding
        keep &= ~use[:, None] | (w >= _top_p_floor(shard, keep, w, u, thr, use)[:, None])
    f = torch.where(keep, w, _NEG_INF)
    # Spec 22: the exponential race (shift is the maximum of w, which every filter keeps); greedy rows race x.
    scores = x
    if not bool(greedy.all()) and w.shape[1]:
        scores = torch.where(greedy[:, None], x, (f - shift[:, None]) - _race_noise(shard.module, seeds, positions,
                                                                                      shard.start, shard.stop))
    scores = torch.where(bad[:, None], _NEG_INF, scores)
    tokens = _winner(shard, scores)
    tokens = torch.where(bad, -1, tokens)
    # Spec 22.1: the log-probability of the named distribution, by the vocab-parallel token_logprobs.
    ones = torch.ones_like(scale)
    if logprobs == "processed":
        dist_rows, dist_scale = torch.where(greedy[:, None], x, torch.where(bad[:, None], float("nan"), f)), ones
    else:
        dist_rows, dist_scale = x, (scale if logprobs == "scaled" else ones)
    with torch.no_grad():
        out = _LogProbs.apply(dist_rows, "token", tokens.clamp(min=0), dist_scale, shard, "sample")
    none = tokens < 0
    out = torch.where(none, torch.where(bad, float("nan"), _NEG_INF), out)
    return tokens, out


def _winner(shard, scores):
    """int64 [R]: the lowest global index of each row's maximum score, -1 where every score is -inf: each rank's
    (maximum, lowest local index) as (int32 pattern, index), gathered; the first rank holding the maximum wins."""
    if scores.shape[1]:
        best = torch.amax(scores, dim=1)
        index = torch.argmax(scores, dim=1) + shard.start       # torch.argmax returns the first maximum
    else:
        best = torch.full((shard.rows,), _NEG_INF, device=scores.device)
        index = torch.zeros(shard.rows, dtype=torch.int64, device=scores.device)
    payload = torch.stack([(best + 0.0).view(torch.int32).to(torch.int64), index], dim=1)
    gathered = shard.gather("sample", "each rank's best score", payload)                    # [W, R, 2]
    values = gathered[:, :, 0].to(torch.int32).view(torch.float32)                           # [W, R]
    top = torch.amax(values, dim=0)
    first = torch.argmax((values == top[None, :]).to(torch.int8), dim=0)     # the first rank holding the maximum
    winner = gathered[first, torch.arange(shard.rows, device=scores.device), 1]
    return torch.where(top == _NEG_INF, -1, winner)
