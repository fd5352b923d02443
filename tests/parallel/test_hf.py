"""bitparity.parallel.shard_model and `rl-check --tp/--ep` (spec 31.5) on gloo over 127.0.0.1: a patched Qwen3
(grouped-query: 4 query heads, 2 key/value heads) and Qwen3-MoE (grouped-query, a dense layer, 8 experts) sharded
at TP 2, EP 2, TP 2 x EP 2 and TP 4 (where each key/value head is replicated on two ranks) give one process's
log-probabilities, loss of forward(labels=...) (vocab-parallel), clipped gradients, gradient norm and weights after
an AdamW step, bit for bit; the parent computes the single-process step. Negative control: the gradient norm from a
float all_reduce of each rank's sum of squares (Megatron's clip) is other bits. Bad sharding: the same error on
every rank."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from bitparity import ops, optim
from bitparity.models import hf_policy
from bitparity.parallel import hf as parallel_hf
from bitparity.rl.train import weights_digest
from tests.parallel import world

pytest.importorskip("transformers")

# `rl-check --model qwen3 --steps 1` on one process, seed 0 (check.train_check with world_size 1, tp 1, ep 1; cpu
# and numpy alike): the weights digest after one update, which the TP run must print.
QWEN3_ONE_STEP = "8871263e9ec7c71deecdb90b5a3dee6fcf12c6b9d8fca850f184b1796fd9db91"


def _batch():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 4096, (2, 16), generator=g)
    return tokens, torch.tensor([16, 11])


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.int32).numpy().tobytes())
    return h.hexdigest()


def _update(name, tp_group=None, ep_group=None, control=None):
    """One training step of the policy on _batch(): (log-prob bits, the loss of HF's forward(labels=...), gradient
    norm bits, digest of the clipped gradients gathered whole, weights digest after AdamW). control: a group over which to all_reduce the float
    sums of squares instead (the negative control's norm, also returned)."""
    policy = hf_policy.HFPolicy(hf_policy.builtin(name), 0, "cpu")
    if tp_group is not None or ep_group is not None:
        parallel_hf.shard_policy(policy, tp_group=tp_group, ep_group=ep_group)
    tokens, lengths = _batch()
    with torch.no_grad():
        loss = policy.model(input_ids=tokens, labels=tokens).loss
    logits, _, _, _ = policy.prefill(tokens, lengths)
    logp = parallel_hf.token_logprobs(policy, logits[:, :-1], tokens[:, 1:], temperature=0.7, backend="cpu")
    logp.backward(torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape))
    params = [p for p in policy.parameters() if p.grad is not None]
    naive = None
    if control is not None:
        # Megatron's clip: each rank's sum of squares of its shards (replicated tensors on rank 0 only), summed by
        # a float all_reduce whose order is the collective's.
        mine = [ops.sum((p.grad * p.grad).reshape(1, -1), backend="cpu").reshape(1) for p in params
                if p.grad.numel() and (hasattr(p, parallel_hf._LAYOUT) or dist.get_rank(control) == 0)]
        total = ops.sum(torch.cat(mine), backend="cpu")
        dist.all_reduce(total, group=control)
        naive = np.float32(optim.sqrt32(np.float32(float(total)))).view(np.int32)
    norm = parallel_hf.clip_grad_norm_(params, 1.0, backend="cpu")
    grads = _digest(parallel_hf.full(p, grad=True) for p in params)
    optim.AdamW(params, lr=1e-3, weight_decay=0.0, backend="cpu").step()
    return {"logp": logp.detach().view(torch.int32).numpy(), "loss": loss.view(torch.int32).item(),
            "norm": norm.view(torch.int32).item(), "grads": grads,
            "weights": weights_digest(policy), "naive": naive}


def _meta_model(**changes):
    import transformers

    from bitparity import hf
    config = hf_policy.builtin("qwen3").hf_config()
    for key, value in changes.items():
        setattr(config, key, value)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    return hf.patch(model)


