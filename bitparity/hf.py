"""Unmodified Hugging Face `transformers` models on the canonical ops (spec §30).

`patch(model)` replaces, in place, every module of a supported causal LM that computes with floats by a
module holding the same parameters whose forward and backward are bitparity ops: the token embedding,
RMSNorm (with Qwen3's per-head q/k norms), the rotary tables, the attention block, the dense MLP, the
Qwen3-MoE block, `lm_head`, and the loss `forward(labels=...)` computes. What stays HF's own code is
data movement and the residual adds (one IEEE add, rounded to the model's dtype), so `generate()`, the KV
cache, `from_pretrained` checkpoints and trainers keep working unchanged.

Two of transformers' extension points carry the attention:
- the attention-mask registry (`AttentionMaskInterface`, name "bitparity"): HF builds its boolean
  causal-and-padding mask as usual (never skipped for a plain causal mask), and the attention turns it, once
  per forward, into a `MaskPlan` (which key slots hold a sequence's tokens, in order, and where its queries
  sit), or refuses a mask that is not a causal mask over padded sequences (sliding windows, packed
  sequences, bidirectional blocks);
- the attention registry (`AttentionInterface`, the same name): `attention` below, the canonical
  attention over the plan, which the replaced attention module calls as HF's modules call theirs.
Module replacement does the rest, because the projections, the q/k norms and the rotary step sit in the
attention module's own forward, which no registry reaches (docs/integrations.md).

transformers is imported only when a model is patched: bitparity itself does not depend on it.
"""

import copy
import math
import weakref
from dataclasses import dataclass

import torch

from . import ops
from .backends import _check_name

NAME = "bitparity"
SUPPORTED = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_ORIGINALS = "_bitparity_originals"


# -- The mask plan: the causal mask over padded sequences, compacted -------------------------------

@dataclass(frozen=True)
class MaskPlan:
    """What a causal mask over padded sequences says, per batch row b (spec 30.3):

    keys [B, Tk] and lengths [B]: the row's L_b attended key slots in order, then padding (slot 0);
    active [B, Tq]: the queries that see more keys than every query before them (Q_b of them; the others are
    padding), and queries [B, Tq]: their slots in order, then padding (slot 0); past [B] = L_b - Q_b: the
    active query of rank r attends the first past_b + 1 + r keys. Inactive queries' output is +0.0."""
    keys: torch.Tensor
    lengths: torch.Tensor
    active: torch.Tensor
    queries: torch.Tensor
    past: torch.Tensor

    @staticmethod
    def from_mask(allowed):
        """allowed: bool [B, Tq, Tk] (True = query i attends key j) -> MaskPlan, or ValueError when some
        query's keys are not a prefix of its row's keys in order, or the queries' key counts do not grow by
        one per query (a causal mask over padded sequences always satisfies both)."""
        valid = allowed.any(dim=1)                                                    # [B, Tk]
        lengths = valid.sum(dim=1)                                                    # [B]
        rank = valid.cumsum(dim=1) - 1                                                # key j's place in its row
        seen = allowed.sum(dim=2)                                                     # [B, Tq]: keys per query
        prefix = valid[:, None, :] & (rank[:, None, :] < seen[:, :, None])
        tq, tk = allowed.shape[1:]
        ahead = torch.arange(tk, device=allowed.device)[None, :] > torch.arange(tq, device=allowed.device)[:, None] + (tk - tq)
        if bool((allowed & ahead).any()):
            raise ValueError("bitparity attention takes causal masks over padded sequences; this mask lets a query "
                             "see a key after its own position (a bidirectional or look-ahead mask)")
        if not torch.equal(prefix, allowed):
            raise ValueError("bitparity attention takes causal masks over padded sequences; this mask gives a "
                             "query keys that are not the first keys of its sequence (a sliding window, "
                             "packed sequences or a custom mask)")
        # A query is active when it sees more keys than every query before it: padding on the left sees none,
        # padding on the right (or in a hole) sees what the query before it saw (HF masks keys, not queries).
        before = torch.nn.functional.pad(seen.cummax(dim=1).values, (1, 0))[:, :-1]
        active = seen > before
        past = lengths - active.sum(dim=1)
        expected = past[:, None] + active.cumsum(dim=1)                               # past + 1 + rank
        if not torch.equal(torch.where(active, seen, 0), torch.where(active, expected, 0)):
            raise ValueError("bitparity attention takes causal masks over padded sequences; this mask's queries "
                             "do not each see one more key than the query before them")
        return MaskPlan(keys=_front(valid), lengths=lengths, active=active, queries=_front(active), past=past)

    @property
    def counts(self):
        return self.active.sum(dim=1)

    def is_plain_causal(self, tq, tk):
        """Every key counts and query i sees i + 1 + (Tk - Tq) keys: §24.4's causal attention as it is."""
        return bool((self.lengths == tk).all()) and bool(self.active.all())


