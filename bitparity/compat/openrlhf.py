"""OpenRLHF's KL estimators, advantage normalisation, GAE and PPO policy loss (OpenRLHF 0.11.0:
openrlhf/models/utils.py, openrlhf/models/loss.py, openrlhf/trainer/ppo_utils/experience_maker.py), computed by
bitparity's canonical ops. docs/conventions.md lists the differences (empty masks; positions outside the mask)."""

import torch

from .. import ops
from ._common import check_mask

KL_ESTIMATORS = ("k1", "k2", "k3")


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    """With d = log_probs - log_probs_base: k1 = d, k2 = d^2 / 2, k3 = exp(-d) - 1 + d, each clamped to +-10."""
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {kl_estimator!r}")
    # bitparity's d is log_probs_base - log_probs: its k1 = -d, k2 and k3 are OpenRLHF's, bit for bit.
    return ops.kl_penalty(log_probs, log_probs_base, kl_estimator, clamp=10.0)


def masked_mean(tensor, mask, dim=None):
    """sum(tensor * mask) / mask.sum() (0 for an empty mask, where OpenRLHF gives NaN); mask None: the plain mean."""
    if mask is None:
        mask = torch.ones(tensor.shape, dtype=torch.bool, device=tensor.device)
    return ops.masked_mean(tensor, check_mask("mask", mask), dim)


def normalize_advantages(advantages, action_mask):
    """The experience maker's normalisation: (A - mean) * rsqrt(max(var, 1e-8)) over every counted token of
    the batch, biased variance."""
    return ops.masked_whiten(advantages, check_mask("action_mask", action_mask), unbiased=False, eps=1e-8,
                             eps_mode="clamp")


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """(advantages, returns): values and rewards times action_mask, the unmasked reverse GAE loop,
    returns = advantages + masked values."""
    return ops.gae(rewards, values, check_mask("action_mask", action_mask), gamma, lambd, mask_mode="zero")


class PolicyLoss(torch.nn.Module):
    """OpenRLHF's PPO policy loss: the log-ratio clamped to +-20, clip [1 - clip_eps_low, 1 + clip_eps_high], an
    optional dual clip (> 1) on negative advantages; the token mean (token_level_loss) or the mean over
    non-empty sequences of each sequence's token mean. forward -> (loss, clip_ratio, ppo_kl, vllm_kl); the loss
    is differentiable in log_probs, the other three are metrics and carry no gradient."""

    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True):
        super().__init__()
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.dual_clip, self.token_level_loss = dual_clip, token_level_loss

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = (torch.ones(log_probs.shape, dtype=torch.bool, device=log_probs.device) if action_mask is None
                else check_mask("action_mask", action_mask))
        loss, clip_ratio = ops.ppo_policy_loss(
            log_probs, old_log_probs.detach(), advantages.detach(), mask, clip_low=self.clip_eps_low,
            clip_high=self.clip_eps_high, dual_clip=self.dual_clip, ratio_clamp=20.0,
            agg="token-mean" if self.token_level_loss else "seq-mean-token-mean")
        with torch.no_grad():
            # k1 with d = log_probs - old: -d = old - log_probs, unclamped.
            ppo_kl = ops.masked_mean(ops.kl_penalty(old_log_probs, log_probs, "k1"), mask)
            vllm_kl = (None if rollout_log_probs is None
                       else ops.masked_mean(ops.kl_penalty(rollout_log_probs, old_log_probs, "k1"), mask))
        return loss, clip_ratio, ppo_kl, vllm_kl
