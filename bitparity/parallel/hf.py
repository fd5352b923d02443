"""A patched Hugging Face model sharded over a tensor-parallel and an expert-parallel group (spec 31.5).

`shard_model(model, tp_group=..., ep_group=...)` takes a Qwen3, Qwen3-MoE or Llama model already under
`bitparity.patch` and shards it in place, Megatron's layout:

- attention: q, k and v projections column-parallel over the TP group by whole heads (rank t holds query heads
  shard_range(H, TP, t) and key/value heads shard_range(Hkv, TP, t), so a grouped key/value head stays with
  every query head it serves; where TP is a multiple of Hkv, each key/value head is replicated on the TP / Hkv
  ranks of its query heads), Qwen3's q/k norms over every head (gathered), the heads' attention local, o_proj
  row-parallel;
- dense MLP: gate and up column-parallel (intermediate columns by shard_range), down row-parallel;
- Qwen3-MoE's sparse blocks: the experts over the EP group (parallel.moe), the block's tokens cut into one even
  run per EP rank;
- lm_head: vocab-parallel (rows by vocab_shard), the log-probabilities, sampling and loss by the vocab-parallel
  ops over the TP group;
- replicated: the embedding, every RMSNorm weight, the router, the value head of a policy.

Every parameter stays the same torch.nn.Parameter object (its .data becomes this rank's shard), so optimizers,
parameter lists and names built before sharding keep working. `full(p)` gathers a parameter into its
single-process tensor and `clip_grad_norm_` is spec 29.10's clip over the gathered gradients: both exact data
movement, so the weights digest of a sharded run is one process's.
"""

import dataclasses

import torch
import torch.distributed as dist

from .. import distributed, hf, ops, optim
from .linear import column_parallel_linear, row_parallel_linear, shard_range
from .moe import expert_range, moe
from .vocab import vocab_shard
from .vocab import sample as _vocab_sample
from .vocab import token_logprobs as _vocab_token_logprobs

_LAYOUT = "_bitparity_shard"        # a sharded Parameter's Layout
_SHARDED = "_bitparity_sharded"     # on a sharded model: (tp_group, ep_group)


# -- Exact data movement across a group, with its stated backward --------------------------------------