def _front(flags):
    """flags bool [B, N] -> int64 [B, N]: the indices of the True entries in order, then 0 for the rest."""
    order = torch.argsort((~flags).to(torch.int8), dim=1, stable=True)
    return torch.where(torch.arange(flags.shape[1], device=flags.device) < flags.sum(dim=1, keepdim=True), order, 0)


def causal_padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, device="cpu", **kwargs):
    """transformers' mask interface (registered as "bitparity"): HF's own boolean mask [B, 1, Tq, Tk] (its
    `sdpa_mask` of the causal function and the 2D padding mask), never skipped for a plain causal mask. A tensor,
    so that HF's generate can also build it ahead of the forward (static caches) and pass it through; the
    attention turns it into a MaskPlan once per forward (every layer gets this one tensor)."""
    from transformers.masking_utils import sdpa_mask
    allowed = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                        allow_is_causal_skip=False, device=device)
    return allowed.expand(batch_size, 1, q_length, kv_length)


# -- Exact data movement with a stated backward ------------------------------------------------------

class _Take(torch.autograd.Function):
    """out[b, :, s] = x[b, :, index[b, s]] where keep[b, s], else +0.0 (x [B, H, N, D] -> [B, H, S, D]).
    The kept slots of a row take distinct positions, so the backward puts each slot's gradient at its
    position (no adds); positions no kept slot takes get -0.0, the canonical sums' identity (spec 30.3)."""

    @staticmethod
    def forward(ctx, x, index, keep):
        ctx.save_for_backward(index, keep)
        ctx.n = x.shape[2]
        gathered = torch.gather(x, 2, index[:, None, :, None].expand(*x.shape[:2], index.shape[1], x.shape[3]))
        return torch.where(keep[:, None, :, None], gathered, 0.0)

    @staticmethod
    def backward(ctx, g):
        index, keep = ctx.saved_tensors
        b, h, _, d = g.shape
        grad = torch.full((b, h, ctx.n + 1, d), -0.0, dtype=g.dtype, device=g.device)
        target = torch.where(keep, index, ctx.n)                      # dropped slots land in a spare row
        grad.scatter_(2, target[:, None, :, None].expand(b, h, target.shape[1], d), g)
        return grad[:, :, :ctx.n], None, None


