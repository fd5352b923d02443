"""vLLM at tensor_parallel_size=2 with the bitparity plugin reports the trainer's bits (spec 30.8, 31.5): one engine
at a time, the tiny Qwen3 (GQA: 4 query heads, 2 key/value heads, so one of each per worker) in float32
(raw_logprobs) and the tiny Qwen3-MoE (a dense layer, 8 experts replicated on both workers) in bfloat16
(processed_logprobs), each with a vocabulary of 20000 (two §3 segments: 16384 rows of lm_head on rank 0, 3616 on
rank 1), two TP workers (vLLM's multiprocess executor, gloo). Its tokens and log-probs equal bitparity.sample's
and the patched HF model's in this process (engines.trainer_side), which are TP 1's (test_model.py), bit for bit:
a batched call with a chunked prompt and a request joining a running one (tokens drawn from both workers'
segments), and a request alone."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from bitparity import ops  # noqa: E402
from bitparity.vllm.model import BitparityQwen3ForCausalLM  # noqa: E402

from .engines import (CONFIGS, MAX_BATCHED_TOKENS, PLUGIN_NAMES, assert_trainer_bits, bits, close,  # noqa: E402
                      engine, generate, reference, save_checkpoint)

TP = 2
VOCAB = 20000           # two 16384-entry segments (parallel.vocab_shard): both workers hold logits to gather


def _requests():
    """A greedy prompt of 100 tokens (over the 64-token step budget: chunked), a seeded temperature and a seeded
    filtered request, 3 to 9 new tokens (the short one finishes while the others run)."""
    rng = np.random.Generator(np.random.PCG64(29))
    settings = [(100, 6, dict(temperature=0.0)), (7, 9, dict(temperature=0.8, seed=5)),
                (30, 3, dict(temperature=1.0, top_k=40, top_p=0.9, seed=2))]
    return [(tuple(int(t) for t in rng.integers(0, VOCAB, n)), SamplingParams(max_tokens=steps, logprobs=0, **kind))
            for n, steps, kind in settings]


REQUESTS = _requests()
assert max(len(p) for p, _ in REQUESTS) > MAX_BATCHED_TOKENS


def _worker_shards(model):
    """What one TP worker holds: (model class, its query rows of layer 0, its lm_head rows)."""
    return (type(model).__name__, model.model.layers[0].self_attn.q_proj.weight.shape[0],
            model.lm_head.weight.shape[0])


CASES = [("qwen3", "float32"), ("qwen3_moe", "bfloat16")]
KIND = {"float32": "raw", "bfloat16": "processed"}       # the logprobs_mode, as in test_model.py


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request, tmp_path_factory):
    kind, dtype = request.param
    path = save_checkpoint(kind, tmp_path_factory.mktemp(f"{kind}-tp"), vocab_size=VOCAB)
    with pytest.MonkeyPatch.context() as env:
        # vLLM's CPU worker binds each TP worker's OpenMP threads to its own NUMA node unless told which cores to
        # use; this machine has one NUMA node, so without the binding TP 2 stops with "Not enough allowed NUMA
        # nodes to bind threads of 2 local CPUWorkers". One core per worker; a caller's own binding is kept.
        env.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"))
        # the workers' RPC carries _worker_shards (a function) only with vLLM's pickle serialisation
        env.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        llm = engine(path, kind, dtype, logprobs_mode=f"{KIND[dtype]}_logprobs", tensor_parallel_size=TP,
                     distributed_executor_backend="mp")
        yield kind, llm, reference(path, kind, dtype), KIND[dtype]
        close(llm)


def test_tp2_engine_gives_the_trainer_bits(case):
    kind, llm, model, logprobs = case
    # each worker runs the plugin's model on its half of the heads and its vocabulary segment
    assert llm.apply_model(_worker_shards) == [(PLUGIN_NAMES[kind], 2 * 32, 16384),
                                               (PLUGIN_NAMES[kind], 2 * 32, VOCAB - 16384)]
    batched = generate(llm, REQUESTS)
    assert_trainer_bits(model, REQUESTS, batched, logprobs)
    assert {t >= 16384 for tokens, _, _ in batched for t in tokens} == {False, True}, "tokens of both segments"
    alone = generate(llm, [REQUESTS[1]])
    assert_trainer_bits(model, REQUESTS[1:2], alone, logprobs)
    assert alone[0][0] == batched[1][0] and torch.equal(bits(alone[0][1]), bits(batched[1][1]))


def test_negative_control_float_sum_of_tp2_partials_differs(case):
    """The comparison above would see a row-parallel layer whose two workers' partial products were added in
    float (what a float all_reduce does): for this model's dense down_proj weights (as float32) and random
    activations, linear(x, W) differs from linear(x[:, :K/2], W[:, :K/2]) + linear(x[:, K/2:], W[:, K/2:])."""
    _, _, model, _ = case
    torch.manual_seed(0)
    weight = model.model.layers[0].mlp.down_proj.weight.detach().float()
    x = torch.randn(64, weight.shape[1])
    half = weight.shape[1] // 2
    whole = ops.linear(x, weight)
    partials = ops.linear(x[:, :half], weight[:, :half]) + ops.linear(x[:, half:], weight[:, half:])
    assert not torch.equal(bits(whole), bits(partials))


@pytest.mark.parametrize("parallel, config, match", [
    (dict(tensor_parallel_size=1, pipeline_parallel_size=2), {}, r"pipeline_parallel_size=2 \(the layers run"),
    (dict(tensor_parallel_size=2, enable_expert_parallel=True), {}, r"enable_expert_parallel \(experts are replicated"),
    (dict(tensor_parallel_size=3), {}, r"tensor_parallel_size=3 .*num_attention_heads = 4 is not a multiple"),
    (dict(tensor_parallel_size=2), dict(tie_word_embeddings=True), r"tensor_parallel_size=2 .*tie_word_embeddings"),
], ids=["pipeline", "expert-parallel", "heads", "tied"])
def test_settings_tensor_parallelism_cannot_serve_are_refused(parallel, config, match):
    """The model refuses, naming the setting, before it builds anything (no engine needed)."""
    import transformers
    config_class, _, settings = CONFIGS["qwen3"]
    parallel = SimpleNamespace(**dict(dict(tensor_parallel_size=1, pipeline_parallel_size=1,
                                           enable_expert_parallel=False), **parallel))
    vllm_config = SimpleNamespace(parallel_config=parallel, lora_config=None, speculative_config=None,
                                  model_config=SimpleNamespace(quantization=None, hf_config=getattr(
                                      transformers, config_class)(**dict(settings, **config))))
    with pytest.raises(ValueError, match=match):
        BitparityQwen3ForCausalLM(vllm_config=vllm_config)
