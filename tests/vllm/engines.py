"""What the vLLM plugin tests share: tiny HF checkpoints, an in-process vLLM engine with a small KV cache, and
the trainer's side of every request (the patched HF model of the same checkpoint, bitparity.sample and
bitparity.hf.sequence_logprobs), compared bit for bit.

Engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), eager, with 64 MiB of KV cache (or a block
count), at most 4 running requests and 64 scheduled tokens per step, so a prompt over 64 tokens is prefilled
in chunks and later requests join running ones; blocks of 32 tokens with prefix caching on.
"""

import gc
import os

import torch

from bitparity import hf, ops

VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, intermediate_size=128, max_position_embeddings=512, rms_norm_eps=1e-6,
              tie_word_embeddings=False, initializer_range=0.2)
CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, use_sliding_window=False)),
    # a dense first layer, 8 experts top-2 without renormalisation
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(COMMON, num_hidden_layers=3, num_experts=8,
                                                                num_experts_per_tok=2, moe_intermediate_size=32,
                                                                norm_topk_prob=False, mlp_only_layers=[0],
                                                                decoder_sparse_step=1)),
    # multi-query attention
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON, num_key_value_heads=1, mlp_bias=False)),
}
PLUGIN_NAMES = {"qwen3": "BitparityQwen3ForCausalLM", "qwen3_moe": "BitparityQwen3MoeForCausalLM",
                "llama": "BitparityLlamaForCausalLM"}
MAX_BATCHED_TOKENS = 64


def use_test_environment(cache_root):
    """vLLM reads these when an engine starts: in-process, no downloads, compile caches under cache_root."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["VLLM_CACHE_ROOT"] = str(cache_root)


def save_checkpoint(kind, path, seed=0, **overrides):
    """A tiny random HF checkpoint (float32 safetensors, no tokenizer) of CONFIGS[kind], with `overrides` of its
    config fields, in path."""
    import transformers
    config_class, model_class, settings = CONFIGS[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**dict(settings, **overrides)))
    model.save_pretrained(path)
    return str(path)


def engine(path, kind, dtype, *, plugin=True, logprobs_mode="raw_logprobs", **settings):
    """vLLM's LLM on the checkpoint: the plugin's model class (chosen by hf_overrides) or, with plugin=False,
    vLLM's own."""
    from vllm import LLM
    options = dict(dtype=dtype, enforce_eager=True, max_model_len=256, max_num_seqs=4,
                   max_num_batched_tokens=MAX_BATCHED_TOKENS, block_size=32, enable_prefix_caching=True,
                   generation_config="vllm", skip_tokenizer_init=True, seed=0, logprobs_mode=logprobs_mode,
                   kv_cache_memory_bytes=64 << 20)      # without it vLLM's CPU worker wants 92% of the memory free
    if plugin:
        options["hf_overrides"] = {"architectures": [PLUGIN_NAMES[kind]]}
    options.update(settings)
    return LLM(model=path, **options)


def close(llm):
    """Free an in-process engine (its KV cache and model) before the next one starts."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def model_class(llm):
    """The class name of the model the engine runs (a plugin that raised would only be logged by vLLM, and the
    engine would run its own class)."""
    return llm.apply_model(lambda model: type(model).__name__)[0]


def reference(path, kind, dtype):
    """The trainer's model: HF's class loaded from the same checkpoint in dtype, patched by bitparity."""
    import transformers
    model = getattr(transformers, CONFIGS[kind][1]).from_pretrained(path, dtype=getattr(torch, dtype))
    return hf.patch(model.eval())


def generate(llm, requests):
    """requests [(prompt ids, SamplingParams)] in one generate call -> [(tokens, log-probs f32, cached tokens)],
    the log-prob of each sampled token as vLLM reports it (a Python float of the float32: exact)."""
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p, _ in requests], [s for _, s in requests],
                           use_tqdm=False)
    results = []
    for out in outputs:
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = torch.tensor([step[t].logprob for step, t in zip(completion.logprobs, tokens)],
                                dtype=torch.float32)
        results.append((tokens, logprobs, out.num_cached_tokens))
    return results


def bits(t):
    return t.contiguous().view(torch.int32)


def trainer_side(model, prompt, tokens, params, kind):
    """What the trainer computes for a finished request: (tokens bitparity.sample draws from the patched
    model's logits at positions len(prompt) + j with the request's seed and filters, the log-prob of each of
    vLLM's tokens under the distribution `kind` names ("raw" or "processed", spec 22.1), and
    hf.sequence_logprobs of the sequence at the distribution's temperature, None where filters make it another
    distribution)."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    n = len(prompt)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, n - 1:-1]
    steps = len(tokens)
    greedy = params.temperature < 1e-5
    temperature = 0.0 if greedy else params.temperature
    filters = dict(top_k=params.top_k if 0 < params.top_k < VOCAB else 0, top_p=params.top_p, min_p=params.min_p)
    seeds = torch.full((steps,), params.seed if params.seed is not None else 0, dtype=torch.int64)
    positions = n + torch.arange(steps)
    drawn, _ = ops.sample(logits, seeds, positions, temperature=temperature, **filters)
    if kind == "raw" or greedy:
        dist = logits
    else:
        dist = ops.filter_logits(logits, temperature=temperature, **filters)
    logprobs = ops.token_logprobs(dist, torch.tensor(tokens))
    filtered = filters["top_k"] or filters["top_p"] < 1 or filters["min_p"] > 0
    sequence = None
    if kind == "raw" or greedy or not filtered:
        with torch.no_grad():
            sequence = hf.sequence_logprobs(model, ids, temperature=1.0 if kind == "raw" or greedy
                                            else temperature)[0, n - 1:]
    return drawn.tolist(), logprobs, sequence


def assert_trainer_bits(model, requests, results, kind):
    """Every request's tokens and log-probs are the trainer's (trainer_side), bit for bit."""
    for i, ((prompt, params), (tokens, logprobs, _)) in enumerate(zip(requests, results)):
        drawn, expected, sequence = trainer_side(model, prompt, tokens, params, kind)
        if params.temperature < 1e-5 or params.seed is not None:
            assert tokens == drawn, f"request {i}: vLLM's tokens {tokens} are not bitparity.sample's {drawn}"
        assert torch.equal(bits(logprobs), bits(expected)), (
            f"request {i}: log-probs differ from the trainer's by up to {float((logprobs - expected).abs().max()):.3g}")
        if sequence is not None:
            assert torch.equal(bits(logprobs), bits(sequence)), f"request {i}: not hf.sequence_logprobs' bits"
