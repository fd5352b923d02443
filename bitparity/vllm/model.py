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
"""

import copy
import re

import torch

from .. import hf
from . import sampler
from .attention import PagedAttention

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _refuse(vllm_config):
    """ValueError naming every engine setting under which this model would not compute patch's bits."""
    problems = []
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        problems.append(f"tensor_parallel_size={parallel.tensor_parallel_size}, pipeline_parallel_size="
                        f"{parallel.pipeline_parallel_size} (the model runs whole in one worker)")
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
        self.model, self.lm_head = model.model, model.lm_head
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.paged = PagedAttention(layer.self_attn, heads, kv_heads, vllm_config,
                                                   prefix=f"{prefix}model.layers.{i}.self_attn.paged.attn")

    def embed_input_ids(self, input_ids):
        return self.model.embed_tokens(input_ids.to(torch.int64))

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        """input_ids [T] (or inputs_embeds [T, D]) and positions [T] of every scheduled token of the step ->
        hidden states [T, D] after the final norm."""
        if intermediate_tensors is not None:
            raise ValueError("bitparity's vLLM model runs whole in one worker (no pipeline parallelism)")
        sampler.record_step()
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        h = h[None]
        position_ids = positions.to(torch.int64)[None]
        position_embeddings = self.model.rotary_emb(h, position_ids)
        for layer in self.model.layers[:self.model.config.num_hidden_layers]:
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=position_embeddings)
        return self.model.norm(h)[0]

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)

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
                _copy(params[name], tensor, name)
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
