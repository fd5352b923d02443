"""TinyMoEPolicy (spec §25): weights exactly as §25.2 defines them, and a token's logits and value the same bits
in a full-sequence forward, alone or in a padded batch, and in one-token decode steps against a KV cache whose
unused slots hold NaN, on every canonical backend with the model ops."""

import numpy as np
import pytest
import torch

from bitparity import ops
from bitparity.compare.metrics import canonical_bits
from bitparity.models import ModelConfig, TinyMoEPolicy
from bitparity.models.tiny_moe import weight_shapes
from bitparity.reference.canonical import philox
from tests.conftest import implementing

MODEL_BACKENDS = ("numpy", "cpu", "cuda", "ascend")
# Small enough for the Triton interpreter and the Ascend emulation; still 2 layers, GQA-free heads, top-2 of 4.
SMALL = ModelConfig(vocab=256, hidden=32, layers=2, heads=2, head_dim=8, experts=4, top_k=2, expert_inter=16,
                    max_positions=64)


def _same(a, b):
    assert torch.equal(canonical_bits(a), canonical_bits(b)), f"{int((canonical_bits(a) != canonical_bits(b)).sum())} differ"


def test_weights_are_the_philox_words_of_spec_25_2():
    model = TinyMoEPolicy(SMALL, seed=7)
    for number, (name, shape, bound_log2) in enumerate(weight_shapes(SMALL)):
        w = model.weights[name].detach()
        assert tuple(w.shape) == shape
        for e in (0, 1, 3, 4, w.numel() - 1):                       # words 0..3 of a block, the next block, the last
            word = philox(np.array([e >> 2, 0, number, 1], dtype=np.uint32), np.array([7, 0], dtype=np.uint32))[e % 4]
            signed = int(word) - 2**32 if word >= 2**31 else int(word)
            assert w.reshape(-1)[e].item() == (signed >> 8) * 2.0 ** (bound_log2 - 23)
        assert float(w.abs().max()) <= 2.0 ** bound_log2 and float(w.min()) >= -(2.0 ** bound_log2)
    assert not torch.equal(model.weights["embed"], TinyMoEPolicy(SMALL, seed=8).weights["embed"])
    assert all(bool((model.weights[f"layers.1.{n}"] == 1).all()) for n in ("input_norm", "q_norm", "k_norm"))
    cos, sin = ops.rotary_tables(SMALL.max_positions, SMALL.head_dim, SMALL.rope_base)
    assert torch.equal(model.weights["rotary_cos"], cos) and torch.equal(model.weights["rotary_sin"], sin)


def _prompts(config, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), max(lengths) + 2, dtype=torch.int64)     # two extra padding columns
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.randint(0, config.vocab, (n,), generator=g)
    return tokens, torch.tensor(lengths)


@pytest.mark.parametrize("backend", implementing("attention", MODEL_BACKENDS))
def test_decode_steps_and_a_lone_prefill_give_the_batched_prefills_bits(backend):
    model = TinyMoEPolicy(SMALL, seed=3, backend=backend)
    tokens, lengths = _prompts(SMALL, [9, 4, 6])
    logits, values, _, _ = model.prefill(tokens, lengths)
    alone, alone_values, _, _ = model.prefill(tokens[1:2, :4], lengths[1:2])
    _same(alone[0], logits[1, :4])
    _same(alone_values[0], values[1, :4])
    # Decode every request from a 2-token prefill, one position at a time, all three in one batch (rows in
    # reverse order) against caches of 12 slots; slots not yet written hold NaN.
    _, _, keys, vals = model.prefill(tokens[:, :2], torch.tensor([2, 2, 2]))
    order = [2, 1, 0]
    shape = (3, SMALL.heads, 12, SMALL.head_dim)
    key_cache = [torch.full(shape, float("nan")) for _ in range(SMALL.layers)]
    value_cache = [torch.full(shape, float("nan")) for _ in range(SMALL.layers)]
    for layer in range(SMALL.layers):
        key_cache[layer][:, :, :2] = keys[layer][order]
        value_cache[layer][:, :, :2] = vals[layer][order]
    for position in range(2, 9):
        live = [i for i, r in enumerate(order) if position < lengths[r]]
        rows = [order[i] for i in live]
        step_logits, step_values, new_keys, new_vals = model.decode(
            tokens[rows, position], torch.full((len(rows),), position),
            [c[live] for c in key_cache], [c[live] for c in value_cache])
        _same(step_logits, logits[rows, position])
        _same(step_values, values[rows, position])
        for layer in range(SMALL.layers):
            key_cache[layer][live, :, position] = new_keys[layer]
            value_cache[layer][live, :, position] = new_vals[layer]


def test_native_computes_the_same_model_up_to_rounding():
    # The contrast rl-check draws is between two computations of one model, not two models.
    tokens, lengths = _prompts(ModelConfig(), [12, 5])
    canonical, _, _, _ = TinyMoEPolicy(seed=0).prefill(tokens, lengths)
    native, _, _, _ = TinyMoEPolicy(seed=0, backend="native").prefill(tokens, lengths)
    assert torch.allclose(canonical, native, rtol=0, atol=1e-4)


def test_bad_config_and_tokens_are_rejected():
    with pytest.raises(ValueError, match="head_dim must be even"):
        ModelConfig(head_dim=7)
    with pytest.raises(ValueError, match="top_k must be at most experts"):
        ModelConfig(top_k=9)
    model = TinyMoEPolicy(SMALL)
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 256\)"):
        model.prefill(torch.tensor([[256]]), torch.tensor([1]))
    with pytest.raises(TypeError, match="tokens must be an int64 torch.Tensor; got torch.float32"):
        model.prefill(torch.tensor([[1.0]]), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"tokens must have 2 dimension\(s\); got shape \(3,\)"):
        model.prefill(torch.tensor([1, 2, 3]), torch.tensor([3]))
    with pytest.raises(ValueError, match="at most max_positions = 64"):
        model.prefill(torch.zeros(1, 65, dtype=torch.int64), torch.tensor([65]))
