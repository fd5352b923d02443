"""Train-inference consistency over a whole RL step (spec §25): the trainer's recomputed log-probs and values
equal the rollout's bit for bit (logdiff exactly 0.0, PPO ratio exactly 1), for several seeds, rollout batch
schedules and trainer orders, paddings and micro-batches; and every canonical backend gives numpy's step.

The default model runs on numpy, cpu and the Ascend emulation; the Triton interpreter (cuda) runs a small one
with at most 3 new tokens per request, in the cross-backend test, which runs the small model everywhere
(`bitparity rl-check --backend cuda` runs the default model: 44 s here)."""

import dataclasses

import pytest
import torch

from bitparity.compare.metrics import canonical_bits
from bitparity.models import ModelConfig, TinyMoEPolicy
from bitparity.rl import Request, TrainerLayout, default_requests, digest, rl_step, rollout
from tests.conftest import implementing
from tests.models.test_tiny_moe import SMALL

RL_BACKENDS = ("numpy", "cpu", "cuda", "ascend")
FULL_SIZE = ("numpy", "cpu", "ascend")
# (seed, requests, max batch, trainer layout): staggered joins with a cap of 3, a cap of 1 (no batching), and
# everything at once; trainer in reverse order, a shuffled order with wide padding, and one sequence at a time.
CASES = [
    (0, 4, 3, TrainerLayout(micro_batch=3)),
    (11, 5, 1, TrainerLayout(order=(2, 0, 4, 1, 3), pad_extra=17, micro_batch=2)),
    (12345, 7, 7, TrainerLayout(order=tuple(range(7)), pad_extra=0, micro_batch=1)),
]


def _step(backend, config, seed, count, max_batch, layout):
    policy, reference = TinyMoEPolicy(config, seed, backend), TinyMoEPolicy(config, seed + 1, backend)
    requests = default_requests(seed, count, vocab=config.vocab)
    if config != ModelConfig():
        requests = [dataclasses.replace(r, max_new_tokens=min(r.max_new_tokens, 3)) for r in requests]
    done = rollout(policy, requests, max_batch=max_batch, temperature=0.7)
    return done, rl_step(policy, reference, done, layout)


# cuda is not among these: in the interpreter the three cases took 2 minutes of CI. Its whole step (rollout and
# trainer log-probs, values, advantages, loss) is checked equal to numpy's below, and numpy's rollout equals its
# trainer here; `bitparity rl-check --backend cuda` runs the full-size step.
@pytest.mark.parametrize("backend,case", [(b, c) for b in implementing("attention", FULL_SIZE) for c in CASES])
def test_rollout_and_trainer_agree_bit_for_bit(backend, case):
    seed, count, max_batch, layout = case
    _, result = _step(backend, ModelConfig(), seed, count, max_batch, layout)
    m = result.mask
    assert float((result.logp_train - result.logp_rollout)[m].abs().max()) == 0.0
    assert torch.equal(canonical_bits(result.logp_train)[m], canonical_bits(result.logp_rollout)[m])
    assert torch.equal(canonical_bits(result.values_train)[m], canonical_bits(result.values_rollout)[m])
    assert bool((result.ratio[m] == 1.0).all()) and float(result.clip_fraction) == 0.0
    assert bool(torch.isfinite(result.logp_rollout[m]).all()) and bool((result.logp_rollout[m] < 0).all())


@pytest.fixture(scope="module")
def numpy_step():
    """numpy's step on the small model: all requests at once, trainer in one batch."""
    return _step("numpy", SMALL, 5, 4, 4, TrainerLayout(order=tuple(range(4)), pad_extra=0, micro_batch=None))[1]


@pytest.mark.parametrize("backend", implementing("attention", RL_BACKENDS))
def test_every_backend_gives_numpys_step(backend, numpy_step):
    # Another schedule and trainer layout on purpose: none of them may change a bit (numpy against itself
    # checks exactly that).
    _, result = _step(backend, SMALL, 5, 4, 2, TrainerLayout(micro_batch=3, pad_extra=5))
    for field in dataclasses.fields(result):
        a, b = getattr(result, field.name), getattr(numpy_step, field.name)
        same = torch.equal(canonical_bits(a), canonical_bits(b)) if a.is_floating_point() else torch.equal(a, b)
        assert same, f"{backend}: {field.name} differs from numpy's"
    assert digest(result) == digest(numpy_step)


def test_a_one_ulp_change_changes_the_digest(numpy_step):
    nudged = dataclasses.replace(numpy_step, returns=numpy_step.returns.clone())
    nudged.returns.view(torch.int32)[0, 0] += 1
    assert digest(nudged) != digest(numpy_step)


def test_the_rewards_are_the_kl_penalty_plus_the_score_at_the_last_token(numpy_step):
    r = numpy_step
    lengths = r.mask.sum(dim=1)
    for b, n in enumerate(lengths.tolist()):
        kl = (r.logp_train[b, :n].double() - r.ref_logp[b, :n].double()) * -0.05
        expected = kl.clone()
        expected[n - 1] += float(r.scores[b])
        even = sum(int(t) % 2 == 0 for t in r.tokens[b, :n])
        assert float(r.scores[b]) == pytest.approx(even / n - 0.5, abs=1e-7)
        assert torch.allclose(r.rewards[b, :n].double(), expected, rtol=1e-6, atol=1e-7)


def test_requests_arriving_late_wait_for_their_step():
    model = TinyMoEPolicy(SMALL, seed=0)
    done = rollout(model, [Request((1, 2, 3), 2, 9, arrival=4), Request((5,), 3, 8)], max_batch=4, temperature=1.0)
    assert [s["prefill"] for s in done.steps[:5]] == [[1], [], [], [], [0]]
