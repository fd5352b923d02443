"""Train-inference mismatch metrics that RL frameworks log, computed by canonical ops (spec 27.2), so two
platforms that see the same log-probabilities report the same numbers, bit for bit."""

import torch

from . import ops


def mismatch(train_logp, rollout_logp, mask, *, correction=None, backend=None):
    """Metrics of the trainer's against the rollout's log-probabilities of the sampled tokens, [B, T] each
    (float32, bfloat16 or float16; mask bool [B, T]), over the tokens where mask holds -> dict of 0-d float32
    tensors:

    - max_abs_logp_diff: max |train_logp - rollout_logp| (NaN if either holds NaN at a counted token; 0 for an
      empty mask);
    - mean_k3_kl: the masked mean of k3 = r - 1 - log r with r = pi_train / pi_rollout, the estimator of
      KL(pi_rollout || pi_train) from the rollout's samples;
    - frac_logp_differ: the fraction of tokens whose two log-probabilities differ (zero logdiff is 0.0);
    - frac_rejected (with correction, a dict of rollout_correction's keyword arguments): the fraction of
      tokens that correction would drop.

    backend is passed to the canonical ops they are computed by (kl_penalty, masked_mean, rollout_correction),
    so numpy, cpu, cuda and ascend give the same bits; native runs torch's ops. The metrics are logged numbers
    and carry no gradient, like ppo_policy_loss's clip fraction.
    """
    with torch.no_grad():
        ops._check_float_tensor("train_logp", train_logp, 2)
        ops._check_same_shape("rollout_logp", rollout_logp, "train_logp", train_logp)
        mask = ops._required_mask(mask, train_logp).reshape(train_logp.shape)
        diff = (train_logp.float() - rollout_logp.float()).abs()          # one rounding, then an exact sign clear
        counted = torch.where(mask, diff, 0.0)
        out = {
            # A maximum is the same in any order once NaN propagates (spec 4); |d| >= 0 so zeros are +0.0.
            "max_abs_logp_diff": counted.amax(),
            "mean_k3_kl": ops.masked_mean(ops.kl_penalty(rollout_logp, train_logp, "k3", backend=backend), mask,
                                          backend=backend),
            "frac_logp_differ": ops.masked_mean((train_logp != rollout_logp).float(), mask, backend=backend),
        }
        if correction is not None:
            _, keep = ops.rollout_correction(train_logp, rollout_logp, mask, backend=backend, **correction)
            out["frac_rejected"] = ops.masked_mean((~keep).float(), mask, backend=backend)
        return out
