"""The negative control of test_trl_vllm: stock TRL 1.16 (trl.GRPOTrainer, HF's model, its fused head) with
stock vLLM (vLLM's own Qwen3 and sampler: BITPARITY_VLLM unset, no hf_overrides) in the same colocate mode, on
the same kind of checkpoint: TRL's logged mismatch between vLLM's log-probs and the trainer's is not 0.

TRL's weight sync cannot run on stock vLLM on this CPU (vLLM's CPU linears are prepacked and lose their
weight_loader, so load_weights raises AttributeError: /work/shared/notes-trl.md), so the sync is skipped and the
run is one step: the engine loaded the checkpoint the trainer starts from, so the weights are equal. TRL's engine
arguments get enforce_eager=True (vLLM's own model and sampler either way; compiling them takes about a minute
here). Its own module, so that its engine is the only one it starts. Skipped without TRL or vLLM."""

import os

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("vllm")

import transformers  # noqa: E402
import trl  # noqa: E402
from trl.generation import vllm_generation  # noqa: E402

from bitparity.vllm import plugin  # noqa: E402

from .test_trl_vllm import VLLM_ENVIRONMENT, colocate_config  # noqa: E402
from .trl_runs import dataset, logged, reward_low_words, save_checkpoint  # noqa: E402


def test_stock_trl_with_stock_vllm_shows_a_mismatch(tmp_path_factory, monkeypatch):
    engine = vllm_generation.LLM
    monkeypatch.setattr(vllm_generation, "LLM", lambda **options: engine(**options, enforce_eager=True))
    environment = dict(os.environ)
    os.environ.update(VLLM_ENVIRONMENT, VLLM_CACHE_ROOT=str(tmp_path_factory.mktemp("vllm-cache")),
                      TRL_EXPERIMENTAL_SILENCE="1")
    os.environ.pop(plugin.TAKEOVER_ENV, None)
    path = save_checkpoint(tmp_path_factory.mktemp("qwen3"))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    trainer = trl.GRPOTrainer(model, reward_low_words, colocate_config(tmp_path_factory.mktemp("out"), max_steps=1),
                              train_dataset=dataset(),
                              processing_class=transformers.AutoTokenizer.from_pretrained(path))
    try:
        assert trainer.vllm_generation.llm.apply_model(lambda m: type(m).__name__) == ["Qwen3ForCausalLM"]
        trainer.vllm_generation.sync_weights = lambda: None
        trainer.train()
    finally:
        trainer.vllm_generation.llm.llm_engine.engine_core.shutdown()
        os.environ.clear()
        os.environ.update(environment)
    [mismatch] = logged(trainer, "sampling/sampling_logp_difference/max")
    [low], [high] = logged(trainer, "sampling/importance_sampling_ratio/min"), \
        logged(trainer, "sampling/importance_sampling_ratio/max")
    assert mismatch > 0 and (low, high) != (1.0, 1.0), (mismatch, low, high)
