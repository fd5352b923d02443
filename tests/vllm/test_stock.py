"""The negative control and the plugin's selection without hf_overrides, on one tiny Qwen3 float32 checkpoint:

- vLLM's own model (no hf_overrides, BITPARITY_VLLM unset) on the same weights runs vLLM's class and sampler
  and does not give the patched model's log-probs;
- with BITPARITY_VLLM=1 the plugin serves the stock architecture name, so `LLM(model=path)` as a framework
  builds it runs bitparity's model and gives the trainer's bits; what it does not support it refuses.

Two engines, one after the other (the second starts in seconds: vLLM is imported and warm)."""

import shutil

import numpy as np
import pytest

pytest.importorskip("vllm")

from vllm import ModelRegistry, SamplingParams  # noqa: E402

from bitparity.vllm import plugin  # noqa: E402

from .engines import (assert_trainer_bits, bits, close, engine, generate, model_class, reference,  # noqa: E402
                      save_checkpoint, trainer_side)

KIND, DTYPE = "qwen3", "float32"
RNG = np.random.Generator(np.random.PCG64(3))
# greedy only: the stock engine crashes on a seeded request whose prompt is chunked (vLLM's CPU generator bug)
GREEDY = [(tuple(int(t) for t in RNG.integers(0, 512, n)), SamplingParams(max_tokens=8, temperature=0.0, logprobs=0))
          for n in (6, 45, 90, 20)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = save_checkpoint(KIND, tmp_path_factory.mktemp(KIND))
    return path, reference(path, KIND, DTYPE)


def test_stock_vllm_does_not_give_the_trainer_bits(checkpoint):
    path, model = checkpoint
    llm = engine(path, KIND, DTYPE, plugin=False)
    try:
        assert model_class(llm) == "Qwen3ForCausalLM"
        results = generate(llm, GREEDY)
    finally:
        close(llm)
    equal = total = 0
    for (prompt, params), (tokens, logprobs, _) in zip(GREEDY, results):
        _, expected, _ = trainer_side(model, prompt, tokens, params, "raw")
        equal += int((bits(logprobs) == bits(expected)).sum())
        total += len(tokens)
    assert equal < total, "stock vLLM gave the patched model's bits: this control cannot tell the plugin from it"


@pytest.fixture
def takeover(monkeypatch):
    """BITPARITY_VLLM=1 and the plugin registered again, as vLLM's processes would start with it; vLLM's own
    registrations of the three names restored afterwards."""
    saved = {name: ModelRegistry.models[name] for name in plugin.ARCHITECTURES.values()}
    monkeypatch.setenv(plugin.TAKEOVER_ENV, "1")
    plugin.register()
    yield
    ModelRegistry.models.update(saved)


def test_bitparity_vllm_1_serves_the_stock_name(checkpoint, takeover, tmp_path):
    path, model = checkpoint
    # a copy: vLLM caches the class it resolved per checkpoint path and architecture name for the process
    path = str(shutil.copytree(path, tmp_path / "copy"))
    seeded = [(prompt, SamplingParams(max_tokens=8, temperature=0.8, seed=i, logprobs=0))
              for i, (prompt, _) in enumerate(GREEDY)]
    llm = engine(path, KIND, DTYPE, plugin=False)
    try:
        assert model_class(llm) == "BitparityQwen3ForCausalLM"
        requests = GREEDY + seeded
        assert_trainer_bits(model, requests, generate(llm, requests), "raw")
        with pytest.raises(ValueError, match="penalties"):
            generate(llm, [(GREEDY[0][0], SamplingParams(max_tokens=2, repetition_penalty=1.2))])
    finally:
        close(llm)


def test_takeover_setting_is_checked(monkeypatch):
    monkeypatch.setenv(plugin.TAKEOVER_ENV, "yes")
    with pytest.raises(ValueError, match="BITPARITY_VLLM must be 1"):
        plugin.takes_over()