def _four_ranks(rank, size):
    """Every check on one world of 4 ranks (spawning a world costs seconds per rank)."""
    torch.set_num_threads(1)          # the ranks share the cores: several ranks' spinning intra-op threads compete
    out = {}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]           # every rank creates every group, in order
    if rank < 2:
        out["qwen3 tp2"] = _update("qwen3", tp_group=pairs[0])
    else:
        out["qwen3_moe ep2"] = _update("qwen3_moe", ep_group=pairs[1])
    _, tp_group, ep_group = parallel_hf.process_groups(2, 2)
    out["qwen3_moe tp2 ep2"] = _update("qwen3_moe", tp_group=tp_group, ep_group=ep_group)
    out["qwen3 tp4"] = _update("qwen3", tp_group=dist.group.WORLD, control=dist.group.WORLD)
    out["indivisible"] = world.outcome(lambda: parallel_hf.shard_model(_meta_model(num_attention_heads=6,
                                                                                 num_key_value_heads=6),
                                                                       tp_group=dist.group.WORLD))
    other = {"intermediate_size": 256} if rank == 3 else {}
    out["different"] = world.outcome(lambda: parallel_hf.shard_model(_meta_model(**other), tp_group=dist.group.WORLD))
    return out


@pytest.fixture(scope="module")
def four():
    return world.run(_four_ranks, 4, join_s=600)


@pytest.fixture(scope="module")
def single():
    return {name: _update(name) for name in ("qwen3", "qwen3_moe")}


@pytest.mark.parametrize("case", ["qwen3 tp2", "qwen3_moe ep2", "qwen3_moe tp2 ep2", "qwen3 tp4"])
def test_sharded_update_is_one_process(case, four, single):
    expected = single[case.split()[0]]
    ranks = [r for r in four if case in r]
    assert len(ranks) == {"qwen3 tp2": 2, "qwen3_moe ep2": 2}.get(case, 4)
    for got in (r[case] for r in ranks):
        assert np.array_equal(got["logp"], expected["logp"]) and got["loss"] == expected["loss"]
        assert got["norm"] == expected["norm"] and got["grads"] == expected["grads"]
        assert got["weights"] == expected["weights"]


def test_float_all_reduce_clip_is_not_one_process(four, single):
    """Negative control: the norm from a float all_reduce of per-rank sums of squares, at TP 4, is other bits."""
    assert all(r["qwen3 tp4"]["naive"] != single["qwen3"]["norm"] for r in four)


def test_bad_sharding_raises_the_same_error_on_every_rank(four):
    kind, message = four[0]["indivisible"]
    assert kind == "ValueError" and "config.num_attention_heads = 6" in message and "tensor-parallel size 4" in message
    kind, message = four[0]["different"]
    assert kind == "ValueError" and "the model must be the same on every rank of tp_group" in message
    assert "rank 3" in message
    assert all(r["indivisible"] == four[0]["indivisible"] and r["different"] == four[0]["different"] for r in four)


def test_rl_check_cli_tp2_prints_one_process_weights(tmp_path):
    """`bitparity rl-check --model qwen3 --tp 2 --steps 1` as a user runs it: rollout == trainer on every token
    and the single-process weights digest."""
    out = tmp_path / "rl.json"
    run = subprocess.run([sys.executable, "-m", "bitparity.cli", "rl-check", "--model", "qwen3", "--tp", "2",
                          "--steps", "1", "--backend", "cpu", "--json", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["tp"] == 2 and doc["ep"] == 1 and doc["consistent"]
    row = doc["per_step"][0]
    assert row["logprob"]["bitwise_equal"] == row["logprob"]["tokens"] and row["logprob"]["max_abs_diff"] == 0.0
    assert doc["weights_digest"] == QWEN3_ONE_STEP
    assert "tensor-parallel 2" in run.stdout


@pytest.mark.parametrize("argv,words", [
    (["--tp", "3", "--model", "qwen3"], "--tp must be 1, 2, 4 or 8"),
    (["--tp", "2"], "--tp and --ep shard a Hugging Face model"),
    (["--model", "qwen3", "--ep", "2"], "expert parallelism (size 2) needs a Qwen3-MoE model"),
    (["--model", "qwen3", "--tp", "8"], "config.num_attention_heads = 4 is not a multiple of the tensor-parallel size 8"),
    (["--model", "qwen3", "--tp", "2", "--native"], "--native and --backend native compare one process's weights"),
])
def test_bad_tp_ep_exit_2_before_any_rank_starts(argv, words, capsys):
    from bitparity import cli
    assert cli.main(["rl-check", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bitparity rl-check: ") and words in err and err.count("\n") == 1, err
