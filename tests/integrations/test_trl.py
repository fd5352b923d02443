"""TRL 1.16's GRPOTrainer through bitparity.integrations.trl with HF generate (hf_rollout), on a tiny Qwen3 on the
CPU: the log-probs TRL's loss compares come from the patched model's lm_head and bitparity.token_logprobs, are
equal in bits at unchanged weights (ratio exactly 1) and equal the rollout's; the reference model is patched;
settings that leave the canonical path are refused; the same run gives the same weights on cpu and ascend.
Controls: stock TRL on the same patched model never calls the patched lm_head in its log-prob passes; the
native backend's run ends on other weights. Skipped without TRL."""

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

import transformers  # noqa: E402
import trl  # noqa: E402
from trl.trainer import utils as trl_utils  # noqa: E402

import bitparity  # noqa: E402
from bitparity import ops  # noqa: E402
from bitparity.integrations import trl as bp_trl  # noqa: E402

from .trl_runs import (bits, config, dataset, logged, reward_low_words, save_checkpoint, spy_on_loss,  # noqa: E402
                       weights_digest)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(autouse=True)
def silence_experimental(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")       # rollout_func's warning


def policy(path, dtype=torch.float32):
    return bitparity.patch(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype))


def trainer(path, out, model=None, cls=bp_trl.GRPOTrainer, **settings):
    model = policy(path) if model is None else model
    extra = dict(rollout_func=bp_trl.hf_rollout) if cls is bp_trl.GRPOTrainer else {}
    return cls(model, reward_low_words, config(out, **settings), train_dataset=dataset(),
               processing_class=transformers.AutoTokenizer.from_pretrained(path), **extra)


class Counting:
    """Counts, while TRL's log-prob method runs (old, reference and loss passes; not generation), calls of the
    policy's and the reference's lm_head, of bitparity.token_logprobs and of TRL's fused-head function."""

    def __init__(self, run, monkeypatch):
        self.inside, self.counts = False, dict(lm_head=0, ref_lm_head=0, token_logprobs=0, fused_head=0)
        logps = run._get_per_token_logps_and_entropies

        def counted_logps(*args, **kwargs):
            self.inside = True
            try:
                return logps(*args, **kwargs)
            finally:
                self.inside = False

        run._get_per_token_logps_and_entropies = counted_logps
        run.model.lm_head.register_forward_hook(lambda *_: self.count("lm_head"))
        if run.ref_model is not None:
            run.ref_model.lm_head.register_forward_hook(lambda *_: self.count("ref_lm_head"))
        token_logprobs, fused = ops.token_logprobs, trl_utils._ChunkedLogProbFunction

        def counted_token_logprobs(*args, **kwargs):
            self.count("token_logprobs")
            return token_logprobs(*args, **kwargs)

        class CountedFused:
            @staticmethod
            def apply(*args):
                self.count("fused_head")
                return fused.apply(*args)

        monkeypatch.setattr(ops, "token_logprobs", counted_token_logprobs)
        monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", CountedFused)

    def count(self, name):
        self.counts[name] += self.inside


def test_log_probs_are_bitparitys_and_the_ratio_is_exactly_one(checkpoint, tmp_path, monkeypatch):
    """beta > 0: TRL builds the reference from the path; it is patched like the policy, and at step 0 (equal
    weights) its log-probs are the policy's bits, so TRL's logged kl is 0 for the right reason."""
    run = trainer(checkpoint, tmp_path, beta=0.04)
    assert isinstance(run.ref_model.lm_head, bitparity.hf.Linear)
    assert all(isinstance(layer.self_attn, bitparity.hf.Attention) for layer in run.ref_model.model.layers)
    counting = Counting(run, monkeypatch)
    spy_on_loss(run)
    run.train()
    c = counting.counts
    # 2 generations x (old: 2 chunks of 2 rows + reference: 2 chunks) + 4 loss passes
    assert c["lm_head"] == 8 and c["ref_lm_head"] == 4 and c["token_logprobs"] == 12 and c["fused_head"] == 0, c
    steps = {r["step"]: r for r in run.records}
    assert sorted(steps) == [0, 1, 2, 3]
    for step, r in steps.items():
        m = r["mask"]
        differ = int((bits(r["old_per_token_logps"])[m] != bits(r["new"])[m]).sum())
        if step in (0, 2):      # the weights that computed the old log-probs: ratio exp(new - old) = 1 exactly
            assert differ == 0, f"step {step}: {differ} old log-probs differ from the loss pass's"
            assert torch.equal(bits(r["sampling_per_token_logps"])[m], bits(r["new"])[m])
        else:                   # after an optimizer step: the control that these comparisons can fail
            assert differ > 0, f"step {step}: the weights did not move"
    assert logged(run, "bitparity/rollout_logp_difference/max") == [0.0, 0.0]
    assert logged(run, "kl")[0] == 0.0


