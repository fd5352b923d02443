"""Attention over vLLM's paged KV cache with bitparity's attention (spec 30.8).

vLLM's `Attention` layer (`vllm.model_executor.layers.attention.Attention`, given `attn_backend=` this module's
`PagedBackend`) owns the per-layer cache tensor and calls, per forward, `do_kv_cache_update` (write this step's
keys and values at `slot_mapping`) and then `forward` (attend). Both are ours, so the layout is ours:

    cache [num_blocks, Hkv, block_size, 2 * head_dim]   (vLLM allocates it, one per layer, in the model dtype)
    the token at slot s = block * block_size + offset:
        cache[block, :, offset, :D] = its key,  cache[block, :, offset, D:] = its value

Each request's keys are read back by its block table, positions 0 ... seq_len - 1 in order, so a request sees
exactly the keys of its own tokens whatever shares its step, whether they were written in this step (a prefill
chunk), in earlier steps (decode), by another request (a prefix-cache hit: the shared blocks hold the bits this
request would have written, every op being batch-invariant) or again after a preemption (recomputed from 0).
The attention itself is `bitparity.hf.attention`, the patched HF model's (GQA by its head repetition, §24.4
per sequence): a request with several queries (a prompt or a chunk of one) is one causal call, its queries the
last Tq of its seq_len keys (§24.4's bottom-right alignment); the one-query requests (decode steps) are one call
together, each row's keys padded to the longest and its valid ones marked by a [R, 1, 1, Tk] mask, which
hf.attention's mask plan turns into kv_lengths (spec 30.3).
"""

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata)
from vllm.v1.kv_cache_interface import KVCacheLayout

from .. import hf


@dataclass
class PagedMetadata:
    """One step's attention plan, shared by every layer: `prefills` [(first query row, query count, seq_len,
    slots)] for requests with several queries; for the one-query requests `decode_rows` (their query rows),
    `decode_slots` [R, Tk] (each row's key slots, padded with its slot 0) and `decode_mask` bool [R, 1, 1, Tk]
    (True at its seq_len keys); `seq_lens` [num_reqs] (the keys each request has after this step: the position
    of the token it samples)."""
    seq_lens: torch.Tensor
    prefills: list
    decode_rows: torch.Tensor
    decode_slots: torch.Tensor
    decode_mask: torch.Tensor


def _slots(block_table, seq_len, block_size):
    """The cache slots of a request's positions 0 ... seq_len - 1, in order (int64 [seq_len])."""
    positions = torch.arange(seq_len, dtype=torch.int64)
    return block_table[positions // block_size].to(torch.int64) * block_size + positions % block_size


class PagedMetadataBuilder(AttentionMetadataBuilder[PagedMetadata]):
    """Builds PagedMetadata from vLLM's CommonAttentionMetadata. No batch reordering: rows stay in the input
    batch's request order, which is the sampler's row order."""

    reorder_batch_threshold = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len, common_attn_metadata: CommonAttentionMetadata, fast_build=False):
        m = common_attn_metadata
        if not (m.causal is True):
            raise ValueError("bitparity's vLLM attention is causal decoder attention only")
        starts = m.query_start_loc_cpu.tolist()
        seq_lens = m.seq_lens.cpu()[:m.num_reqs]
        table = m.block_table_tensor.cpu()
        prefills, decodes = [], []
        for r in range(m.num_reqs):
            count, seq_len = starts[r + 1] - starts[r], int(seq_lens[r])
            if count == 0:
                continue
            slots = _slots(table[r], seq_len, self.block_size)
            if count == 1:
                decodes.append((starts[r], slots))
            else:
                prefills.append((starts[r], count, seq_len, slots))
        width = max((len(s) for _, s in decodes), default=0)
        decode_slots = torch.stack([torch.nn.functional.pad(s, (0, width - len(s)), value=int(s[0]))
                                    for _, s in decodes]) if decodes else torch.zeros(0, 0, dtype=torch.int64)
        lengths = torch.tensor([len(s) for _, s in decodes], dtype=torch.int64)
        mask = (torch.arange(width)[None, :] < lengths[:, None])[:, None, None, :]
        rows = torch.tensor([row for row, _ in decodes], dtype=torch.int64)
        return PagedMetadata(seq_lens=seq_lens.to(torch.int64), prefills=prefills, decode_rows=rows,
                             decode_slots=decode_slots, decode_mask=mask)


