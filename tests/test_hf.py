"""bitparity.patch on unmodified Hugging Face transformers causal LMs (issue 15; bitparity/hf.py).

Three tiny models, each with grouped- or multi-query attention and random weights large enough that the logits
spread over several nats: Llama with one key/value head (and biases, a rope_theta of 5e5, pad_token_id = 0),
Qwen3 dense with 4 query heads over 2 key/value heads and a head_dim (16) that is not hidden / heads, and
Qwen3-MoE with 2 key/value heads, a dense first layer (mlp_only_layers=[0]) and norm_topk_prob=False.

- Rollouts: greedy and sampled `generate()` over a left-padded batch with `Sampler`; the log-probs it records
  are the bits `sequence_logprobs` computes for each sequence alone and unpadded, in a right-padded batch, in
  the left-padded batch in reverse order and in micro-batches of 1, on numpy, cpu and ascend; the three
  backends draw the same tokens with the same bits; a prompt generated alone gets the batch's tokens and bits;
  a chunked prefill against the KV cache gives the one-shot bits. Negative controls: HF's own float32 model and
  bitparity's native backend (torch's ops) give other bits where these agree.
- Accuracy against HF's unpatched model in float64 (same weights): logits, log-probs, the loss (also with
  num_items_in_batch), gradients; the bounds state the measured errors.
- Backward: every parameter gets a gradient, the same bits on every backend; tied embeddings too.
- bfloat16: bf16 logits, the same bits on every backend, and the same when the patched model is cast.
- Errors: what cannot run on canonical ops raises, naming the option, before anything changes; unpatch
  restores HF's modules and bits; patch keeps HF's parameter names and the model's train/eval mode.
- One case on the cuda backend (the Triton interpreter without a GPU).

Bit comparisons are of int32 views (int16 for bf16) after NaN canonicalisation (canonical_bits). Everything
is tiny (hidden 32, 2 layers, vocab 128) and made once per module (the `zoo` fixture).
"""
import copy

import pytest
import torch
from transformers import (DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

import bitparity
from bitparity.backends import device_type
from bitparity.compare.metrics import canonical_bits
from bitparity.hf import Sampler, sequence_logprobs
from bitparity.models.hf_policy import cache_keyword
from tests.conftest import _checked

BACKENDS = ("numpy", "cpu", "ascend")
PAD = 0
VOCAB = 128
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              max_position_embeddings=64, attention_dropout=0.0)
MODELS = {
    "llama": (LlamaForCausalLM, LlamaConfig, dict(
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, pad_token_id=PAD)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, mlp_only_layers=[0], norm_topk_prob=False)),
}
KINDS = tuple(MODELS)

# Prompts of different lengths (one of a single token), left-padded for generate; NEW tokens each.
_g = torch.Generator().manual_seed(1)
PROMPTS = tuple(torch.randint(1, VOCAB, (n,), generator=_g) for n in (5, 1, 7))
SEEDS = torch.tensor([11, 22, 33])
NEW = 4
MODES = {"greedy": (dict(temperature=0.0), 1.0),                          # Sampler options, trainer temperature
         "sampled": (dict(temperature=0.8, logprobs="scaled"), 0.8)}


def _bits(t):
    if t.dtype == torch.bfloat16:
        return t.detach().contiguous().view(torch.int16)              # no NaN arises in these bf16 logits
    return canonical_bits(t)