def test_stock_trl_bypasses_the_patched_head(checkpoint, tmp_path, monkeypatch):
    """The control for the counters: TRL's own GRPOTrainer on the same patched model computes every log-prob with
    its fused head, never the patched lm_head or token_logprobs."""
    run = trainer(checkpoint, tmp_path, cls=trl.GRPOTrainer, max_steps=1)
    counting = Counting(run, monkeypatch)
    run.train()
    assert counting.counts["lm_head"] == counting.counts["token_logprobs"] == 0
    assert counting.counts["fused_head"] > 0


def test_same_weights_on_cpu_and_ascend(checkpoint, tmp_path):
    """Three steps (generations at steps 0 and 2, an optimizer step after each) from the same seed: the weights'
    digest is the same on the C backend and the Ascend C kernels (host emulation); torch's own ops (native) end
    elsewhere."""
    digests = {}
    for name in ("cpu", "ascend", "native"):
        with bitparity.use_backend(name):
            run = trainer(checkpoint, tmp_path / name, max_steps=3)
            run.train()
        digests[name] = weights_digest(run.model)
    assert digests["cpu"] == digests["ascend"]
    assert digests["native"] != digests["cpu"]


@pytest.mark.parametrize("settings, match", [
    (dict(bf16=True), r"args.bf16=True runs the forward under torch.autocast"),
    (dict(cast_lm_head_to_fp32=True), "args.cast_lm_head_to_fp32=True replaces lm_head's forward"),
    (dict(use_liger_kernel=True), "args.use_liger_kernel=True"),
    (dict(use_transformers_continuous_batching=True), "args.use_transformers_continuous_batching=True"),
    (dict(model_init_kwargs={"use_kernels": True}), r"args.model_init_kwargs\['use_kernels'\]=True"),
    (dict(use_vllm=True, vllm_mode="server"), "args.vllm_mode='server': only 'colocate'"),
    (dict(use_vllm=True, vllm_model_impl="transformers"), "args.vllm_model_impl='transformers'"),
    (dict(use_vllm=True), "args.use_vllm=True needs BITPARITY_VLLM=1"),
])
def test_settings_off_the_canonical_path_are_refused(checkpoint, tmp_path, monkeypatch, settings, match):
    monkeypatch.delenv("BITPARITY_VLLM", raising=False)
    model = policy(checkpoint)
    with pytest.raises(ValueError, match=match):
        trainer(checkpoint, tmp_path, model=model, **settings)


def test_an_unpatched_policy_is_refused(checkpoint, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    with pytest.raises(TypeError, match="model must be a model patched by bitparity.patch"):
        trainer(checkpoint, tmp_path, model=model)
    with pytest.raises(TypeError, match="args must be a trl.GRPOConfig"):
        bp_trl.GRPOTrainer(policy(checkpoint), reward_low_words, None)


def test_docs_recipe_runs(checkpoint, tmp_path):
    """docs/integrations.md's TRL recipe, as written, with its two free names bound; its asserts are its claims."""
    section = DOCS.read_text().split("**TRL** (1.16.0", 1)[1].split("**OpenRLHF**", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, str(DOCS), "exec"), {"path": checkpoint, "output_dir": str(tmp_path)})


def test_hf_rollout_cuts_each_completion_after_its_eos(checkpoint, tmp_path):
    """The token row 0 draws third made the EOS: row 0 stops there (EOS kept, its log-prob too), and every row's
    tokens and log-probs are the first call's (the seeds depend on the step and the row only)."""
    run = trainer(checkpoint, tmp_path)
    prompts = ["w1 w2 w3", "w1 w2 w3", "w4 w5", "w4 w5"]
    first = bp_trl.hf_rollout(prompts, run)
    tokens = first["completion_ids"][0]
    eos = next(t for j, t in enumerate(tokens) if j >= 2 and t not in tokens[:j])
    cut = tokens.index(eos) + 1
    run.eos_token_ids = [eos]
    second = bp_trl.hf_rollout(prompts, run)
    assert second["prompt_ids"] == first["prompt_ids"]
    for row, (ids, logps) in enumerate(zip(second["completion_ids"], second["logprobs"])):
        ends = [j for j, t in enumerate(first["completion_ids"][row]) if t == eos]
        n = ends[0] + 1 if ends else len(first["completion_ids"][row])
        assert ids == first["completion_ids"][row][:n] and logps == first["logprobs"][row][:n]
    assert len(second["completion_ids"][0]) == cut < len(tokens)