class PagedImpl(AttentionImpl):
    """Writes keys and values at their slots and attends with bitparity.hf.attention (module docstring)."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, *, hf_attention=None):
        unsupported = [name for name, value in (("alibi_slopes", alibi_slopes), ("sliding_window", sliding_window),
                                                ("logits_soft_cap", logits_soft_cap),
                                                ("kv_sharing_target_layer_name", kv_sharing_target_layer_name))
                       if value is not None]
        if kv_cache_dtype != "auto":
            unsupported.append(f"kv_cache_dtype={kv_cache_dtype!r} (the cache holds the model dtype's exact keys)")
        if attn_type != AttentionType.DECODER:
            unsupported.append(f"attn_type={attn_type}")
        if unsupported:
            raise ValueError(f"bitparity's vLLM attention does not support {', '.join(unsupported)}")
        if scale != head_size ** -0.5:
            raise ValueError(f"bitparity attention scales by 1/sqrt(head_dim) = {head_size ** -0.5}; got {scale}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.hf_attention = hf_attention           # the patched HF attention module: its backend for the ops

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        """key, value [T, Hkv, D] -> cache[slot // block_size, :, slot % block_size] = key | value, for the
        tokens with a slot (negative slots are padding: skipped)."""
        block_size = kv_cache.shape[2]
        slots = slot_mapping[:key.shape[0]].to(torch.int64)
        keep = slots >= 0
        blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
        kv_cache[blocks, :, offsets] = torch.cat([key[keep], value[keep]], dim=-1).to(kv_cache.dtype)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        """query [T, H, D] -> output [T, H, D] (query's dtype): every scheduled token's attention over its
        request's keys in the cache. attn_metadata is None in vLLM's profiling run: zeros then."""
        if output_scale is not None or output_block_scale is not None:
            raise ValueError("bitparity's vLLM attention does not fuse output quantization")
        if attn_metadata is None:
            return output.zero_()
        for first, count, seq_len, slots in attn_metadata.prefills:
            keys, values = self._gather(kv_cache, slots[None])
            q = query[first:first + count].transpose(0, 1)[None]                     # [1, H, Tq, D]
            output[first:first + count] = self._attend(q, keys, values, None)[0]
        if len(attn_metadata.decode_rows):
            rows = attn_metadata.decode_rows
            keys, values = self._gather(kv_cache, attn_metadata.decode_slots)
            q = query[rows][:, :, None, :]                                             # [R, H, 1, D]
            output[rows] = self._attend(q, keys, values, attn_metadata.decode_mask)[:, 0]
        return output

    def _gather(self, kv_cache, slots):
        """slots int64 [R, Tk] -> keys, values [R, Hkv, Tk, D] from the cache."""
        block_size, d = kv_cache.shape[2], self.head_size
        rows = kv_cache[slots // block_size, :, slots % block_size]                    # [R, Tk, Hkv, 2D]
        rows = rows.permute(0, 2, 1, 3)
        return rows[..., :d], rows[..., d:]

    def _attend(self, q, keys, values, mask):
        """bitparity.hf.attention (the patched HF model's, spec 30.3): [R, H, Tq, D] -> [R, Tq, H, D]."""
        out, _ = hf.attention(self.hf_attention, q, keys, values, mask)
        return out


class PagedBackend(AttentionBackend):
    """vLLM's attention-backend interface for PagedImpl; registered as AttentionBackendEnum.CUSTOM by the
    plugin (vLLM's layer records the backend by that name)."""

    forward_includes_kv_cache_update = False
    supported_dtypes = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name():
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return PagedImpl

    @staticmethod
    def get_builder_cls():
        return PagedMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type):
        return attn_type == AttentionType.DECODER


class PagedAttention(torch.nn.Module):
    """What the patched HF attention module calls as its `paged` (bitparity.hf.Attention): q [1, H, T, D],
    k and v [1, Hkv, T, D] over the step's flattened tokens -> [1, T, H, D]. `attn` is vLLM's Attention layer
    (its cache bound by vLLM under `prefix`)."""

    def __init__(self, hf_attention, num_heads, num_kv_heads, vllm_config, prefix):
        super().__init__()
        from vllm.model_executor.layers.attention import Attention
        head_dim = hf_attention.head_dim
        self.attn = Attention(num_heads, head_dim, head_dim ** -0.5, num_kv_heads=num_kv_heads,
                              cache_config=vllm_config.cache_config, prefix=prefix, attn_backend=PagedBackend,
                              hf_attention=hf_attention)

    def forward(self, q, k, v):
        tokens = q.shape[2]
        out = self.attn(*(t[0].transpose(0, 1).contiguous() for t in (q, k, v)))      # [T, H * D]
        return out.reshape(1, tokens, q.shape[1], q.shape[3])