class _RepeatHeads(torch.autograd.Function):
    """Grouped-query attention's key/value heads repeated for their query heads: [B, Hkv, T, D] ->
    [B, Hkv * G, T, D], head h serving query heads h*G ... h*G + G - 1 (HF's repeat_kv). The backward adds
    the G query heads' gradients of a shared head left to right: ((d_0 + d_1) + d_2) + ... (spec 30.3)."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        return x.repeat_interleave(groups, dim=1)

    @staticmethod
    def backward(ctx, g):
        parts = g.unflatten(1, (-1, ctx.groups)).unbind(2)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total, None


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs):
    """transformers' attention interface (registered as "bitparity"): query [B, H, Tq, D], key and value
    [B, Hkv, Tk, D] (H a multiple of Hkv), attention_mask a boolean [B, 1, Tq, Tk] mask (or None: causal)
    -> ([B, Tq, H, D] in the query's dtype, None). §24.4's attention per sequence, over its own keys only
    (spec 30.3), so padding, its side and the KV cache's extra slots change no bit."""
    batch, heads, tq, d = query.shape
    tk = key.shape[2]
    if dropout:
        raise ValueError(f"bitparity attention has no dropout; got attention_dropout={dropout} in training mode")
    if sliding_window is not None:
        raise ValueError(f"bitparity attention has no sliding window; got sliding_window={sliding_window}")
    if scaling is not None and scaling != d ** -0.5:
        raise ValueError(f"bitparity attention scales by 1/sqrt(head_dim) = {d ** -0.5}; got scaling={scaling}")
    if heads % key.shape[1]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({key.shape[1]})")
    plan = _plan(attention_mask, batch, tq, tk, query.device)
    groups = heads // key.shape[1]
    if groups > 1:
        key, value = _RepeatHeads.apply(key, groups), _RepeatHeads.apply(value, groups)
    backend = getattr(module, "backend", None)
    if plan.is_plain_causal(tq, tk):
        out = ops.attention(query, key, value, causal=True, backend=backend)
    else:
        out = _planned_attention(query, key, value, plan, backend)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


_LAST_PLAN = None      # (weakref to HF's mask tensor, its MaskPlan): the layers of one forward share the tensor


def _plan(mask, batch, tq, tk, device):
    global _LAST_PLAN
    if mask is None:
        causal = torch.arange(tk, device=device)[None, :] <= torch.arange(tq, device=device)[:, None] + (tk - tq)
        return MaskPlan.from_mask(causal.expand(batch, tq, tk))
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        raise TypeError("bitparity attention takes a boolean [B, 1, Tq, Tk] mask (True = attend), as the "
                        f"\"bitparity\" mask interface makes; got {getattr(mask, 'dtype', type(mask).__name__)}")
    last = _LAST_PLAN
    if last is not None and last[0]() is mask:
        return last[1]
    plan = MaskPlan.from_mask(mask.expand(batch, 1, tq, tk)[:, 0])
    _LAST_PLAN = (weakref.ref(mask), plan)
    return plan


def _planned_attention(query, key, value, plan, backend):
    """Each row's keys moved to the front in order, its active queries to the front in order, and one
    §24.4 call per set of rows that share an alignment: rows with one active query (decode) together, and
    rows with several by their past length P (the query of rank r sees the first P + 1 + r keys: §24.4's
    bottom-right alignment for Tk = Tq + P). Then every query back to its own slot."""
    batch, heads, tq, d = query.shape
    counts = plan.counts
    key_kept = torch.arange(key.shape[2], device=query.device)[None, :] < plan.lengths[:, None]
    keys, values = (_Take.apply(t, plan.keys, key_kept) for t in (key, value))
    rank_kept = torch.arange(tq, device=query.device)[None, :] < counts[:, None]
    queries = _Take.apply(query, plan.queries, rank_kept)
    ranked = torch.zeros(batch, heads, tq, d, dtype=torch.float32, device=query.device)
    for rows, width, past in _alignments(plan):
        result = ops.attention(queries[rows, :, :width], keys[rows, :, :width + past],
                               values[rows, :, :width + past], causal=True, kv_lengths=plan.lengths[rows],
                               backend=backend)
        ranked = ranked.index_copy(0, rows, torch.nn.functional.pad(result, (0, 0, 0, tq - width)))
    return _Take.apply(ranked, (plan.active.cumsum(dim=1) - 1).clamp(min=0), plan.active)


def _alignments(plan):
    """[(rows, query slots, past)]: the rows with one active query (any past: kv_lengths decides), then each
    past length of the rows with several."""
    counts, past = plan.counts.tolist(), plan.past.tolist()
    groups = []
    single = [b for b, q in enumerate(counts) if q == 1]
    if single:
        groups.append((single, 1, max(past[b] for b in single)))
    for p in sorted({past[b] for b, q in enumerate(counts) if q > 1}):
        rows = [b for b, q in enumerate(counts) if q > 1 and past[b] == p]
        groups.append((rows, max(counts[b] for b in rows), p))
    device = plan.lengths.device
    return [(torch.tensor(rows, dtype=torch.int64, device=device), width, p) for rows, width, p in groups]


# -- The replacement modules: HF's parameters, bitparity's ops ---------------------------------------
# Each computes in binary32 from exactly upcast inputs and rounds its output once to the activation dtype
# (spec 30.1); for a float32 model the rounding is the identity.

class Embedding(torch.nn.Module):
    """nn.Embedding -> bitparity.embedding (§29.8). The row at padding_idx gets a +0.0 gradient, as torch's."""

    def __init__(self, original, backend):
        super().__init__()
        self.weight, self.padding_idx, self.backend = original.weight, original.padding_idx, backend

    def forward(self, input_ids):
        h = ops.embedding(input_ids, self.weight, backend=self.backend)
        if self.padding_idx is not None and h.requires_grad:
            pad = (input_ids == self.padding_idx)[..., None]
            h.register_hook(lambda g: g.masked_fill(pad, 0.0))
        return h.to(self.weight.dtype)


class RMSNorm(torch.nn.Module):
    """HF's RMSNorm (Llama, Qwen3, and Qwen3's per-head q/k norms) -> bitparity.rms_norm (§24.2)."""

    def __init__(self, original, backend):
        super().__init__()
        self.weight, self.eps, self.backend = original.weight, original.variance_epsilon, backend

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps, backend=self.backend).to(x.dtype)