def _rank_world(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _gather_pieces(t, group, dim, sizes):
    """Every rank's t (sizes[r] entries along dim on rank r, the same other dimensions), in rank order: one
    all_gather of the pieces padded to the largest (whole binary32 values, exact)."""
    rank, world = _rank_world(group)
    moved = t.detach().movedim(dim, 0)
    padded = torch.zeros((max(sizes), *moved.shape[1:]), dtype=t.dtype, device=t.device)
    padded[:sizes[rank]] = moved
    parts = [torch.empty_like(padded) for _ in range(world)]
    distributed._collective("parallel.shard_model", "all_gather", lambda: dist.all_gather(parts, padded, group=group))
    return [part[:n].movedim(0, dim) for part, n in zip(parts, sizes)]


@dataclasses.dataclass(frozen=True)
class Slots:
    """How the ranks of a group hold a tensor cut along one dimension into slots: rank r holds slot slots[r]
    (several ranks may hold one slot: replicas, the same bits), slot s has sizes[s] entries."""
    slots: tuple
    sizes: tuple

    @staticmethod
    def split(sizes):
        return Slots(tuple(range(len(sizes))), tuple(sizes))

    def whole(self, t, group, dim):
        """The concatenation of the slots in order along dim, each from the first rank holding it."""
        pieces = _gather_pieces(t, group, dim, [self.sizes[s] for s in self.slots])
        return torch.cat([pieces[self.slots.index(s)] for s in range(len(self.sizes))], dim=dim)

    def mine(self, t, group, dim):
        slot = self.slots[dist.get_rank(group)]
        return t.narrow(dim, sum(self.sizes[:slot]), self.sizes[slot]).contiguous()


class _Gather(torch.autograd.Function):
    """Forward: the whole tensor (Slots.whole) from every rank's slot. Backward: this rank's slot of the
    gradient. Correct when every rank's upstream gradient of the whole tensor is the same, as it is where
    everything after the gather is replicated."""

    @staticmethod
    def forward(ctx, t, group, dim, slots):
        ctx.group, ctx.dim, ctx.slots = group, dim, slots
        return slots.whole(t, group, dim)

    @staticmethod
    def backward(ctx, g):
        return ctx.slots.mine(g, ctx.group, ctx.dim), None, None, None


class _Take(torch.autograd.Function):
    """Forward: this rank's slot of a tensor every rank holds alike. Backward: the whole gradient assembled from
    every slot's gradient (Slots.whole), the same tensor on every rank: each position's gradient comes from the
    rank that used it (replicas of a slot have the same gradient); nothing is added."""

    @staticmethod
    def forward(ctx, t, group, dim, slots):
        ctx.group, ctx.dim, ctx.slots = group, dim, slots
        return slots.mine(t, group, dim)

    @staticmethod
    def backward(ctx, g):
        return ctx.slots.whole(g.contiguous(), ctx.group, ctx.dim), None, None, None


class _OwnerGradient(torch.autograd.Function):
    """Forward: the identity. Backward: the gradient on the rank that owns a replicated slot, +0.0 on its other
    replicas, so a column-parallel linear whose output rows are replicated counts each output once in its exact
    dx sum (a zero quantises to 0: spec 24.1)."""

    @staticmethod
    def forward(ctx, t, owner):
        ctx.owner = owner
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return (g if ctx.owner else torch.zeros_like(g)), None


class _RepeatAcross(torch.autograd.Function):
    """Grouped-query attention whose key/value head is replicated on the R ranks holding its query heads: forward
    the head repeated for this rank's query heads ([B, 1, T, D] -> [B, H_r, T, D]); backward the left-to-right sum
    of the gradients of ALL its G query heads, gathered from its R ranks in query-head order (spec 30.3's
    ((d_0 + d_1) + d_2) + ...), the same on each replica."""

    @staticmethod
    def forward(ctx, x, group, replicas, heads):
        ctx.group, ctx.replicas = group, replicas
        return x.repeat_interleave(heads, dim=1)

    @staticmethod
    def backward(ctx, g):
        rank, world = _rank_world(ctx.group)
        first = rank - rank % ctx.replicas
        pieces = _gather_pieces(g.contiguous(), ctx.group, 1, [g.shape[1]] * world)
        parts = torch.cat(pieces[first:first + ctx.replicas], dim=1).unbind(1)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total[:, None], None, None, None


def token_runs(rows, world):
    """Rows per rank when `rows` tokens are cut over `world` ranks for an expert-parallel call (spec 31.5): rank r
    takes rows [r rows / W, (r + 1) rows / W) (floor). Any cut gives one process's bits (parallel.moe folds an
    expert's and the router's gradients over the global token order); this one balances the ranks."""
    return [(r + 1) * rows // world - r * rows // world for r in range(world)]


# -- Which parameter a rank holds ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """A sharded parameter: rank r of `group` holds the entries `indices[r]` (int64) along `dim` of the
    single-process tensor of shape `shape`; where several ranks hold the same entries (replicas), the one with
    owners[r] True is the one read when the whole tensor is assembled."""
    group: object
    dim: int
    indices: tuple
    owners: tuple
    shape: tuple


def _shard(p, group, dim, indices, owners=None):
    """Make Parameter p hold this rank's entries along dim (its own copy) and record the layout."""
    rank, world = _rank_world(group)
    owners = (True,) * world if owners is None else tuple(owners)
    layout = Layout(group, dim, tuple(torch.as_tensor(i, dtype=torch.int64) for i in indices), owners, tuple(p.shape))
    with torch.no_grad():
        p.data = p.data.index_select(dim, layout.indices[rank].to(p.device)).contiguous()
    setattr(p, _LAYOUT, layout)


def _ranges(size, world, per_rank):
    """[arange(start, stop)] for each rank of (start, stop) = per_rank(size, world, rank)."""
    return [torch.arange(*per_rank(size, world, r)) for r in range(world)]


def _scaled(ranges, width):
    """Index ranges of heads -> the rows of those heads, `width` rows per head."""
    return [(r[:, None] * width + torch.arange(width)[None, :]).reshape(-1) for r in ranges]


def _vocab_indices(vocab, world):
    return [torch.tensor(list(vocab_shard(vocab, world, r)), dtype=torch.int64) for r in range(world)]


def full(p, grad=False):
    """The single-process tensor of a parameter (with grad=True: of its gradient): a sharded one's pieces
    gathered from its group and put at their indices (exact); an unsharded one's own, detached. Collective for a
    sharded parameter: every rank of its group calls it."""
    local = p.grad if grad else p
    layout = getattr(p, _LAYOUT, None)
    if layout is None:
        return local.detach()
    return _assemble(local.detach(), layout)


def local_part(p, tensor):
    """This rank's entries of `tensor`, a single-process tensor of parameter p's shape (a checkpoint's weight, a
    gathered gradient): what shard_model gave p (exact, no communication); tensor itself where p is unsharded."""
    layout = getattr(p, _LAYOUT, None)
    if layout is None:
        return tensor
    index = layout.indices[dist.get_rank(layout.group)].to(tensor.device)
    return tensor.index_select(layout.dim, index).contiguous()


def _assemble(local, layout):
    sizes = [len(i) for i in layout.indices]
    pieces = _gather_pieces(local, layout.group, layout.dim, sizes)
    out = torch.empty(layout.shape, dtype=local.dtype, device=local.device)
    for piece, index, owner in zip(pieces, layout.indices, layout.owners):
        if owner:
            out.index_copy_(layout.dim, index.to(local.device), piece)
    return out


@torch.no_grad()
def clip_grad_norm_(params, max_norm, *, backend=None):
    """Spec 29.10's clip with one process's bits over parameters of which some are sharded: every sharded
    gradient is gathered whole (exact), `bitparity.optim.clip_grad_norm_` runs over the single-process gradients
    in the order given on every rank, and each rank keeps its own entries of the clipped gradients. The ranks
    of a sharded parameter's group run the same graph, so they all hold its gradient or none (then it is
    skipped, as one process skips it). Returns the norm."""
    params = list(params)
    stand_ins, sharded = [], []
    for p in params:
        layout = getattr(p, _LAYOUT, None)
        if layout is None or p.grad is None:
            stand_ins.append(p)
            continue
        whole = torch.empty(layout.shape, dtype=p.grad.dtype, device=p.grad.device)
        whole.grad = _assemble(p.grad, layout)
        stand_ins.append(whole)
        sharded.append((p, whole))
    norm = optim.clip_grad_norm_(stand_ins, max_norm, backend=backend)
    for p, whole in sharded:
        p.grad = local_part(p, whole.grad)
    return norm


# -- The sharded modules ----------------------------------------------------------------------------------

def _cat_bias(linears):
    return None if linears[0].bias is None else torch.cat([m.bias for m in linears])


class TensorParallelAttention(torch.nn.Module):
    """bitparity.hf.Attention with this rank's heads: the q/k/v projections as one column-parallel linear of
    this rank's rows (so x's gradient is §29.2's sum over all ranks' 3 H hd outputs, exchanged exactly), the
    q/k norms over every head (gathered: their weight gradients fold over all B T H rows in the single-process
    order), rotary, the KV cache and the registered attention on this rank's heads, o_proj row-parallel. HF's
    module names are kept (q_proj, …), so named_parameters() names the same tensors. hf.Attention's forward is
    written out again here because its linears are where the exchanges go."""

    def __init__(self, original, group, heads, kv_heads, replicas):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (original.q_proj, original.k_proj, original.v_proj,
                                                              original.o_proj)
        self.q_norm, self.k_norm = original.q_norm, original.k_norm
        self.layer_idx, self.head_dim, self.scaling = original.layer_idx, original.head_dim, original.scaling
        self.config, self.backend, self.group = original.config, original.backend, group
        rank, world = _rank_world(group)
        self.replicas = replicas          # ranks holding each key/value head (1: the heads are split)
        self.owner = rank % replicas == 0
        self.q_slots = Slots.split([heads] * world)
        self.kv_slots = Slots(tuple(r // replicas for r in range(world)), (kv_heads,) * (world // replicas))

    def _norm_all_heads(self, t, norm, slots):
        """norm over every head of the model (gathered along the head axis), then this rank's heads again."""
        return _Take.apply(norm(_Gather.apply(t, self.group, 2, slots)), self.group, 2, slots)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, past_key_values=None,
                **kwargs):
        cache = cache if cache is not None else past_key_values
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([m.weight for m in projections])
        out = column_parallel_linear(hidden_states, weight, _cat_bias(projections), group=self.group,
                                     backend=self.backend).to(hidden_states.dtype)
        heads = (*hidden_states.shape[:-1], -1, self.head_dim)                              # [B, T, H_r, D]
        q, k, v = (t.reshape(heads) for t in out.split([m.weight.shape[0] for m in projections], dim=-1))
        if self.replicas > 1:
            k, v = _OwnerGradient.apply(k, self.owner), _OwnerGradient.apply(v, self.owner)
        if self.q_norm is not None:
            q, k = self._norm_all_heads(q, self.q_norm, self.q_slots), self._norm_all_heads(k, self.k_norm,
                                                                                             self.kv_slots)
        cos, sin = (t[:, :, None, :] for t in position_embeddings)
        q, k = (ops.rotary(t, cos, sin, backend=self.backend).to(t.dtype) for t in (q, k))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))                                   # [B, H_r, T, D]
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        if self.replicas > 1:
            k, v = (_RepeatAcross.apply(t, self.group, self.replicas, q.shape[1]) for t in (k, v))
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        out, _ = ALL_ATTENTION_FUNCTIONS[hf.NAME](self, q, k, v, attention_mask, scaling=self.scaling,
                                                  dropout=self.config.attention_dropout if self.training else 0.0)
        out = out.reshape(*hidden_states.shape[:-1], -1)                                  # this rank's H_r hd columns
        return row_parallel_linear(out, self.o_proj.weight, self.o_proj.bias, group=self.group,
                                   backend=self.backend).to(out.dtype), None


class TensorParallelMLP(torch.nn.Module):
    """bitparity.hf.MLP with this rank's intermediate columns: gate and up as one column-parallel linear,
    silu_mul on this rank's columns, down row-parallel."""

    def __init__(self, original, group):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = original.gate_proj, original.up_proj, original.down_proj
        self.backend, self.group = original.backend, group

    def forward(self, x):
        pair = (self.gate_proj, self.up_proj)
        out = column_parallel_linear(x, torch.cat([m.weight for m in pair]), _cat_bias(pair), group=self.group,
                                     backend=self.backend).to(x.dtype)
        gate, up = out.split(self.gate_proj.weight.shape[0], dim=-1)
        act = ops.silu_mul(gate, up, backend=self.backend).to(x.dtype)
        return row_parallel_linear(act, self.down_proj.weight, self.down_proj.bias, group=self.group,
                                   backend=self.backend).to(x.dtype)


class ExpertParallelMoe(torch.nn.Module):
    """bitparity.hf.SparseMoeBlock with this rank's experts (expert_range): the block's tokens (replicated on the
    EP ranks) are cut by token_runs, each rank sends its run through parallel.moe, and the outputs are gathered
    back in token order. parallel.moe gives every rank the router's whole single-process gradient."""

    def __init__(self, original, group):
        super().__init__()
        self.experts, self.gate = original.experts, original.gate
        self.top_k, self.norm_topk_prob = original.top_k, original.norm_topk_prob
        self.backend, self.group = original.backend, group

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        _, world = _rank_world(self.group)
        runs = token_runs(x.shape[0], world)
        slots = Slots.split(runs)
        mine = _Take.apply(x, self.group, 0, slots)
        gate, up = self.experts.gate_up_proj.split(self.experts.intermediate_dim, dim=1)
        out = moe(mine, self.gate.weight, gate, up, self.experts.down_proj, self.top_k,
                  norm_topk_prob=self.norm_topk_prob, group=self.group, backend=self.backend)
        return _Gather.apply(out.to(hidden_states.dtype), self.group, 0, slots).reshape(shape)


class VocabParallelHead(torch.nn.Module):
    """bitparity.hf.Linear (lm_head) with this rank's vocabulary rows (vocab_shard): returns this rank's logits
    [..., V_r], which the vocab-parallel ops of the TP group read."""

    def __init__(self, original, group):
        super().__init__()
        self.weight, self.backend, self.group = original.weight, original.backend, group

    def forward(self, x):
        weight = self.weight
        if weight.shape[0] == 0:
            # vocab_shard gives the ranks past the vocabulary's last segment no rows, and column_parallel_linear
            # takes at least one: a zero row, sliced off, adds nothing (spec 24.1: a zero quantises to 0, so its
            # gradient column adds no integer to the exact dx sum) and gets the +0.0 gradient that is dropped.
            weight = torch.cat([weight, weight.new_zeros(1, weight.shape[1])])
            return column_parallel_linear(x, weight, group=self.group, backend=self.backend)[..., :0].to(x.dtype)
        return column_parallel_linear(x, weight, group=self.group, backend=self.backend).to(x.dtype)


def _vocab_parallel_loss(group):
    def causal_lm_loss(logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index=-100,
                       shift_labels=None, **kwargs):
        """hf.causal_lm_loss (spec 30.4) with this rank's vocabulary shard of the logits: the log-probabilities
        by parallel.token_logprobs over the TP group, then the same masked mean or sum."""
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        rows = logits.flatten(0, -2)                   # not reshape(-1, V_r): a rank's shard may be empty
        targets = shift_labels.reshape(-1).to(rows.device)
        labelled = targets != ignore_index
        logp = _vocab_token_logprobs(rows, torch.where(labelled, targets, 0), group=group)
        if num_items_in_batch is None:
            return -ops.masked_mean(logp, labelled)
        total = ops.sum(logp[None], labelled[None])[0]
        return -(total / torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=total.device))
    return causal_lm_loss