def _same(a, b):
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def build(kind, **overrides):
    """A float32 HF model, never patched, with weights drawn from a fixed generator: norms' weights near 1,
    embeddings N(0, 1), other matrices N(0, 1/fan_in), so activations and logits are O(1) (HF's init, std 0.02,
    gives near-uniform logits, where every comparison is easy)."""
    cls, config_cls, options = MODELS[kind]
    torch.manual_seed(0)
    model = cls(config_cls(**{**COMMON, **options, **overrides})).eval()
    g = torch.Generator().manual_seed(sum(map(ord, kind)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.25 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:                                                          # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
    model.generation_config.eos_token_id = None                # generate draws exactly NEW tokens for every row
    model.generation_config.pad_token_id = PAD
    return model


def float64(model):
    """HF's unpatched model in binary64 with the same weights (grouped_mm has no float64 kernel: eager experts)."""
    model = copy.deepcopy(model).double()
    model.config._experts_implementation = "eager"
    return model


def left_padded(rows):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for b, r in enumerate(rows):
        ids[b, width - len(r):], mask[b, width - len(r):] = r, 1
    return ids, mask


def right_padded(rows):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = r, 1
    return ids, mask


def rollout(model, mode, rows=slice(None)):
    """generate() with a Sampler -> (sequences [B, T0 + new], their mask, Sampler tokens and log-probs)."""
    ids, mask = left_padded(PROMPTS[rows])
    sampler = Sampler(SEEDS[rows], mask, **MODES[mode][0])           # on use_backend's backend, as the model
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                             logits_processor=[sampler], pad_token_id=PAD)
    full_mask = torch.cat([mask, torch.ones(len(mask), NEW, dtype=torch.int64)], dim=1)
    return out, full_mask, sampler.tokens, sampler.logprobs


ALONE, RIGHT, REVERSED, MICRO = ("alone, unpadded", "right-padded batch", "left-padded batch, reversed",
                                 "micro-batches of 1")


def trainer_logprobs(model, sequences, mask, tokens, temperature, layouts=(ALONE, RIGHT, REVERSED, MICRO)):
    """The generated tokens' log-probs as the trainer recomputes them, {layout: [B, new]}; a layout whose
    forward raises maps to the exception (so that one failing layout does not hide the others)."""
    n = tokens.shape[1]
    t0 = sequences.shape[1] - n
    prompts = PROMPTS
    rows = [torch.cat([p, tokens[b]]) for b, p in enumerate(prompts)]

    def alone():
        return torch.stack([sequence_logprobs(model, r[None], temperature=temperature)[0, len(p) - 1:]
                            for r, p in zip(rows, prompts)])

    def right():
        ids, right_mask = right_padded(rows)
        out = sequence_logprobs(model, ids, right_mask, temperature=temperature)
        return torch.stack([out[b, len(p) - 1:len(p) - 1 + n] for b, p in enumerate(prompts)])

    def reverse():
        return sequence_logprobs(model, sequences.flip(0), mask.flip(0), temperature=temperature).flip(0)[:, t0 - 1:]

    def micro():
        return torch.cat([sequence_logprobs(model, sequences[b:b + 1], mask[b:b + 1], temperature=temperature)
                          for b in range(len(prompts))])[:, t0 - 1:]

    result = {}
    for layout, compute in ((ALONE, alone), (RIGHT, right), (REVERSED, reverse), (MICRO, micro)):
        if layout not in layouts:
            continue
        try:
            with torch.no_grad():
                result[layout] = compute()
        except Exception as error:                                          # noqa: BLE001 - reported by the tests
            result[layout] = error
    return result


def _differing(trainer, logprobs):
    """{layout: entries whose bits differ from logprobs}, and {layout: the error its forward raised}."""
    differ = {layout: int((_bits(lp) != _bits(logprobs)).sum()) for layout, lp in trainer.items()
              if not isinstance(lp, Exception)}
    errors = {layout: f"{type(lp).__name__}: {lp}" for layout, lp in trainer.items() if isinstance(lp, Exception)}
    return differ, errors


class Zoo:
    """What the tests share, made once per module: the models, their patched copies, rollouts, gradients."""

    def __init__(self):
        self._cache = {}

    def _get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def model(self, kind, **overrides):
        return self._get(("model", kind, *overrides.items()), lambda: build(kind, **overrides))

    def float64(self, kind, **overrides):
        return self._get(("float64", kind, *overrides.items()), lambda: float64(self.model(kind, **overrides)))

    def patched(self, kind, backend=None, **overrides):
        """backend None: patched without one, so every op runs on use_backend's (the rollouts)."""
        return self._get(("patched", kind, backend, *overrides.items()),
                         lambda: bitparity.patch(copy.deepcopy(self.model(kind, **overrides)), backend=backend))

    def rollout(self, kind, backend, mode):
        """(sequences, mask, tokens, log-probs, trainer log-probs by layout), everything on backend."""
        def make():
            model = self.patched(kind)
            with bitparity.use_backend(backend):
                sequences, mask, tokens, logprobs = rollout(model, mode)
                trainer = trainer_logprobs(model, sequences, mask, tokens, MODES[mode][1])
            return sequences, mask, tokens, logprobs, trainer
        return self._get(("rollout", kind, backend, mode), make)

    def gradients(self, kind, backend, **overrides):
        return self._get(("gradients", kind, backend, *overrides.items()),
                         lambda: loss_and_gradients(self.patched(kind, backend, **overrides)))


@pytest.fixture(scope="module")
def zoo():
    return Zoo()


# -- 1. Rollouts: the sampler's log-probs are the trainer's bits, on every backend ----------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_rollout_logprobs_are_the_trainers_bits_in_every_layout(zoo, kind, backend, mode):
    sequences, _, tokens, logprobs, trainer = zoo.rollout(kind, _checked(backend), mode)
    t0 = sequences.shape[1] - NEW
    assert torch.equal(sequences[:, t0:], tokens)
    assert tokens.shape == (len(PROMPTS), NEW) and bool(((tokens >= 0) & (tokens < VOCAB)).all())
    assert bool(torch.isfinite(logprobs).all()) and bool((logprobs < 0).all())
    differ, errors = _differing(trainer, logprobs)
    assert not errors, f"the trainer's forward raised: {errors}"
    assert set(differ) == {ALONE, RIGHT, REVERSED, MICRO}
    assert not any(differ.values()), f"entries whose bits differ from the Sampler's, by layout: {differ}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_numpy_cpu_and_ascend_draw_the_same_tokens_with_the_same_bits(zoo, kind, mode):
    reference = zoo.rollout(kind, "numpy", mode)
    for backend in BACKENDS[1:]:
        got = zoo.rollout(kind, _checked(backend), mode)
        assert torch.equal(got[0], reference[0]), f"{backend} generated other sequences"
        assert _same(got[3], reference[3]), f"{backend}'s sampler log-probs differ from numpy's"
        for layout, want in reference[4].items():
            if not isinstance(want, Exception):           # an error is the failure of the test above
                assert _same(got[4][layout], want), f"{backend}'s {layout} log-probs differ"


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_generated_alone_gets_the_batchs_tokens_and_bits(zoo, kind):
    """Each prompt generated alone, unpadded (the plain causal path, prefill and decode), as in the batch."""
    _, _, tokens, logprobs, _ = zoo.rollout(kind, "cpu", "sampled")
    for b in range(len(PROMPTS)):
        with bitparity.use_backend("cpu"):
            _, _, alone_tokens, alone_logprobs = rollout(zoo.patched(kind), "sampled", rows=slice(b, b + 1))
        assert torch.equal(alone_tokens[0], tokens[b]) and _same(alone_logprobs[0], logprobs[b]), b


@pytest.mark.parametrize("kind", KINDS)
def test_a_static_cache_gives_the_dynamic_caches_tokens_and_bits(zoo, kind):
    """generate(cache_implementation="static"): HF builds the mask ahead of the forward over the cache's whole
    capacity (slots not yet written masked), and passes it through; the same tokens and bits as the dynamic
    cache."""
    _, _, tokens, logprobs, _ = zoo.rollout(kind, "cpu", "sampled")
    ids, mask = left_padded(PROMPTS)
    sampler = Sampler(SEEDS, mask, **MODES["sampled"][0])
    with bitparity.use_backend("cpu"), torch.no_grad():
        zoo.patched(kind).generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                   logits_processor=[sampler], pad_token_id=PAD, cache_implementation="static")
    assert torch.equal(sampler.tokens, tokens) and _same(sampler.logprobs, logprobs)


