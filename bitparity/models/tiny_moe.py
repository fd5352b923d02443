"""TinyMoEPolicy: a Qwen3-MoE-style decoder with a value head, built only from bitparity ops (spec §25).

Every arithmetic step is a §24 op on the chosen backend, or a single IEEE float32 add (the residuals);
the rest is exact data movement (gather, index, reshape, cat). Because every §24 op gives each row its own
bits whatever the batch, padding or tiling, a token's logits and value are the same bits in a full-sequence
forward (`prefill`) and in a one-token step against a KV cache (`decode`), on every canonical backend.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import ops
from ..backends import device_type
from ..reference.canonical import philox

WEIGHT_STREAM = 1          # Philox's fourth counter word for weights; sampling uses 0 (spec §19)


@dataclass(frozen=True)
class ModelConfig:
    """The architecture (spec §25.1). The defaults are the model `bitparity rl-check` runs."""
    vocab: int = 4096
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    head_dim: int = 16
    experts: int = 8
    top_k: int = 2
    expert_inter: int = 32
    rope_base: float = 10000.0
    max_positions: int = 256
    rms_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab", "hidden", "layers", "heads", "head_dim", "experts", "top_k", "expert_inter",
                     "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary halves); got {self.head_dim}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be at most experts = {self.experts}; got {self.top_k}")


def weight_shapes(config):
    """[(name, shape, log2 of the uniform bound a)] of the random tensors, in tensor-number order (spec §25.2)."""
    c = config
    qkv = c.heads * c.head_dim
    shapes = [("embed", (c.vocab, c.hidden), 0)]
    for layer in range(c.layers):
        shapes += [(f"layers.{layer}.{name}", shape, -2) for name, shape in (
            ("q_proj", (qkv, c.hidden)), ("k_proj", (qkv, c.hidden)), ("v_proj", (qkv, c.hidden)),
            ("o_proj", (c.hidden, qkv)), ("router", (c.experts, c.hidden)),
            ("gate_proj", (c.experts, c.expert_inter, c.hidden)), ("up_proj", (c.experts, c.expert_inter, c.hidden)),
            ("down_proj", (c.experts, c.hidden, c.expert_inter)))]
    return shapes + [("lm_head", (c.vocab, c.hidden), -2), ("value_head", (1, c.hidden), -3)]


def uniform_weights(seed, tensor_number, shape, bound_log2):
    """float32 uniform on [-a, a), a = 2**bound_log2, exact (spec §25.2): element e (row-major) takes word
    e mod 4 of philox(e >> 2 as (lo, hi), tensor_number, WEIGHT_STREAM; seed as (lo, hi)); the word read
    as an int32, shifted right arithmetically by 8 (a 24-bit integer in [-2^23, 2^23)), times 2^(bound_log2 - 23)."""
    n = math.prod(shape)
    block = np.arange((n + 3) // 4, dtype=np.uint64)
    counters = np.stack([block & np.uint64(0xFFFFFFFF), block >> np.uint64(32),
                         np.full_like(block, tensor_number), np.full_like(block, WEIGHT_STREAM)], axis=-1)
    seed_bits = np.array(seed, dtype=np.int64).view(np.uint64)
    key = np.array([seed_bits & np.uint64(0xFFFFFFFF), seed_bits >> np.uint64(32)], dtype=np.uint64)
    words = philox(counters, key).reshape(-1)[:n]
    ints = words.view(np.int32) >> 8
    values = ints.astype(np.float32) * np.float32(2.0 ** (bound_log2 - 23))
    return torch.from_numpy(values.reshape(shape))


class TinyMoEPolicy(torch.nn.Module):
    """A decoder whose every float operation is a bitparity op on `backend` (any registry name, "native"
    included): embedding, then per layer attention and a top-k MoE with residual adds, a final RMSNorm, an
    lm_head (logits) and a value head. Weights come from `seed` by spec §25.2; nothing is downloaded.

    An nn.Module: its weights are nn.Parameters (the rotary tables are buffers), registered in spec §25.2's
    tensor order, then the norm weights layer by layer (input, q, k, post-attention) and the final norm: the
    order of `parameters()` and of the weights digest. Differentiable through spec 29's backward; the rollout
    runs it under torch.no_grad()."""

    def __init__(self, config=None, seed=0, backend="numpy"):
        super().__init__()
        self.config = config or ModelConfig()
        if isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63:
            raise ValueError(f"seed must be an int64; got {seed!r}")
        self.seed, self.backend = seed, backend
        self.device = torch.device(device_type(backend))
        c = self.config
        tensors = {name: uniform_weights(seed, number, shape, bound)
                   for number, (name, shape, bound) in enumerate(weight_shapes(c))}
        for layer in range(c.layers):
            for name, size in (("input_norm", c.hidden), ("q_norm", c.head_dim), ("k_norm", c.head_dim),
                               ("post_attention_norm", c.hidden)):
                tensors[f"layers.{layer}.{name}"] = torch.ones(size)
        tensors["final_norm"] = torch.ones(c.hidden)
        self.parameter_names = tuple(tensors)
        for name, t in tensors.items():
            self.register_parameter(_attribute(name), torch.nn.Parameter(t.to(self.device)))
        cos, sin = ops.rotary_tables(c.max_positions, c.head_dim, c.rope_base)
        self.register_buffer("rotary_cos", cos.to(self.device))
        self.register_buffer("rotary_sin", sin.to(self.device))

    @property
    def weights(self):
        """{name: tensor}: every parameter by its spec §25.2 name, and the rotary tables."""
        named = {name: getattr(self, _attribute(name)) for name in self.parameter_names}
        return {**named, "rotary_cos": self.rotary_cos, "rotary_sin": self.rotary_sin}

    def _w(self, layer, name):
        return getattr(self, _attribute(f"layers.{layer}.{name}"))

    def _qkv(self, h, layer, positions):
        """h [B, T, D], positions [B, T] -> q, k, v [B, H, T, hd]: norm, projections, per-head q/k norms, rotary."""
        c, b = self.config, self.backend
        x = ops.rms_norm(h, self._w(layer, "input_norm"), c.rms_eps, backend=b)
        split = (*h.shape[:2], 3, c.heads, c.head_dim)                                  # [B, T, 3, H, hd]
        # One linear of the concatenated projections (spec 29.9): each output is its own dot (the same forward
        # bits as three), and x is read once, so its gradient is one canonical sum over all 3*H*hd outputs.
        qkv = torch.cat([self._w(layer, name) for name in ("q_proj", "k_proj", "v_proj")])
        q, k, v = ops.linear(x, qkv, backend=b).reshape(split).unbind(2)
        q = ops.rms_norm(q, self._w(layer, "q_norm"), c.rms_eps, backend=b)
        k = ops.rms_norm(k, self._w(layer, "k_norm"), c.rms_eps, backend=b)
        cos = self.rotary_cos[positions][:, :, None, :]                                 # [B, T, 1, hd/2]
        sin = self.rotary_sin[positions][:, :, None, :]
        q, k = ops.rotary(q, cos, sin, backend=b), ops.rotary(k, cos, sin, backend=b)
        return (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def _finish_layer(self, h, layer, attended):
        """h [B, T, D] + o_proj(attended [B, H, T, hd]), then + moe(rms_norm(h)): two residual adds."""
        c, b = self.config, self.backend
        merged = attended.transpose(1, 2).reshape(*h.shape[:2], c.heads * c.head_dim)
        h = h + ops.linear(merged, self._w(layer, "o_proj"), backend=b)
        x = ops.rms_norm(h, self._w(layer, "post_attention_norm"), c.rms_eps, backend=b).reshape(-1, c.hidden)
        mixed = ops.moe(x, self._w(layer, "router"), self._w(layer, "gate_proj"), self._w(layer, "up_proj"),
                        self._w(layer, "down_proj"), c.top_k, backend=b)
        return h + mixed.reshape(h.shape)

    def _heads(self, h):
        """h [B, T, D] -> logits [B, T, V], values [B, T]."""
        x = ops.rms_norm(h, self.final_norm, self.config.rms_eps, backend=self.backend)
        logits = ops.linear(x, self.lm_head, backend=self.backend)
        return logits, ops.linear(x, self.value_head, backend=self.backend)[..., 0]

    def _check_tokens(self, name, tokens, dims):
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 torch.Tensor; got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimension(s); got shape {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab):
            raise ValueError(f"{name} must lie in [0, {self.config.vocab}) (the vocabulary)")

    def prefill(self, tokens, lengths):
        """Full-sequence forward over right-padded tokens [B, T] with lengths [B] (each in [1, T]), causal.

        Returns (logits [B, T, V], values [B, T], keys, values_cache): keys and values_cache are per-layer
        [B, H, T, hd] lists, valid at positions < lengths. Positions at or past a row's length hold whatever
        the padding tokens give; they never reach a valid position (spec 24.4)."""
        self._check_tokens("tokens", tokens, 2)
        batch, length = tokens.shape
        if length > self.config.max_positions:
            raise ValueError(f"tokens must have at most max_positions = {self.config.max_positions} columns; "
                             f"got {length}")
        positions = torch.arange(length, device=self.device).expand(batch, length)
        h = ops.embedding(tokens, self.embed, backend=self.backend)                     # [B, T, D]
        keys, vals = [], []
        for layer in range(self.config.layers):
            q, k, v = self._qkv(h, layer, positions)
            keys.append(k)
            vals.append(v)
            h = self._finish_layer(h, layer, ops.attention(q, k, v, causal=True, kv_lengths=lengths,
                                                           backend=self.backend))
        logits, values = self._heads(h)
        return logits, values, keys, vals

    def decode(self, tokens, positions, key_cache, value_cache):
        """One token per request: tokens [B] at positions [B], against per-layer caches [B, H, C, hd] whose
        slots < positions hold that request's keys and values (slots at and past it may hold anything,
        NaN included: they are never read as numbers). The new key and value are written at slot
        `positions` of the caches given (C > positions is required).

        Returns (logits [B, V], values [B], new keys, new values): the new ones per layer, [B, H, hd]."""
        self._check_tokens("tokens", tokens, 1)
        capacity = key_cache[0].shape[2]
        if int(positions.max()) >= capacity:
            raise ValueError(f"positions must be below the cache capacity {capacity}; got {int(positions.max())}")
        rows = torch.arange(tokens.shape[0], device=self.device)
        h = ops.embedding(tokens, self.embed, backend=self.backend)[:, None, :]        # [B, 1, D]
        new_keys, new_vals = [], []
        for layer in range(self.config.layers):
            q, k, v = self._qkv(h, layer, positions[:, None])                           # [B, H, 1, hd]
            key_cache[layer][rows, :, positions] = k[:, :, 0]
            value_cache[layer][rows, :, positions] = v[:, :, 0]
            new_keys.append(k[:, :, 0])
            new_vals.append(v[:, :, 0])
            attended = ops.attention(q, key_cache[layer], value_cache[layer], causal=True, kv_lengths=positions + 1,
                                     backend=self.backend)
            h = self._finish_layer(h, layer, attended)
        logits, values = self._heads(h)
        return logits[:, 0], values[:, 0], new_keys, new_vals


def _attribute(name):
    """The module attribute of a spec §25.2 name ("layers.0.q_proj" -> "layers_0_q_proj")."""
    return name.replace(".", "_")
