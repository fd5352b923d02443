"""vLLM with the bitparity plugin reports the trainer's bits: for the tiny Qwen3 (GQA), Qwen3-MoE (a dense layer,
norm_topk_prob=False) and Llama (MQA) checkpoints in float32 and bfloat16, every request's tokens are
bitparity.sample's on the patched HF model's logits and its log-probs are the patched model's
(hf.sequence_logprobs where the distribution is unfiltered), alone, batched with requests joining mid-run,
with prompts prefilled in chunks, and on a prefix-cache hit. float32 engines report raw_logprobs (vLLM's
default), bfloat16 ones processed_logprobs (TRL's and verl's setting). One engine at a time (module-scoped,
parametrized)."""

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from bitparity import hf, ops  # noqa: E402

from .engines import (MAX_BATCHED_TOKENS, PLUGIN_NAMES, assert_trainer_bits, bits, close, engine,  # noqa: E402
                      generate, model_class, reference, save_checkpoint)

CASES = [("qwen3", "float32"), ("qwen3", "bfloat16"), ("qwen3_moe", "float32"), ("qwen3_moe", "bfloat16"),
         ("llama", "float32"), ("llama", "bfloat16")]
KIND = {"float32": "raw", "bfloat16": "processed"}


def _requests():
    """8 requests: prompts of 3 to 130 tokens (three over the 64-token step budget: chunked), 4 to 12 new tokens
    (so later requests join running ones), greedy, seeded temperature, seeded temperature with min-p, top-k and
    top-p, and unseeded temperature."""
    rng = np.random.Generator(np.random.PCG64(7))
    lengths = (5, 70, 130, 12, 40, 3, 100, 20)
    kinds = [dict(temperature=0.0), dict(temperature=0.7, seed=11),
             dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, seed=3), dict(temperature=1.0)]
    return [(tuple(int(t) for t in rng.integers(0, 512, n)),
             SamplingParams(max_tokens=4 + (i * 5) % 9, logprobs=0, **kinds[i % 4]))
            for i, n in enumerate(lengths)]


REQUESTS = _requests()
assert max(len(p) for p, _ in REQUESTS) > MAX_BATCHED_TOKENS


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request, tmp_path_factory):
    kind, dtype = request.param
    path = save_checkpoint(kind, tmp_path_factory.mktemp(kind))
    llm = engine(path, kind, dtype, logprobs_mode=f"{KIND[dtype]}_logprobs")
    yield kind, llm, reference(path, kind, dtype), KIND[dtype]
    close(llm)


def test_engine_runs_the_plugin_model(case):
    kind, llm, _, _ = case
    assert model_class(llm) == PLUGIN_NAMES[kind]


def test_batched_and_alone_give_the_trainer_bits(case):
    _, llm, model, logprobs = case
    batched = generate(llm, REQUESTS)
    assert_trainer_bits(model, REQUESTS, batched, logprobs)
    alone = [generate(llm, [r])[0] for r in REQUESTS]
    assert_trainer_bits(model, REQUESTS, alone, logprobs)


def test_prefix_cache_hit_gives_the_trainer_bits(case):
    _, llm, model, logprobs = case
    prompt, params = REQUESTS[2]
    generate(llm, [(prompt, params)])
    # the same prompt again, and one that shares its first 100 tokens: their full blocks come from the cache
    again = [(prompt, params), (prompt[:100] + (1, 2, 3), params)]
    results = generate(llm, again)
    assert [cached for _, _, cached in results] == [128, 96]
    assert_trainer_bits(model, again, results, logprobs)


def test_prompt_logprobs_and_top_logprobs_are_the_canonical_rows(case):
    """Prompt log-probs (the prompt prefilled in chunks) are hf.sequence_logprobs'; each generated step's top 3
    are bitparity.topk of the log_softmax row of the patched model's logits (a greedy request: the raw row under
    either logprobs_mode), with vLLM's ranks 1, 2, 3."""
    _, llm, model, _ = case
    prompt = REQUESTS[2][0]
    params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=3, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": list(prompt)}], [params], use_tqdm=False)[0]
    tokens = list(out.outputs[0].token_ids)
    reported = torch.tensor([step[t].logprob for step, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    with torch.no_grad():
        expected = hf.sequence_logprobs(model, torch.tensor([prompt]))[0]
        rows = ops.log_softmax(model(input_ids=torch.tensor([list(prompt) + tokens])).logits[0, len(prompt) - 1:-1])
    assert torch.equal(bits(reported), bits(expected))
    top, top_ids = ops.topk(rows, 3)
    for j, step in enumerate(out.outputs[0].logprobs):
        assert [(i, step[i].logprob, step[i].rank) for i in top_ids[j].tolist()] == [
            (i, v, r) for r, (i, v) in enumerate(zip(top_ids[j].tolist(), top[j].tolist()), start=1)]