def _chunked_and_one_shot_logits(model, sequences, mask, cut=8):
    """Logits of the left-padded batch in one forward, and in two against HF's DynamicCache: the second chunk's
    queries are several per row with a different number of cached keys per row (6, 2 and 8 here)."""
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        one_shot = model(input_ids=sequences, attention_mask=mask, position_ids=positions).logits
        cache = {cache_keyword(model): DynamicCache(config=model.config)}
        first = model(input_ids=sequences[:, :cut], attention_mask=mask[:, :cut], position_ids=positions[:, :cut],
                      use_cache=True, **cache).logits
        second = model(input_ids=sequences[:, cut:], attention_mask=mask, position_ids=positions[:, cut:],
                       use_cache=True, **cache).logits
    keep = mask.bool()
    return torch.cat([first, second], dim=1)[keep], one_shot[keep]


@pytest.mark.parametrize("kind", KINDS)
def test_a_chunked_prefill_against_the_kv_cache_gives_the_one_shot_bits(zoo, kind):
    sequences, mask, _, _, _ = zoo.rollout(kind, "cpu", "greedy")
    chunked, one_shot = _chunked_and_one_shot_logits(zoo.patched(kind, "cpu"), sequences, mask)
    assert _same(chunked, one_shot)
    if kind == "qwen3":                                                  # negative control: HF's float32 model
        assert not _same(*_chunked_and_one_shot_logits(zoo.model(kind), sequences, mask))


def test_the_rollouts_differ_between_modes_and_rows(zoo):
    """The tokens depend on the mode, the prompt and the seed (a rollout of one repeated token would pass the
    tests above for any attention)."""
    greedy, sampled = (zoo.rollout("qwen3", "cpu", mode)[2] for mode in MODES)
    assert not torch.equal(greedy, sampled)
    assert len({tuple(row) for row in greedy.tolist()}) == len(PROMPTS)


# -- 3. Negative controls: what HF's float32 model and torch's ops give ------------------------------------------