class Linear(torch.nn.Module):
    """nn.Linear (lm_head) -> bitparity.linear (§24.1)."""

    def __init__(self, original, backend):
        super().__init__()
        self.weight, self.bias, self.backend = original.weight, original.bias, backend

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias, backend=self.backend).to(x.dtype)


def _fused(x, linears, backend):
    """One bitparity.linear over the concatenated weights (and biases) of linears that read the same x, split
    back per linear: the same output bits as separate calls, and x's gradient is one §3 sum over all their
    outputs (spec 29.9, 30.5). cat and split are exact both ways."""
    weight = torch.cat([m.weight for m in linears])
    bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    out = ops.linear(x, weight, bias, backend=backend).to(x.dtype)
    return out.split([m.weight.shape[0] for m in linears], dim=-1)


class MLP(torch.nn.Module):
    """SwiGLU MLP (LlamaMLP, Qwen3MLP, Qwen3-MoE's dense layers): down(silu_mul(gate(x), up(x))), gate and up
    as one fused linear."""

    def __init__(self, original, backend):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = original.gate_proj, original.up_proj, original.down_proj
        self.backend = backend

    def forward(self, x):
        gate, up = _fused(x, (self.gate_proj, self.up_proj), self.backend)
        act = ops.silu_mul(gate, up, backend=self.backend).to(x.dtype)
        return ops.linear(act, self.down_proj.weight, self.down_proj.bias, backend=self.backend).to(x.dtype)


class SparseMoeBlock(torch.nn.Module):
    """Qwen3MoeSparseMoeBlock -> bitparity.moe (§24.6; norm_topk_prob either way). The experts' fused
    gate_up_proj [E, 2I, D] is split into gate [E, I, D] and up (a view; its gradient is their concatenation)."""

    def __init__(self, original, backend):
        super().__init__()
        # HF's names in HF's order: state_dict() and parameters() are the unpatched model's
        self.experts, self.gate = original.experts, original.gate
        self.top_k, self.norm_topk_prob = original.gate.top_k, bool(original.gate.norm_topk_prob)
        self.backend = backend

    def forward(self, hidden_states):
        shape = hidden_states.shape
        gate, up = self.experts.gate_up_proj.split(self.experts.intermediate_dim, dim=1)
        out = ops.moe(hidden_states.reshape(-1, shape[-1]), self.gate.weight, gate, up, self.experts.down_proj,
                      self.top_k, norm_topk_prob=self.norm_topk_prob, backend=self.backend)
        return out.to(hidden_states.dtype).reshape(shape)


