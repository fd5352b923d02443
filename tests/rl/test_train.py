"""Multi-step RL through spec 29 (bitparity.rl.train): after every update the weights are the same bits on every
canonical backend and for every power-of-two micro-batch size, and the next rollout still equals the trainer."""

import functools

import pytest
import torch

from bitparity.models import ModelConfig, TinyMoEPolicy
from bitparity.rl.check import train_check
from bitparity.rl.rollout import default_requests
from bitparity.rl.train import UpdateSettings, train, weights_digest

SMALL = ModelConfig(vocab=256, hidden=32, layers=2, heads=2, head_dim=8, experts=4, top_k=2, expert_inter=16,
                    max_positions=64)
STEPS = 2


@functools.lru_cache(maxsize=None)
def _trained(backend, micro_batch=2, requests=5, steps=STEPS):
    """(weights digest after each step, per-step rollout == trainer, the final parameters) of a short run."""
    policy, reference = TinyMoEPolicy(SMALL, 0, backend), TinyMoEPolicy(SMALL, 1, backend)
    digests, consistent = [], []
    schedule = functools.partial(lambda count, step: default_requests(step, count=count, vocab=SMALL.vocab), requests)
    for _, _, result, _ in train(policy, reference, schedule, steps, 3, UpdateSettings(micro_batch=micro_batch)):
        digests.append(weights_digest(policy))
        logp = result.logp_train.view(torch.int32) == result.logp_rollout.view(torch.int32)
        consistent.append(bool(logp[result.mask].all()))
    return tuple(digests), tuple(consistent), [p.detach().clone() for p in policy.parameters()]


def test_weights_change_and_rollouts_stay_equal_to_the_trainer():
    digests, consistent, _ = _trained("numpy")
    assert all(consistent)
    assert len(set(digests)) == STEPS
    assert digests[0] != weights_digest(TinyMoEPolicy(SMALL, 0, "numpy"))


@pytest.mark.parametrize("micro_batch", [1, 4, 8])
def test_weights_do_not_depend_on_the_micro_batch(micro_batch):
    assert _trained("numpy", micro_batch)[0] == _trained("numpy")[0]


def test_same_weights_on_every_backend(backend):
    """One update on three requests: the Triton interpreter's small schedule."""
    assert _trained(backend, 2, 3, 1)[:2] == _trained("numpy", 2, 3, 1)[:2]


def test_native_training_drifts_from_the_canonical_weights():
    """The negative control: torch's own ops, AdamW and accumulation give other weights."""
    _, _, canonical = _trained("numpy")
    _, _, native = _trained("native")
    assert any(not torch.equal(a, b) for a, b in zip(canonical, native))


@functools.lru_cache(maxsize=None)
def _check(world_size):
    """One update (the data-parallel path runs from the first step on): 12 requests, 16 slots."""
    return train_check("cpu", 0, 1, world_size=world_size, config=SMALL)


@pytest.mark.parametrize("world_size", [2, 4])
def test_data_parallel_training_gives_one_process_weights(world_size):
    """Spec 28.1 on gloo over 127.0.0.1: with 4 ranks the last holds none of the 12 requests (16 slots)."""
    one, many = _check(1), _check(world_size)
    assert many["weights_digest"] == one["weights_digest"]
    assert [r["weights_digest"] for r in many["per_step"]] == [r["weights_digest"] for r in one["per_step"]]
    assert many["consistent"] and [r["loss"] for r in many["per_step"]] == [r["loss"] for r in one["per_step"]]