def test_hf_float32_logprobs_depend_on_the_layout(zoo):
    """Negative control: the same rollout and recomputation on HF's unpatched float32 model (sdpa attention,
    torch's matmuls; bitparity.sample and token_logprobs on its logits) do not give the Sampler's bits in every
    layout, nor a prompt generated alone the bits it gets in the batch: the KV cache's one-query steps, the
    padding and the batch change HF's bits, so the equalities above can fail."""
    model = zoo.model("llama")
    with bitparity.use_backend("cpu"):
        sequences, mask, tokens, logprobs = rollout(model, "greedy")
        trainer = trainer_logprobs(model, sequences, mask, tokens, 1.0, layouts=(ALONE, REVERSED))
        _, _, alone_tokens, alone_logprobs = rollout(model, "greedy", rows=slice(0, 1))
    differ, _ = _differing(trainer, logprobs)
    assert differ[ALONE] > 0 and differ[REVERSED] > 0, differ
    assert torch.equal(alone_tokens[0], tokens[0]) and not _same(alone_logprobs[0], logprobs[0])


def test_native_backend_gives_other_bits(zoo):
    """Negative control for the cross-backend equality: bitparity's native backend (torch's own ops, patched
    in the same way) generates the same greedy tokens here but with log-probs of other bits."""
    reference = zoo.rollout("qwen3", "numpy", "greedy")
    with bitparity.use_backend("native"):
        native = rollout(zoo.patched("qwen3"), "greedy")
    assert torch.equal(native[2], reference[2])
    assert not _same(native[3], reference[3])


# -- 2. Accuracy against HF's float64 model -----------------------------------------------------------------------

def _float64_logits_and_logprobs(model64, sequences, mask, tokens, temperature):
    """HF's float64 logits of the left-padded batch and log_softmax(logits / temperature) at the generated
    tokens (one batch: the padding changes HF's float64 logits by 2e-15 at most here, against each sequence
    alone)."""
    with torch.no_grad():
        logits = model64(input_ids=sequences, attention_mask=mask,
                         position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0)).logits
    t0 = sequences.shape[1] - tokens.shape[1]
    logprobs = torch.log_softmax(logits[:, t0 - 1:-1] / temperature, dim=-1).gather(2, tokens[..., None])[..., 0]
    return logits, logprobs


# Measured, the worst of the three models and both modes (HF's own float32 model in brackets), logits up to
# 4.55 in magnitude: logits 1.08e-6 (1.75e-6), log-probs 8.9e-7 (1.05e-6). Bounds ~4.5x the measured values.
LOGIT_BOUND = 5e-6
LOGPROB_BOUND = 4e-6


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_logprobs_are_within_bounds_of_hf_float64(zoo, kind):
    model64 = zoo.float64(kind)
    for mode in MODES:
        sequences, mask, tokens, logprobs, _ = zoo.rollout(kind, "cpu", mode)
        logits64, want = _float64_logits_and_logprobs(model64, sequences, mask, tokens, MODES[mode][1])
        assert float((logprobs.double() - want).abs().max()) <= LOGPROB_BOUND, mode
        with bitparity.use_backend("cpu"), torch.no_grad():
            logits = zoo.patched(kind)(input_ids=sequences, attention_mask=mask,
                                       position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0)).logits
        tokens_ = mask.bool()
        assert float((logits[tokens_].double() - logits64[tokens_]).abs().max()) <= LOGIT_BOUND, mode
        assert float(logits64[tokens_].abs().max()) > 2.0             # not a comparison of near-zero logits


def test_qwen3_moe_with_renormalised_routing_is_within_bounds_of_hf_float64(zoo):
    """norm_topk_prob=True (Qwen3-MoE's default) too: the routing weights renormalised over the top k."""
    model = build("qwen3_moe", norm_topk_prob=True)
    sequences, mask, _, _, _ = zoo.rollout("qwen3_moe", "cpu", "greedy")
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        want = float64(model)(input_ids=sequences, attention_mask=mask, position_ids=positions).logits
        got = bitparity.patch(model, backend="cpu")(input_ids=sequences, attention_mask=mask,
                                                    position_ids=positions).logits
        other = zoo.patched("qwen3_moe", "cpu")(input_ids=sequences, attention_mask=mask, position_ids=positions).logits
    keep = mask.bool()
    assert float((got[keep].double() - want[keep]).abs().max()) <= LOGIT_BOUND            # measured 1.3e-6
    assert float((other[keep].double() - want[keep]).abs().max()) > 1e-3                   # False routes otherwise


# -- 4. Backward ----------------------------------------------------------------------------------------------------

def _training_batch():
    """Two left-padded rows (the RL trainer's layout), position ids counting each row's tokens from 0, 6 + 3
    labelled tokens; the first row holds token PAD = 0 (Llama's padding_idx) as an ordinary token."""
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in (7, 4)]
    rows[0][3] = PAD
    ids, mask = left_padded(rows)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    # No label at the padding, nor at a row's first token (HF's shift would have the padding before it predict it).
    return ids, mask, positions, ids.masked_fill((mask == 0) | (positions == 0), -100)


def loss_and_gradients(model):
    ids, mask, positions, labels = _training_batch()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels).loss
    loss.backward()
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