# -- shard_model --------------------------------------------------------------------------------------------

def check_shardable(config, tp, ep):
    """ValueError naming the config field and the group size unless a model of this HF config can be sharded
    over TP = tp and EP = ep ranks (spec 31.5); called by shard_model and by rl-check before it spawns ranks."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    problems = []
    if tp > 1:
        if heads % tp:
            problems.append(f"config.num_attention_heads = {heads} is not a multiple of the tensor-parallel size "
                            f"{tp} (heads are split whole)")
        elif kv_heads % tp and tp % kv_heads:
            problems.append(f"config.num_key_value_heads = {kv_heads} neither is a multiple of the tensor-parallel "
                            f"size {tp} (split whole, each with its query heads) nor divides it (each replicated on "
                            f"tp / num_key_value_heads ranks)")
        sparse = _sparse_layers(config)
        if len(sparse) < config.num_hidden_layers and config.intermediate_size % tp:
            problems.append(f"config.intermediate_size = {config.intermediate_size} is not a multiple of the "
                            f"tensor-parallel size {tp}")
        if getattr(config, "tie_word_embeddings", False):
            problems.append("tie_word_embeddings=True (lm_head is vocab-parallel, the embedding replicated: one "
                            "tensor cannot be both)")
    if ep > 1:
        experts = getattr(config, "num_experts", None)
        if not experts or not _sparse_layers(config):
            problems.append(f"expert parallelism (size {ep}) needs a Qwen3-MoE model with sparse layers")
        elif experts % ep:
            problems.append(f"config.num_experts = {experts} is not a multiple of the expert-parallel size {ep}")
    if problems:
        raise ValueError(f"bitparity.parallel.shard_model: {'; '.join(problems)}")


def _sparse_layers(config):
    """The layers HF builds as Qwen3-MoE sparse blocks (spec 30.1's rule)."""
    if not getattr(config, "num_experts", None):
        return []
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return [i for i in range(config.num_hidden_layers) if i not in dense and (i + 1) % step == 0]


def _size(group):
    return 1 if group is None else dist.get_world_size(group)


def _agree(name, group, description):
    """The same ValueError on every rank of group unless every rank passes a model of the same description."""
    if group is None or dist.get_world_size(group) == 1:
        return
    table = distributed._exchange("parallel.shard_model", group, dist.get_world_size(group), description)
    for rank, entry in enumerate(table[1:], 1):
        if entry != table[0]:
            raise ValueError(f"bitparity.parallel.shard_model: the model must be the same on every rank of "
                             f"{name}; rank 0 has {table[0]}, rank {rank} has {entry}")


def shard_model(model, *, tp_group=None, ep_group=None):
    """Shard a model patched by bitparity.patch (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) in
    place over tp_group (attention heads, dense MLP columns, lm_head's vocabulary) and ep_group (Qwen3-MoE's
    experts); None: no sharding along that axis. Every rank of each group must pass the same model (checked:
    the same error on every rank). Returns the model; its logits are this rank's vocabulary shard
    (parallel.vocab_shard) and forward(labels=...) computes the loss with the vocab-parallel ops.

    The forward and backward give one process's bits on every rank; the replicated parameters (embedding,
    norms, router) get the single-process gradient on every rank. A sharded model cannot be unpatched.
    ValueError/TypeError, naming the reason, before anything changes."""
    if not hasattr(model, hf._ORIGINALS):
        raise ValueError("bitparity.parallel.shard_model takes a model patched by bitparity.patch(model)")
    if hasattr(model, _SHARDED):
        raise ValueError("bitparity.parallel.shard_model: this model is already sharded")
    for name, group in (("tp_group", tp_group), ("ep_group", ep_group)):
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"bitparity.parallel.shard_model: {name} must be a torch.distributed ProcessGroup or "
                            f"None; got {type(group).__name__}")
    config = model.config
    description = (type(model).__name__, {k: v for k, v in sorted(config.to_dict().items())
                                          if isinstance(v, (int, float, str, bool, list, type(None)))})
    _agree("tp_group", tp_group, description)
    _agree("ep_group", ep_group, description)
    tp, ep = _size(tp_group), _size(ep_group)
    check_shardable(config, tp, ep)
    if tp > 1:
        _shard_tensor_parallel(model, tp_group)
    if ep > 1:
        _shard_experts(model, ep_group)
    object.__setattr__(model, _SHARDED, (tp_group if tp > 1 else None, ep_group if ep > 1 else None))
    return model