class RotaryTables(torch.nn.Module):
    """HF's rotary embedding -> §24.3's tables (binary64 on the host, rounded once), made at patch time for
    config.max_position_embeddings positions and gathered at the position ids: (cos, sin) [B, T, D/2]."""

    def __init__(self, original, config, head_dim):
        super().__init__()
        self.tables = ops.rotary_tables(config.max_position_embeddings, head_dim, _rope_theta(config))
        device = original.inv_freq.device
        self.register_buffer("cos", self.tables[0].to(device), persistent=False)
        self.register_buffer("sin", self.tables[1].to(device), persistent=False)

    def _apply(self, fn, recurse=True):
        """model.to(device) moves the tables; model.to(bfloat16) or .half() must not round them (§30.1): they are
        the host's binary32 tables on whatever device the cast leaves them."""
        super()._apply(fn, recurse)
        self.cos, self.sin = (t.to(self.cos.device) for t in self.tables)
        return self

    def forward(self, x, position_ids):
        if position_ids.numel() and int(position_ids.max()) >= self.cos.shape[0]:
            raise ValueError(f"position_ids must be below max_position_embeddings = {self.cos.shape[0]}; got "
                             f"{int(position_ids.max())}")
        return self.cos[position_ids], self.sin[position_ids]


class Attention(torch.nn.Module):
    """LlamaAttention, Qwen3Attention, Qwen3MoeAttention: fused q/k/v linear, Qwen3's per-head q/k norms,
    rotary (§24.3 with the tables of RotaryTables), HF's KV cache, the registered "bitparity" attention
    (GQA/MQA, padding on either side), o_proj.

    `paged` (None: HF's cache and mask) may be set to a module that keeps the keys and values itself and
    attends over them: called as paged(q, k, v) with the rotated q [B, H, T, D] and k, v [B, Hkv, T, D], it
    returns [B, T, H, D] in q's dtype (bitparity.vllm's attention over vLLM's paged KV cache, spec 30.8)."""

    def __init__(self, original, backend):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (original.q_proj, original.k_proj, original.v_proj,
                                                              original.o_proj)
        norms = [getattr(original, name, None) for name in ("q_norm", "k_norm")]
        self.q_norm, self.k_norm = (None, None) if norms[0] is None else (RMSNorm(n, backend) for n in norms)
        self.layer_idx, self.head_dim, self.scaling = original.layer_idx, original.head_dim, original.scaling
        self.config, self.backend = original.config, backend
        self.paged = None

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, past_key_values=None,
                **kwargs):
        cache = cache if cache is not None else past_key_values
        heads = (*hidden_states.shape[:-1], -1, self.head_dim)                              # [B, T, H, D]
        q, k, v = (t.reshape(heads) for t in _fused(hidden_states, (self.q_proj, self.k_proj, self.v_proj),
                                                       self.backend))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = (t[:, :, None, :] for t in position_embeddings)                         # [B, T, 1, D/2]
        q, k = (ops.rotary(t, cos, sin, backend=self.backend).to(t.dtype) for t in (q, k))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))                                   # [B, H, T, D]
        if self.paged is not None:
            out = self.paged(q, k, v)
        else:
            if cache is not None:
                k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)      # as HF's attention modules call it
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
            out, _ = ALL_ATTENTION_FUNCTIONS[NAME](self, q, k, v, attention_mask, scaling=self.scaling,
                                                   dropout=self.config.attention_dropout if self.training else 0.0)
        out = out.reshape(*hidden_states.shape[:-1], -1)
        return ops.linear(out, self.o_proj.weight, self.o_proj.bias, backend=self.backend).to(out.dtype), None