# Measured, the worst of the three models and the tied one (HF's own float32 model in brackets): the loss (5.0
# to 19.9) within 9.6e-8 of HF's float64 loss, relatively: one float32 ulp (the same); gradients, the largest
# |grad - grad64| of a tensor over its largest |grad64|, 8.8e-7 (1.0e-6). Bounds: ~4 ulps of the loss, ~4.5x
# the gradients' measured error.
LOSS_RTOL = 5e-7
GRAD_BOUND = 4e-6


def _gradient_errors(grads, grads64):
    return {name: float((g.double() - grads64[name]).abs().max() / grads64[name].abs().max())
            for name, g in grads.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_backward_gives_every_parameter_a_gradient_with_the_same_bits_on_every_backend(zoo, kind):
    loss, grads = zoo.gradients(kind, "numpy")
    names = [name for name, _ in zoo.model(kind).named_parameters()]
    assert list(grads) == names
    missing = [name for name, g in grads.items() if g is None or not bool(g.any()) or not bool(g.isfinite().all())]
    assert not missing, f"no (or a zero or non-finite) gradient: {missing}"
    for backend in BACKENDS[1:]:
        other_loss, other = zoo.gradients(kind, _checked(backend))
        assert _same(other_loss, loss), f"{backend}'s loss differs from numpy's"
        differ = [name for name in names if not _same(other[name], grads[name])]
        assert not differ, f"{backend}'s gradients of {differ} differ from numpy's"


@pytest.mark.parametrize("kind", KINDS)
def test_loss_and_gradients_are_within_bounds_of_hf_float64(zoo, kind):
    loss, grads = zoo.gradients(kind, "cpu")
    loss64, grads64 = loss_and_gradients(zoo.float64(kind))
    assert abs(float(loss) - float(loss64)) <= LOSS_RTOL * abs(float(loss64))
    errors = _gradient_errors(grads, grads64)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_BOUND, f"{worst}: {errors[worst]:.3g}"
    if kind == "llama":                   # nn.Embedding(padding_idx=0): HF gives that row no gradient, nor do we
        assert not bool(grads64["model.embed_tokens.weight"][PAD].any())
        assert not bool(grads["model.embed_tokens.weight"][PAD].any())


def test_the_loss_divides_by_num_items_in_batch_as_hfs(zoo):
    """Trainer passes num_items_in_batch (the labelled tokens of the whole accumulated batch): the loss is then
    the sum over this batch's labelled tokens over that count, as in HF's ForCausalLMLoss."""
    ids, mask, positions, labels = _training_batch()
    losses = {}
    for name, model in (("patched", zoo.patched("qwen3", "cpu")), ("float64", zoo.float64("qwen3"))):
        with torch.no_grad():
            losses[name] = float(model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels,
                                       num_items_in_batch=torch.tensor(20)).loss)
    assert abs(losses["patched"] - losses["float64"]) <= LOSS_RTOL * abs(losses["float64"])
    # The batch has 9 labelled tokens, so num_items_in_batch = 20 is not the mean's divisor: it changes the loss.
    assert abs(losses["float64"] - float(zoo.gradients("qwen3", "cpu")[0]) * 9 / 20) < 1e-5


def test_hf_float32_gradients_are_not_the_patched_bits(zoo):
    """Negative control: HF's float32 model's gradients (same weights, same batch) have other bits."""
    _, grads = zoo.gradients("llama", "cpu")
    _, hf = loss_and_gradients(zoo.model("llama"))              # leaves no gradient behind (set_to_none)
    assert any(not _same(hf[name], g) for name, g in grads.items())


# -- 7. Tied embeddings ---------------------------------------------------------------------------------------------

