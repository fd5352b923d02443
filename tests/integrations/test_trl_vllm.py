"""TRL 1.16's GRPOTrainer (bitparity.integrations.trl) with use_vllm=True in TRL's colocate mode: TRL's own
in-process vLLM engine runs the bitparity plugin's model (BITPARITY_VLLM=1), TRL syncs the trained weights
into it with load_weights before each generation, and TRL's importance-sampling correction compares vLLM's
processed log-probs with the trainer's: equal in bits, so the IS ratio is exactly 1 and the logged mismatch 0,
also after the weights moved. One engine (about 30 s to start on this CPU). Skipped without TRL or vLLM."""

import os

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("vllm")

import transformers  # noqa: E402
from vllm import ModelRegistry  # noqa: E402

import bitparity  # noqa: E402
from bitparity.integrations import trl as bp_trl  # noqa: E402
from bitparity.vllm import plugin  # noqa: E402

from .trl_runs import bits, config, dataset, logged, reward_low_words, save_checkpoint, spy_on_loss  # noqa: E402

VLLM_ENVIRONMENT = dict(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")


def colocate_config(out, **settings):
    return config(out, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=64, **settings)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One training run, 4 steps: generations at steps 0 and 2, each preceded by TRL's weight sync. The policy
    is bfloat16: TRL's engine takes dtype 'auto', which runs a checkpoint in bfloat16 on this CPU."""
    environment = dict(os.environ)              # TRL's colocate mode also sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    saved = {name: ModelRegistry.models[name] for name in plugin.ARCHITECTURES.values()}
    os.environ.update(VLLM_ENVIRONMENT, VLLM_CACHE_ROOT=str(tmp_path_factory.mktemp("vllm-cache")),
                      TRL_EXPERIMENTAL_SILENCE="1", **{plugin.TAKEOVER_ENV: "1"})
    plugin.register()
    path = save_checkpoint(tmp_path_factory.mktemp("qwen3"))
    model = bitparity.patch(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16))
    trainer = bp_trl.GRPOTrainer(model, reward_low_words, colocate_config(tmp_path_factory.mktemp("out")),
                                 train_dataset=dataset(),
                                 processing_class=transformers.AutoTokenizer.from_pretrained(path))
    try:
        spy_on_loss(trainer)
        trainer.train()
        yield trainer
    finally:
        trainer.vllm_generation.llm.llm_engine.engine_core.shutdown()
        ModelRegistry.models.update(saved)
        os.environ.clear()
        os.environ.update(environment)


def test_trls_engine_runs_the_plugin(run):
    assert run.vllm_generation.llm.apply_model(lambda model: type(model).__name__) == ["BitparityQwen3ForCausalLM"]


def test_rollout_log_probs_are_the_trainers_bits(run):
    steps = {r["step"]: r for r in run.records}
    assert sorted(steps) == [0, 1, 2, 3]
    for step, r in steps.items():
        m = r["mask"]
        rollout, old, new = r["sampling_per_token_logps"], r["old_per_token_logps"], r["new"]
        assert rollout.dtype == old.dtype == torch.float32 and int(m.sum()) > 0
        differ = int((bits(rollout)[m] != bits(old)[m]).sum())
        assert differ == 0, f"step {step}: {differ} of vLLM's log-probs differ from the trainer's"
        assert torch.equal(r["importance_sampling_ratio"], torch.ones_like(r["importance_sampling_ratio"]))
        moved = int((bits(old)[m] != bits(new)[m]).sum())
        # the loss pass at steps 1 and 3 runs after an optimizer step: the control that bits can differ here
        assert (moved == 0) == (step in (0, 2)), f"step {step}: {moved} loss log-probs differ from the old ones"


def test_trls_logged_mismatch_is_zero(run):
    assert logged(run, "sampling/sampling_logp_difference/max") == [0.0, 0.0]
    for key in ("min", "mean", "max"):
        assert logged(run, f"sampling/importance_sampling_ratio/{key}") == [1.0, 1.0]