def causal_lm_loss(logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                   **kwargs):
    """HF's ForCausalLMLoss on bitparity ops (spec 30.4): token t's label is labels[t + 1] (or shift_labels[t]);
    loss = -(the §15.1 masked mean of token_logprobs over the labelled tokens), or with num_items_in_batch
    -(§3 sum) / num_items_in_batch, one binary32 division."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    rows = logits.reshape(-1, logits.shape[-1])
    targets = shift_labels.reshape(-1).to(rows.device)
    labelled = targets != ignore_index
    logp = ops.token_logprobs(rows, torch.where(labelled, targets, 0))
    if num_items_in_batch is None:
        return -ops.masked_mean(logp, labelled)
    total = ops.sum(logp[None], labelled[None])[0]
    return -(total / torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=total.device))


# -- Rollout and trainer helpers ----------------------------------------------------------------------

class Sampler:
    """A transformers logits processor that draws each next token with bitparity.sample (spec 22): Philox noise
    of (seed, position, token) only, so a request's tokens do not depend on its batch, padding or step.
    Pass it to `generate(..., logits_processor=[sampler], do_sample=False)`: it returns scores that are -inf
    except at the token it drew, which HF's greedy step then takes.

    seeds int64 [B] (one per request); prompt_mask [B, T0] the prompt's attention mask (1 = token), so the
    token drawn at step j sits at position (prompt length) + j, as in an unpadded sequence. temperature
    0 is greedy (the lowest-index maximum). After generate, `tokens` and `logprobs` are [B, steps]: the
    tokens drawn and the log-probabilities of `logprobs` kind ("processed", "scaled" or "raw", spec 22.1)."""

    def __init__(self, seeds, prompt_mask, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logprobs="processed",
                 backend=None):
        if not isinstance(prompt_mask, torch.Tensor) or prompt_mask.dim() != 2:
            raise ValueError("prompt_mask must be the prompt's attention mask, a [B, T0] tensor")
        self.seeds, self.lengths, self.width = seeds, prompt_mask.sum(dim=1).to(torch.int64), prompt_mask.shape[1]
        self.options = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, logprobs=logprobs,
                            backend=backend)
        self._tokens, self._logprobs = [], []

    def __call__(self, input_ids, scores):
        positions = self.lengths.to(scores.device) + (input_ids.shape[1] - self.width)
        tokens, logprobs = ops.sample(scores, self.seeds.to(scores.device), positions, **self.options)
        if bool((tokens < 0).any()):
            raise ValueError("bitparity.sample found no distribution in a row (a NaN or +inf logit, or all -inf)")
        self._tokens.append(tokens)
        self._logprobs.append(logprobs)
        return torch.full_like(scores, -math.inf).scatter_(1, tokens[:, None], 0.0)

    @property
    def tokens(self):
        return torch.stack(self._tokens, dim=1)

    @property
    def logprobs(self):
        return torch.stack(self._logprobs, dim=1)


def sequence_logprobs(model, input_ids, attention_mask=None, *, temperature=1.0):
    """The trainer's side: log p(token t | tokens < t) for t >= 1 by bitparity.token_logprobs on the model's
    logits, [B, T - 1] float32. With an attention_mask, padding may sit on either side: position ids count
    each row's tokens from 0 (as generate's), and entries at padding are whatever its logits give. A one-token
    sequence (T = 1) has no token to score: the result is [B, 0], and the model does not run."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise TypeError(f"input_ids must be a [B, T] torch.Tensor; got "
                        f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__}")
    if input_ids.shape[1] < 2:
        return torch.empty(input_ids.shape[0], 0, device=input_ids.device)
    position_ids = None
    if attention_mask is not None:
        position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    rows = logits[:, :-1].reshape(-1, logits.shape[-1])
    return ops.token_logprobs(rows, input_ids[:, 1:].reshape(-1), temperature).reshape(input_ids.shape[0], -1)


# -- patch / unpatch --------------------------------------------------------------------------------------

def _rope_theta(config):
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", 10000.0))