def test_tied_embeddings_share_one_weight_and_its_gradient_is_the_same_bits_on_every_backend(zoo):
    tied = dict(tie_word_embeddings=True)
    model = zoo.patched("qwen3", "cpu", **tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    name = "model.embed_tokens.weight"
    loss, grads = zoo.gradients("qwen3", "cpu", **tied)
    assert name in grads and "lm_head.weight" not in grads                # one parameter, named once
    for backend in ("numpy", "ascend"):
        other_loss, other = zoo.gradients("qwen3", _checked(backend), **tied)
        assert _same(other_loss, loss) and _same(other[name], grads[name]), backend
    loss64, grads64 = loss_and_gradients(zoo.float64("qwen3", **tied))
    assert abs(float(loss) - float(loss64)) <= LOSS_RTOL * abs(float(loss64))
    assert _gradient_errors({name: grads[name]}, grads64)[name] <= GRAD_BOUND
    _, untied = zoo.gradients("qwen3", "cpu")        # the head's gradient is in it: not the untied embedding's
    assert not _same(grads[name], untied[name])


# -- 5. bfloat16 ----------------------------------------------------------------------------------------------------

def test_a_bf16_model_gives_bf16_logits_with_the_same_bits_on_every_backend(zoo):
    ids, mask = left_padded(PROMPTS)
    logits = {}
    for backend in BACKENDS:
        model = bitparity.patch(copy.deepcopy(zoo.model("qwen3_moe")).to(torch.bfloat16), backend=_checked(backend))
        with torch.no_grad():
            logits[backend] = model(input_ids=ids, attention_mask=mask).logits
        assert logits[backend].dtype == torch.bfloat16
    for backend in BACKENDS[1:]:
        assert _same(logits[backend], logits["numpy"]), backend
    hf = copy.deepcopy(zoo.model("qwen3_moe")).to(torch.bfloat16)        # negative control: HF's bf16 bits
    with torch.no_grad():
        assert not _same(hf(input_ids=ids, attention_mask=mask).logits, logits["numpy"])


def test_casting_a_patched_model_to_bf16_gives_the_bits_of_patching_the_bf16_model(zoo):
    """patch, then .to(torch.bfloat16) (or .half(), .to(device, dtype)): the same model as cast, then patched.
    The rotary tables are binary32 (rounded once from binary64), whatever the activations' dtype."""
    ids, mask = left_padded(PROMPTS)
    cast_first = bitparity.patch(copy.deepcopy(zoo.model("qwen3")).to(torch.bfloat16), backend="cpu")
    patched_first = bitparity.patch(copy.deepcopy(zoo.model("qwen3")), backend="cpu").to(torch.bfloat16)
    with torch.no_grad():
        want = cast_first(input_ids=ids, attention_mask=mask).logits
        got = patched_first(input_ids=ids, attention_mask=mask).logits
    assert got.dtype == torch.bfloat16 and _same(got, want)


# -- The Triton interpreter: one small case ------------------------------------------------------------------------

def test_cuda_recomputes_the_cpu_logprobs_of_a_left_padded_batch(zoo):
    """The trainer's forward over two left-padded rows (the planned attention with kv_lengths, the row takes) on
    the cuda backend, here the Triton interpreter (about 2 s): the cpu backend's bits, which are the Sampler's.
    On a machine with a GPU the model and tensors go to it."""
    device = device_type(_checked("cuda"))
    sequences, mask, _, logprobs, _ = zoo.rollout("llama", "cpu", "greedy")
    model = bitparity.patch(copy.deepcopy(zoo.model("llama")).to(device), backend="cuda")
    with bitparity.use_backend("cuda"), torch.no_grad():                  # token_logprobs on cuda too
        got = sequence_logprobs(model, sequences[:2].to(device), mask[:2].to(device))
    assert _same(got[:, -NEW:], logprobs[:2])


# -- 6. Errors, patching twice, unpatch ----------------------------------------------------------------------------

def _unchanged(model, originals):
    assert not hasattr(model, "_bitparity_originals")
    assert model.config._attn_implementation == originals["attn"]
    assert dict(model.named_modules()) == originals["modules"]


def _state(model):
    return {"attn": model.config._attn_implementation, "modules": dict(model.named_modules())}


@pytest.mark.parametrize("kind, overrides, option", [
    ("qwen3", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_type"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                                    "original_max_position_embeddings": 32}), "rope_type"),
    # (Qwen3 slides the layers from max_window_layers on: every layer here, the second one in the next row;
    # Qwen3-MoE slides every layer. A window no layer gets is accepted: test_a_window_no_layer_gets_is_accepted.)
    ("qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=0), "sliding_window"),
    ("qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), r"HF slides layers \[1\]"),
    ("qwen3_moe", dict(use_sliding_window=True, sliding_window=4), "sliding_window"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
    ("qwen3_moe", dict(output_router_logits=True), "output_router_logits"),
], ids=["linear-rope", "yarn-rope", "sliding-window-every-layer", "sliding-window-layer-1", "moe-sliding-window",
        "gelu", "router-logits"])
def test_an_unsupported_option_raises_naming_it_before_anything_changes(kind, overrides, option):
    model = build(kind, **overrides)
    before = _state(model)
    with pytest.raises(ValueError, match=option):
        bitparity.patch(model)
    _unchanged(model, before)


def test_attention_dropout_in_training_raises_naming_it():
    model = bitparity.patch(build("qwen3", attention_dropout=0.1), backend="cpu")
    ids = PROMPTS[0][None]
    with torch.no_grad():
        model(input_ids=ids)                                          # eval: no dropout
        model.train()
        with pytest.raises(ValueError, match="attention_dropout"):
            model(input_ids=ids)


def test_an_unsupported_model_raises_naming_its_class():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB, n_positions=16,
                                      bos_token_id=0, eos_token_id=0))
    before = _state(gpt2)
    with pytest.raises(TypeError, match="GPT2LMHeadModel"):
        bitparity.patch(gpt2)
    _unchanged(gpt2, before)
    for thing in (torch.nn.Linear(2, 2), "model"):
        with pytest.raises(TypeError, match=type(thing).__name__):
            bitparity.patch(thing)


@pytest.mark.parametrize("kind", KINDS)
def test_patch_keeps_hf_parameter_names_and_checkpoint_keys(kind):
    """The same parameters under the same names, so HF checkpoints, optimizers' name-based parameter groups
    and save_pretrained see the model they know."""
    model = build(kind)
    checkpoint = model.state_dict()
    parameters = [(name, id(p)) for name, p in model.named_parameters()]
    bitparity.patch(model, backend="cpu")
    assert [(name, id(p)) for name, p in model.named_parameters()] == parameters
    assert list(model.state_dict()) == list(checkpoint)
    model.load_state_dict(checkpoint)


@pytest.mark.parametrize("training", (False, True), ids=["eval", "train"])
def test_patch_keeps_the_models_train_or_eval_mode(training):
    """The replacement modules are in the model's mode (HF's attention reads self.training for its dropout)."""
    model = build("llama").train(training)
    bitparity.patch(model, backend="cpu")
    assert [name for name, m in model.named_modules() if m.training != training] == []


def test_patch_leaves_another_model_built_from_the_same_config_alone():
    """HF models built from one config object share it (a policy and its reference model, say): patching one
    must not switch the other's attention implementation, nor change its bits."""
    cls, config_cls, options = MODELS["qwen3"]
    config = config_cls(**COMMON, **options)
    policy, reference = cls(config).eval(), cls(config).eval()
    ids, mask = left_padded(PROMPTS)
    implementation = reference.config._attn_implementation
    with torch.no_grad():
        before = reference(input_ids=ids, attention_mask=mask).logits
        bitparity.patch(policy, backend="cpu")
        after = reference(input_ids=ids, attention_mask=mask).logits
    assert reference.config._attn_implementation == implementation
    assert _same(after, before)


def test_an_unknown_backend_raises_before_anything_changes():
    model = build("qwen3")
    before = _state(model)
    with pytest.raises(ValueError, match="bogus"):
        bitparity.patch(model, backend="bogus")
    _unchanged(model, before)


def test_patching_twice_raises_and_unpatch_restores_hf_modules_and_bits():
    model = build("qwen3")
    ids, mask = left_padded(PROMPTS)
    before, loss_function = _state(model), model.loss_function
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask).logits
    with pytest.raises(ValueError, match="not patched"):
        bitparity.unpatch(model)
    bitparity.patch(model, backend="cpu")
    patched_modules = dict(model.named_modules())
    with pytest.raises(ValueError, match="already patched"):
        bitparity.patch(model, backend="cpu")
    assert dict(model.named_modules()) == patched_modules            # the second patch changed nothing
    with torch.no_grad():
        patched = model(input_ids=ids, attention_mask=mask).logits
    assert not _same(patched, hf)                                     # so the equality below can fail
    assert bitparity.unpatch(model) is model
    _unchanged(model, before)
    assert model.loss_function is loss_function
    with torch.no_grad():
        assert _same(model(input_ids=ids, attention_mask=mask).logits, hf)
    bitparity.patch(model, backend="cpu")                              # and it can be patched again
    with torch.no_grad():
        assert _same(model(input_ids=ids, attention_mask=mask).logits, patched)


_CAUSAL = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
_PADDED = _CAUSAL & torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]


@pytest.mark.parametrize("mask", [_CAUSAL, _PADDED], ids=["causal", "causal-left-padded"])
def test_a_causal_4d_mask_gives_the_bits_of_hfs_own_mask(zoo, mask):
    """The check below refuses other masks, not these: a 4D causal mask (over left padding) as a user passes it."""
    model = zoo.patched("qwen3", "cpu")
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    two_d = mask[:, 0, -1].long()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = model(input_ids=ids, attention_mask=two_d).logits
    keep = mask[:, 0, -1]
    assert _same(got[keep], want[keep])


@pytest.mark.parametrize("call", [
    dict(attention_mask=torch.ones(2, 1, 6, 6, dtype=torch.bool)),                         # bidirectional
    dict(attention_mask=torch.ones(2, 1, 6, 6, dtype=torch.bool).tril(1)),                 # each query sees one ahead
    dict(attention_mask=_CAUSAL & ~torch.ones(6, 6, dtype=torch.bool).tril(-3)),           # a sliding window of 3
    dict(position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]] * 2), use_cache=False),            # HF's packed sequences
], ids=["bidirectional", "lookahead", "sliding-window", "packed"])
def test_a_mask_that_is_not_causal_over_padding_raises(zoo, call):
    model = zoo.patched("qwen3", "cpu")
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), pytest.raises(ValueError, match="causal masks over padded sequences"):
        model(input_ids=ids, **call)


