"""The plugin under vLLM's preemption and an RL weight sync: one Qwen3-MoE engine in bfloat16 whose KV cache
has only 10 blocks of 32 tokens, so that four running requests of up to 124 tokens cannot all keep their
blocks and vLLM preempts some (frees their blocks and later recomputes them from position 0); every request
still gets the trainer's tokens and log-probs. Then new weights are loaded into the running engine through
the model's load_weights by HF's in-memory names (the fused expert tensors) and the prefix cache is reset:
the same requests give the new model's bits."""

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from .engines import (assert_trainer_bits, close, engine, generate, model_class, reference,  # noqa: E402
                      save_checkpoint)

KIND, DTYPE = "qwen3_moe", "bfloat16"


def _requests():
    rng = np.random.Generator(np.random.PCG64(11))
    kinds = [dict(temperature=0.0), dict(temperature=0.8, seed=5), dict(temperature=1.0, top_k=30, top_p=0.8, seed=9)]
    return [(tuple(int(t) for t in rng.integers(0, 512, int(rng.integers(30, 61)))),
             SamplingParams(max_tokens=64, logprobs=0, **kinds[i % 3])) for i in range(6)]


REQUESTS = _requests()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = save_checkpoint(KIND, tmp_path_factory.mktemp("old"))
    new_path = save_checkpoint(KIND, tmp_path_factory.mktemp("new"), seed=1)
    llm = engine(path, KIND, DTYPE, logprobs_mode="processed_logprobs", num_gpu_blocks_override=10,
                 disable_log_stats=False)
    yield llm, reference(path, KIND, DTYPE), reference(new_path, KIND, DTYPE)
    close(llm)


def _preemptions(llm):
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def test_preempted_requests_give_the_trainer_bits(setup):
    llm, model, _ = setup
    assert model_class(llm) == "BitparityQwen3MoeForCausalLM"
    before = _preemptions(llm)
    results = generate(llm, REQUESTS)
    assert _preemptions(llm) > before, "the engine preempted no request: the test would not test preemption"
    assert [len(tokens) for tokens, _, _ in results] == [64] * len(REQUESTS)
    assert_trainer_bits(model, REQUESTS, results, "processed")


def test_weight_sync_gives_the_new_weights_bits(setup):
    llm, old_model, new_model = setup
    requests = [(prompt, params.clone()) for prompt, params in REQUESTS[:3]]
    for _, params in requests:
        params.max_tokens = 12
    old = generate(llm, requests)
    weights = [(name, p.detach().clone()) for name, p in new_model.named_parameters()]
    assert any(name.endswith("experts.gate_up_proj") for name, _ in weights)
    loaded = llm.apply_model(lambda model: model.load_weights(weights))[0]
    assert loaded == {name for name, _ in weights}
    llm.reset_prefix_cache()
    new = generate(llm, requests)
    assert_trainer_bits(new_model, requests, new, "processed")
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(old, new)), "the sync changed no log-prob"
    # and back: the old checkpoint's tensors give the old bits again
    weights = [(name, p.detach().clone()) for name, p in old_model.named_parameters()]
    llm.apply_model(lambda model: model.load_weights(weights))
    llm.reset_prefix_cache()
    assert_trainer_bits(old_model, requests, generate(llm, requests), "processed")