_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def _check(model):
    """Every reason this model cannot run entirely on bitparity ops, before anything is replaced."""
    kind = type(model).__name__
    if kind not in SUPPORTED:
        raise TypeError(f"bitparity.patch supports {', '.join(SUPPORTED)}; got {kind}")
    config = model.config
    problems = []
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        problems.append(f"rope_type={rope!r} (only the default rotary is implemented)")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config.hidden_act!r} (the MLP is SwiGLU: silu)")
    sliding = _sliding_layers(model)
    if sliding:
        problems.append(f"sliding_window={config.sliding_window} (HF slides layers {sliding})")
    if getattr(config, "output_router_logits", False):
        problems.append("output_router_logits=True (the router's auxiliary loss runs torch's ops)")
    if getattr(config, "pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={config.pretraining_tp}")
    for name, module in model.named_modules():
        # The replacements read .weight/.bias of these directly: a wrapper (peft's LoRA, a quantized linear)
        # would be skipped silently, so anything but a plain nn.Linear is refused.
        if name.rsplit(".", 1)[-1] in _LINEARS and type(module) is not torch.nn.Linear:
            problems.append(f"{name} is a {type(module).__name__}, not torch.nn.Linear (merge LoRA adapters first)")
        attn = getattr(module, "self_attn", None)
        if attn is not None and attn.scaling != attn.head_dim ** -0.5:
            problems.append(f"{name}.self_attn.scaling={attn.scaling} (not 1/sqrt(head_dim))")
    if problems:
        raise ValueError(f"bitparity.patch cannot run this {kind} on canonical ops: {'; '.join(problems)}")


def _sliding_layers(model):
    """The decoder layers HF runs with a sliding window: Qwen3 gives one to the layers config.layer_types marks
    "sliding_attention" (from max_window_layers on) and only with use_sliding_window, Qwen3-MoE to every layer
    with use_sliding_window. A config that asks for a window no layer gets runs with full attention, and is
    accepted; each layer's own attention module and the config's layer types are both read."""
    config = model.config
    marked = getattr(config, "sliding_window", None) is not None and list(getattr(config, "layer_types", None) or ())
    return [i for i, layer in enumerate(model.model.layers)
            if getattr(layer.self_attn, "sliding_window", None) is not None
            or (marked and i < len(marked) and marked[i] == "sliding_attention")]


_CONFIG_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "num_experts", "moe_intermediate_size",
                  "decoder_sparse_step")


def _check_config(model):
    """The config's numeric fields, named config.<field>, with the rules of the ops that will use them (spec
    30.2), before any module is replaced: the sizes are integers >= 1; the query heads a multiple of the
    key/value heads; head_dim even (rotary's halves, spec 24.3); num_experts_per_tok in [1, num_experts];
    rms_norm_eps (and each RMSNorm's variance_epsilon) a finite real > 0 that rounds to a normal float32, as
    rms_norm takes (spec 24.2); rope_theta a finite real > 1, as rotary_tables takes. A field the config does not
    have (or holds None: num_key_value_heads, head_dim) is derived as HF derives it."""
    config = model.config
    for field in _CONFIG_COUNTS:
        if getattr(config, field, None) is not None:
            ops._positive_int(f"config.{field}", getattr(config, field))
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise ValueError(f"config.num_attention_heads must be a multiple of config.num_key_value_heads = {kv_heads} "
                         f"(grouped-query attention); got {heads}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim % 2:
        raise ValueError(f"config.head_dim (or hidden_size // num_attention_heads) must be even (rotary's two halves); "
                         f"got {head_dim}")
    if getattr(config, "num_experts", None) is not None:
        ops._positive_int("config.num_experts_per_tok", config.num_experts_per_tok, high=config.num_experts,
                          why=" (config.num_experts)")
    ops._normal_float32("config.rms_norm_eps", config.rms_norm_eps)
    for name, module in model.named_modules():
        if hasattr(module, "variance_epsilon"):
            ops._normal_float32(f"{name}.variance_epsilon", module.variance_epsilon)
    theta_field = ("config.rope_parameters['rope_theta']" if "rope_theta" in (getattr(config, "rope_parameters", None)
                                                                             or {}) else "config.rope_theta")
    ops._real(theta_field, _rope_theta(config), low=1.0, low_open=True)


def _replacements(model, backend):
    """[(parent, attribute, new module)] for every computing module of a checked model."""
    inner = model.model
    head_dim = inner.layers[0].self_attn.head_dim
    plan = [(inner, "embed_tokens", Embedding(inner.embed_tokens, backend)),
            (inner, "norm", RMSNorm(inner.norm, backend)),
            (inner, "rotary_emb", RotaryTables(inner.rotary_emb, model.config, head_dim)),
            (model, "lm_head", Linear(model.lm_head, backend))]
    for layer in inner.layers:
        mlp = layer.mlp
        kind = type(mlp).__name__
        if kind.endswith("SparseMoeBlock"):
            new_mlp = SparseMoeBlock(mlp, backend)
        elif kind.endswith("MLP"):
            new_mlp = MLP(mlp, backend)
        else:
            raise TypeError(f"bitparity.patch: unknown MLP module {kind}")
        plan += [(layer, "self_attn", Attention(layer.self_attn, backend)), (layer, "mlp", new_mlp),
                 (layer, "input_layernorm", RMSNorm(layer.input_layernorm, backend)),
                 (layer, "post_attention_layernorm", RMSNorm(layer.post_attention_layernorm, backend))]
    return plan


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, causal_padding_mask)