def test_output_router_logits_at_call_time_raises_naming_it(zoo):
    """The patched MoE block does not run HF's router module, so HF's auxiliary loss has no router logits to
    read: asking for them in the call must raise a clear error (today: IndexError in load_balancing_loss_func)."""
    model = zoo.patched("qwen3_moe", "cpu")
    ids, mask, positions, labels = _training_batch()
    with pytest.raises((ValueError, TypeError), match="output_router_logits"):
        model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels, output_router_logits=True)


# -- 7. The config's numeric fields (issue 25), one-token sequences ------------------------------------------------

CONFIG_ROWS = [  # (kind, field, bad value, message fragment naming it); each set on the built model's config
    ("qwen3", "rms_norm_eps", 0.0, "config.rms_norm_eps must be finite and in (0.0, inf); got 0.0"),
    ("qwen3", "rms_norm_eps", 1e-40, "config.rms_norm_eps must round to a normal float32"),
    ("llama", "rms_norm_eps", float("nan"), "config.rms_norm_eps must be finite"),
    ("qwen3_moe", "rms_norm_eps", -1e-6, "config.rms_norm_eps must be finite and in (0.0, inf)"),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 1.0},
     "config.rope_parameters['rope_theta'] must be finite and in (1.0, inf); got 1.0"),
    ("qwen3", "rope_parameters", {"rope_type": "default", "rope_theta": float("inf")},
     "config.rope_parameters['rope_theta'] must be finite"),
    ("qwen3", "num_key_value_heads", 3, "config.num_attention_heads must be a multiple of config.num_key_value_heads"),
    ("llama", "head_dim", 7, "config.head_dim (or hidden_size // num_attention_heads) must be even"),
    ("qwen3", "head_dim", 0, "config.head_dim must be in [1, inf]"),
    ("qwen3", "vocab_size", 0, "config.vocab_size must be in [1, inf]"),
    ("llama", "hidden_size", -32, "config.hidden_size must be in [1, inf]"),
    ("qwen3", "num_hidden_layers", 0, "config.num_hidden_layers must be in [1, inf]"),
    ("qwen3", "max_position_embeddings", 0, "config.max_position_embeddings must be in [1, inf]"),
    ("qwen3_moe", "num_experts_per_tok", 5, "config.num_experts_per_tok must be in [1, 4] (config.num_experts)"),
    ("qwen3_moe", "num_experts_per_tok", 0, "config.num_experts_per_tok must be in [1, 4]"),
    ("qwen3_moe", "num_experts", 0, "config.num_experts must be in [1, inf]"),
    ("qwen3_moe", "decoder_sparse_step", 0, "config.decoder_sparse_step must be in [1, inf]"),
]


