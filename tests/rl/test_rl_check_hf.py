"""`bitparity rl-check --model NAME` / `--config FILE`: the RL step on unmodified Hugging Face models patched
onto bitparity ops (bitparity.models.hf_policy). `tiny` is TinyMoEPolicy as a Qwen3MoeForCausalLM and must
print spec §25.6's digest; GQA/MoE (qwen3_moe) and MQA (llama) give rollout == trainer, bit for bit, and one
digest on numpy, cpu and the Ascend emulation; torch's native ops do not; bad configs exit 2.

The digests of qwen3_moe and llama depend on the order of transformers' named_parameters() (the weights'
tensor numbers), which these architectures have kept through transformers 5.x."""

import json

import pytest
import torch

from bitparity import cli
from bitparity.models import hf_policy
from bitparity.rl import check

pytest.importorskip("transformers")

DIGESTS = {"qwen3_moe": "cf2cdc99c91151b4e41ca8b40781ab37c092307be82457f839bf138dc9ebfcf7",
           "llama": "53d2eb4631e56418b3c3422ad382c50d82cbe79f159e08dab7949fa3b9703ac2"}


def _run(tmp_path, capsys, *argv):
    out = tmp_path / "rl.json"
    rc = cli.main(["rl-check", *argv, "--json", str(out)])
    return rc, json.loads(out.read_text()), capsys.readouterr().out


def _bitwise(doc):
    return all(doc[k]["bitwise_equal"] == doc[k]["tokens"] and doc[k]["max_abs_diff"] == 0.0
               for k in ("logprob", "value"))


def test_model_tiny_is_tinymoepolicy_and_prints_the_published_digest(tmp_path, capsys):
    rc, doc, text = _run(tmp_path, capsys, "--model", "tiny", "--backend", "cpu")
    assert rc == 0 and doc["model"] == "tiny" and doc["config"]["architecture"] == "Qwen3MoeForCausalLM"
    assert doc["digest"] == check.PUBLISHED_DIGESTS[0] and doc["matches_published"] and _bitwise(doc)
    assert "spec §25.6's digest for seed 0: matches" in text and "model tiny: Qwen3MoeForCausalLM" in text


def test_gqa_moe_model_agrees_bitwise_on_every_backend(tmp_path, capsys):
    """qwen3_moe: GQA, a dense first layer and norm_topk_prob=False. (llama, one KV head, is run on cpu by the
    --config test below, against the same pinned digest numpy and ascend gave when it was pinned.)"""
    model, digests = "qwen3_moe", {}
    for backend in ("numpy", "cpu", "ascend"):
        rc, doc, text = _run(tmp_path, capsys, "--model", model, "--backend", backend)
        assert rc == 0 and doc["consistent"] and _bitwise(doc) and doc["ratio_exactly_one"], (backend, doc)
        assert doc["published_digest"] is None and doc["matches_published"] is None
        assert doc["requests"] == 12 and doc["logprob"]["tokens"] == 109
        digests[backend] = doc["digest"]
    assert set(digests.values()) == {DIGESTS[model]}, digests


def test_native_ops_are_the_negative_control(tmp_path, capsys):
    """The same patched model on torch's own ops: rollout and trainer disagree (exit 0: native is a baseline)."""
    rc, doc, _ = _run(tmp_path, capsys, "--model", "llama", "--backend", "native")
    assert rc == 0 and not doc["consistent"]
    assert doc["logprob"]["bitwise_equal"] < doc["logprob"]["tokens"] and doc["logprob"]["max_abs_diff"] > 0


def test_config_file_builds_the_same_model(tmp_path, capsys):
    """A config.json of the built-in llama (one KV head) gives --model llama's digest, rollout == trainer."""
    path = tmp_path / "config.json"
    spec = hf_policy.builtin("llama")
    path.write_text(json.dumps({"model_type": spec.model_type, **spec.config}))
    rc, doc, text = _run(tmp_path, capsys, "--config", str(path))
    assert rc == 0 and doc["digest"] == DIGESTS["llama"] and doc["config"]["source"] == str(path)
    assert doc["consistent"] and _bitwise(doc)
    assert f"--config {path}: LlamaForCausalLM" in text


def _llama(**changes):
    return {"model_type": "llama", **hf_policy.builtin("llama").config, **changes}


@pytest.mark.parametrize("content,words", [
    (None, ["cannot read"]),
    ("{not json", ["is not a JSON config"]),
    (json.dumps({"model_type": "gpt2"}), ["model_type must be one of", "'gpt2'"]),
    (json.dumps(_llama(vocab_size=1000)), ["vocab_size 1000 does not hold the requests' token ids"]),
    (json.dumps(_llama(max_position_embeddings=16)), ["max_position_embeddings 16 does not hold"]),
    (json.dumps(_llama(hidden_act="gelu")), ["hidden_act='gelu'"]),
], ids=["missing", "not-json", "gpt2", "small-vocab", "few-positions", "gelu"])
def test_bad_config_exits_2_with_one_line(content, words, tmp_path, capsys):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["rl-check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bitparity rl-check: ") and err.count("\n") == 1 and all(w in err for w in words), err


def test_model_and_config_must_agree(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama()))
    assert cli.main(["rl-check", "--model", "tiny", "--config", str(path)]) == 2
    assert "does not match --config's model_type llama" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["rl-check", "--model", "gpt2"])


def test_adapter_reads_hf_cache_heads_and_parameter_order():
    """The cache's heads are the KV heads; parameters() is HF's unpatched order, then the value head."""
    policy = hf_policy.HFPolicy(hf_policy.builtin("llama"), 0, "cpu")
    assert (policy.config.heads, policy.config.head_dim, policy.config.layers) == (1, 16, 2)
    names = [n for n, _ in policy.named_parameters()]
    assert names[0] == "model.embed_tokens.weight" and names[-2:] == ["lm_head.weight", "value_head"]
    assert len(list(policy.parameters())) == len(names) == len({id(p) for p in policy.model.parameters()}) + 1
    assert torch.equal(dict(policy.named_parameters())["value_head"],
                       hf_policy.uniform_weights(0, len(names) - 1, (1, 64), -3))


def test_steps_train_the_hf_model(tmp_path, capsys):
    """--steps 2 on llama: rollout == trainer at every step, and the weights digest numpy gives too (spec 2.0.0)
    (over HF's parameter order, then the value head)."""
    rc, doc, text = _run(tmp_path, capsys, "--model", "llama", "--steps", "2", "--backend", "cpu")
    assert rc == 0 and doc["consistent"] and [r["step"] for r in doc["per_step"]] == [0, 1]
    assert all(_bitwise(r) for r in doc["per_step"]) and doc["published_weights_digest"] is None
    assert doc["weights_digest"] == "0ad83724d11e0cd52731519e8e8e70b80c3eca98493767e548c8604c8a10f4a4"
    assert "model llama: LlamaForCausalLM" in text