def _refuse_unsupported_outputs(module, args, kwargs):
    """A forward pre-hook on the patched model: outputs the replaced modules cannot give raise, naming them."""
    for name, why in (("output_router_logits", "the router's logits and auxiliary loss are not recorded"),
                      ("output_attentions", "bitparity's attention does not return its probabilities")):
        if kwargs.get(name):
            raise ValueError(f"a model patched by bitparity cannot give {name}=True: {why}")


def patch(model, *, backend=None):
    """Run a Hugging Face LlamaForCausalLM, Qwen3ForCausalLM or Qwen3MoeForCausalLM on bitparity ops, in
    place; returns the model. backend: a bitparity backend name, or None for the current one at each call
    (`bitparity.use_backend`). Every computing module is replaced (the originals are kept for `unpatch`), the
    attention implementation of this model's own copy of its config becomes "bitparity" (other models built
    from the same config object are left alone), and `forward(labels=...)` computes its loss with bitparity
    ops. A model, module or option that cannot run on canonical ops raises TypeError/ValueError naming it,
    before anything changes."""
    if hasattr(model, _ORIGINALS):
        raise ValueError("this model is already patched; call bitparity.unpatch(model) first")
    if backend is not None:
        _check_name(backend)
    _check(model)
    _check_config(model)
    plan = _replacements(model, backend)
    _register()
    originals = [(parent, name, getattr(parent, name)) for parent, name, _ in plan]
    for parent, name, module in plan:
        module.train(getattr(parent, name).training)
        setattr(parent, name, module)
    config = model.config
    hook = model.register_forward_pre_hook(_refuse_unsupported_outputs, with_kwargs=True)
    object.__setattr__(model, _ORIGINALS, (originals, config, hook, model.__dict__.get("_loss_function")))
    model.config = model.model.config = copy.deepcopy(config)
    model.config._attn_implementation = NAME
    model.loss_function = causal_lm_loss
    return model


def unpatch(model):
    """Undo patch: the original modules, config object and loss; returns the model."""
    if not hasattr(model, _ORIGINALS):
        raise ValueError("this model is not patched by bitparity.patch")
    originals, config, hook, loss = getattr(model, _ORIGINALS)
    for parent, name, module in originals:
        setattr(parent, name, module)
    model.config = model.model.config = config
    hook.remove()
    if loss is None:
        del model._loss_function
    else:
        model.loss_function = loss
    object.__delattr__(model, _ORIGINALS)
    return model