@pytest.mark.parametrize("backend", BACKENDS + ("cuda",))          # raised before any op runs: cheap everywhere
@pytest.mark.parametrize("kind, field, value, fragment", CONFIG_ROWS,
                         ids=[f"{kind}-{field}-{value}" for kind, field, value, _ in CONFIG_ROWS])
def test_a_bad_config_field_raises_naming_it_before_anything_changes(kind, field, value, fragment, backend):
    """Each value is one HF's config takes (eps 0 used to pass patch and fail in the first forward, naming eps)."""
    model = build(kind)
    setattr(model.config, field, value)
    before = _state(model)
    with pytest.raises(ValueError) as raised:
        bitparity.patch(model, backend=backend)
    assert fragment in str(raised.value)
    _unchanged(model, before)


def test_a_modules_own_eps_is_checked_too():
    model = build("qwen3")
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 0.0
    with pytest.raises(ValueError, match=r"model\.layers\.1\.post_attention_layernorm\.variance_epsilon must be"):
        bitparity.patch(model)


def test_a_window_no_layer_gets_is_accepted():
    """Qwen3 with use_sliding_window=True and max_window_layers (28) above its 2 layers: HF runs every layer with
    full attention (config.layer_types), so patch accepts it and gives the bits of the model without the option."""
    model = build("qwen3", use_sliding_window=True, sliding_window=4)
    assert model.config.sliding_window == 4 and "sliding_attention" not in model.config.layer_types
    bitparity.patch(model, backend="cpu")
    plain = bitparity.patch(build("qwen3"), backend="cpu")
    ids, mask = left_padded(PROMPTS)
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (model, plain))
    assert _same(got, want)


def test_a_one_token_sequence_has_no_logprobs():
    """sequence_logprobs scores tokens 1 .. T-1: for T = 1 there are none, a [B, 0] result (it used to raise
    'logits must not be empty')."""
    model = bitparity.patch(build("qwen3"), backend="cpu")
    out = sequence_logprobs(model, torch.tensor([[3], [4]]))
    assert out.shape == (2, 0) and out.dtype == torch.float32
    with pytest.raises(TypeError, match=r"input_ids must be a \[B, T\] torch.Tensor; got \(3,\)"):
        sequence_logprobs(model, torch.tensor([3, 4, 5]))