def _shard_tensor_parallel(model, group):
    _, world = _rank_world(group)
    config, inner = model.config, model.model
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    # Key/value heads: split like the query heads where TP divides them, else (TP a multiple of them) head
    # r // R on rank r, R = TP / Hkv replicas each, rank r owning it where r % R = 0.
    replicas = 1 if kv_heads % world == 0 else world // kv_heads
    if replicas == 1:
        kv_heads_of = _ranges(kv_heads, world, shard_range)
    else:
        kv_heads_of = [torch.tensor([r // replicas]) for r in range(world)]
    owners = [r % replicas == 0 for r in range(world)]
    for layer in inner.layers:
        attn = layer.self_attn
        head_dim = attn.head_dim
        q_rows = _scaled(_ranges(heads, world, shard_range), head_dim)
        kv_rows = _scaled(kv_heads_of, head_dim)
        for proj, rows, held_by in ((attn.q_proj, q_rows, None), (attn.k_proj, kv_rows, owners),
                                    (attn.v_proj, kv_rows, owners)):
            _shard(proj.weight, group, 0, rows, held_by)
            if proj.bias is not None:
                _shard(proj.bias, group, 0, rows, held_by)
        _shard(attn.o_proj.weight, group, 1, q_rows)                  # o_proj's bias stays replicated
        layer.self_attn = TensorParallelAttention(attn, group, heads // world, max(1, kv_heads // world), replicas)
        if isinstance(layer.mlp, hf.MLP):
            mlp = layer.mlp
            columns = _ranges(mlp.gate_proj.weight.shape[0], world, shard_range)
            for proj in (mlp.gate_proj, mlp.up_proj):
                _shard(proj.weight, group, 0, columns)
                if proj.bias is not None:
                    _shard(proj.bias, group, 0, columns)
            _shard(mlp.down_proj.weight, group, 1, columns)            # down_proj's bias stays replicated
            layer.mlp = TensorParallelMLP(mlp, group)
    head = model.lm_head
    vocab = _vocab_indices(head.weight.shape[0], world)
    _shard(head.weight, group, 0, vocab)
    model.lm_head = VocabParallelHead(head, group)
    model.loss_function = _vocab_parallel_loss(group)


def _shard_experts(model, group):
    _, world = _rank_world(group)
    for layer in model.model.layers:
        if isinstance(layer.mlp, hf.SparseMoeBlock):
            experts = layer.mlp.experts
            ranges = _ranges(experts.gate_up_proj.shape[0], world, expert_range)
            _shard(experts.gate_up_proj, group, 0, ranges)
            _shard(experts.down_proj, group, 0, ranges)
            layer.mlp = ExpertParallelMoe(layer.mlp, group)


# -- A sharded RL policy (bitparity.models.HFPolicy) and the ops the RL loop calls on its logits ---------------

def shard_policy(policy, *, tp_group=None, ep_group=None):
    """shard_model on an HFPolicy's model, and the policy's KV-cache heads made this rank's key/value heads;
    the policy's `vocab_group` (read by token_logprobs and sample below) becomes the TP group. Returns it."""
    shard_model(policy.model, tp_group=tp_group, ep_group=ep_group)
    tp = _size(tp_group)
    if tp > 1:
        policy.config = dataclasses.replace(policy.config, heads=max(1, policy.config.heads // tp))
        policy.vocab_group = tp_group
    return policy


def token_logprobs(model, logits, tokens, *, temperature, backend):
    """ops.token_logprobs on a model's logits, or parallel.token_logprobs over its `vocab_group` where the model
    holds a vocabulary shard (shard_policy)."""
    group = getattr(model, "vocab_group", None)
    if group is None:
        return ops.token_logprobs(logits, tokens, temperature=temperature, backend=backend)
    return _vocab_token_logprobs(logits, tokens, group=group, temperature=temperature, backend=backend)


def sample(model, logits, seeds, positions, **options):
    """ops.sample on a model's logits, or parallel.sample over its `vocab_group` (as token_logprobs)."""
    group = getattr(model, "vocab_group", None)
    if group is None:
        return ops.sample(logits, seeds, positions, **options)
    return _vocab_sample(logits, seeds, positions, group=group, **options)


def process_groups(tp, ep):
    """(dp_group, tp_group, ep_group) of this rank in a world of dp x ep x tp ranks, rank = (d ep + e) tp + t
    (TP innermost, as Megatron places it): every rank creates every group, in one order (torch.distributed's
    rule). A group of one rank is still a group (rl-check gathers its reports over dp_group)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % (tp * ep):
        raise ValueError(f"the world size {world} is not a multiple of tp x ep = {tp * ep}")
    mine = {}
    coords = [(r // (ep * tp), r // tp % ep, r % tp) for r in range(world)]
    for axis in ("dp", "tp", "ep"):
        keys = sorted({_other(c, axis) for c in coords})
        for key in keys:
            members = [r for r, c in enumerate(coords) if _other(c, axis) == key]
            group = dist.new_group(members)
            if rank in members:
                mine[axis] = group
    return mine["dp"], mine["tp"], mine["ep"]


def _other(coord, axis):
    d, e, t = coord
    return {"dp": (e, t), "tp": (d, e), "ep": (d, t)}[axis]
