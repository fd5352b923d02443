"""OpenRLHF's KL estimators, advantage normalisation, GAE and PPO policy loss (OpenRLHF 0.11.0:
openrlhf/models/utils.py, openrlhf/models/loss.py, openrlhf/trainer/ppo_utils/experience_maker.py), computed by
bitparity's canonical ops; PolicyLoss takes the constructor and forward arguments of commit 3c3be6234e0c.
docs/conventions.md lists the differences (empty masks; positions outside the mask; refused options). Masks may be
bool or 0/1 tensors (any other value is refused); errors name OpenRLHF's arguments."""

import numpy as np
import torch

from .. import ops
from ._common import caller_names, check_mask, dp_size_checked, host_factor, positive, tensor

KL_ESTIMATORS = ("k1", "k2", "k3")


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    """With d = log_probs - log_probs_base: k1 = d, k2 = d^2 / 2, k3 = exp(-d) - 1 + d, each clamped to +-10."""
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {kl_estimator!r}")
    # bitparity's d is log_probs_base - log_probs: its k1 = -d, k2 and k3 are OpenRLHF's, bit for bit.
    with caller_names(logp="log_probs", ref_logp="log_probs_base"):
        return ops.kl_penalty(log_probs, log_probs_base, kl_estimator, clamp=10.0)


def masked_mean(tensor, mask, dim=None):
    """sum(tensor * mask) / mask.sum() (0 for an empty mask, where OpenRLHF gives NaN); mask None: the plain mean."""
    with caller_names(x="tensor"):
        ops._check_float_tensor("tensor", tensor, 1)
        mask = (torch.ones(tensor.shape, dtype=torch.bool, device=tensor.device) if mask is None
                else check_mask("mask", mask))
        return ops.masked_mean(tensor, mask, dim)


def normalize_advantages(advantages, action_mask):
    """The experience maker's normalisation: (A - mean) * rsqrt(max(var, 1e-8)) over every counted token of
    the batch, biased variance."""
    with caller_names(x="advantages", mask="action_mask"):
        return ops.masked_whiten(advantages, check_mask("action_mask", action_mask), unbiased=False, eps=1e-8,
                                 eps_mode="clamp")


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """(advantages, returns): values and rewards times action_mask, the unmasked reverse GAE loop,
    returns = advantages + masked values."""
    with caller_names(mask="action_mask", x="rewards", lam="lambd"):
        return ops.gae(rewards, values, check_mask("action_mask", action_mask), gamma, lambd, mask_mode="zero")


POLICY_LOSS_TYPES = ("ppo", "gspo")
VLLM_IS_CORRECTION_TYPES = ("tis", "icepop", "seq-mask-tis")


class PolicyLoss(torch.nn.Module):
    """OpenRLHF 0.11's PPO policy loss (openrlhf/models/loss.py at 3c3be6234e0c), constructor and forward
    arguments as OpenRLHF's trainer passes them. forward -> (loss, clip_ratio, ppo_kl, vllm_kl); the loss is
    differentiable in log_probs, the other three are metrics and carry no gradient.

    Per token: the log-ratio clamped to +-20, clip [1 - clip_eps_low, 1 + clip_eps_high], an optional dual clip
    (> 1) on negative advantages (bitparity.ppo_policy_loss). Aggregation, with n the local count (counted
    tokens for token_level_loss, non-empty sequences otherwise):
      - token_level_loss, batch_num_tokens None: the token mean (dp_size unused, as in OpenRLHF);
      - token_level_loss, batch_num_tokens N: OpenRLHF's sum(loss * mask) / N * dp_size, computed as
        RN32(token_mean * RN32(dp_size * n / N)): the canonical token mean, times one host factor divided in
        float64 and rounded once to float32, one float32 multiply;
      - otherwise the mean over non-empty sequences of each sequence's token mean, or with global_batch_size G
        RN32(that mean * RN32(dp_size * n / G)) (OpenRLHF: the sum of sequence means / G * dp_size).
    The mode's unused count (global_batch_size in token mode, batch_num_tokens in sequence mode) does not enter
    OpenRLHF's result either. clip_ratio and ppo_kl are local token means, unscaled, as OpenRLHF's.

    Not expressible by the canonical ops, so refused rather than ignored: policy_loss_type="gspo" (a
    sequence-level ratio) and enable_vllm_is_correction=True (per-token IS weights inside the loss; use
    bitparity.rollout_correction, docs/conventions.md maps each vllm_is_correction_type). vllm_kl is the
    masked mean of rollout_log_probs - old_log_probs whenever rollout_log_probs is given (OpenRLHF computes it
    only with the IS correction on, else None); it is a metric and never enters the loss."""

    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", enable_vllm_is_correction=False, vllm_is_truncated_threshold=None,
                 vllm_is_correction_type="tis"):
        super().__init__()
        if policy_loss_type not in POLICY_LOSS_TYPES:
            raise ValueError(f"policy_loss_type must be one of {', '.join(POLICY_LOSS_TYPES)}; "
                             f"got {policy_loss_type!r}")
        if vllm_is_correction_type not in VLLM_IS_CORRECTION_TYPES:
            raise ValueError(f"vllm_is_correction_type must be one of {', '.join(VLLM_IS_CORRECTION_TYPES)}; "
                             f"got {vllm_is_correction_type!r}")
        # The constructor's values are checked here, under OpenRLHF's names, with ppo_policy_loss's rules (spec 17.1).
        if np.float32(ops._real("clip_eps_low", clip_eps_low, low=0.0, high=1.0)) >= 1.0:
            raise ValueError(f"clip_eps_low must be in [0, 1) after rounding to float32 (the ratio floor "
                             f"1 - clip_eps_low must stay > 0); got {clip_eps_low}")
        ops._real("clip_eps_high", clip_eps_high, low=0.0)
        ops._real("dual_clip", dual_clip, low=1.0, low_open=True, allow_none=True)
        if not isinstance(token_level_loss, bool):
            raise TypeError(f"token_level_loss must be a bool; got {type(token_level_loss).__name__}")
        if policy_loss_type == "gspo":
            raise NotImplementedError("policy_loss_type='gspo' (GSPO's sequence-level ratio) has no canonical op "
                                      "in bitparity; only policy_loss_type='ppo' is supported")
        if enable_vllm_is_correction:
            raise NotImplementedError(
                f"enable_vllm_is_correction=True (vllm_is_correction_type={vllm_is_correction_type!r}, "
                f"vllm_is_truncated_threshold={vllm_is_truncated_threshold!r}) weighs the per-token loss, which "
                "bitparity.ppo_policy_loss does not take; compute the weights with bitparity.rollout_correction "
                "(docs/conventions.md) and pass enable_vllm_is_correction=False")
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.dual_clip, self.token_level_loss = dual_clip, token_level_loss
        self.policy_loss_type = policy_loss_type
        self.enable_vllm_is_correction = enable_vllm_is_correction
        self.vllm_is_truncated_threshold = vllm_is_truncated_threshold
        self.vllm_is_correction_type = vllm_is_correction_type

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, dp_size=1,
                batch_num_tokens=None, global_batch_size=None):
        dp_size = dp_size_checked(dp_size)
        for name, value in (("batch_num_tokens", batch_num_tokens), ("global_batch_size", global_batch_size)):
            if value is not None:                              # checked even where the mode does not use it
                positive(name, value)
        names = {"logp": "log_probs", "old_logp": "old_log_probs", "mask": "action_mask", "x": "log_probs",
                 "clip_low": "clip_eps_low", "clip_high": "clip_eps_high"}
        with caller_names(**names):
            ops._check_float_tensor("logp", log_probs, 2)
            mask = (torch.ones(log_probs.shape, dtype=torch.bool, device=log_probs.device) if action_mask is None
                    else check_mask("action_mask", action_mask))
            if rollout_log_probs is not None:                  # checked before the loss, though only vllm_kl uses it
                ops._check_same_shape("rollout_log_probs", rollout_log_probs, "logp", log_probs)
            loss, clip_ratio = ops.ppo_policy_loss(
                log_probs, tensor("old_log_probs", old_log_probs).detach(), tensor("advantages", advantages).detach(),
                mask, clip_low=self.clip_eps_low, clip_high=self.clip_eps_high, dual_clip=self.dual_clip,
                ratio_clamp=20.0, agg="token-mean" if self.token_level_loss else "seq-mean-token-mean")
        name, total = (("batch_num_tokens", batch_num_tokens) if self.token_level_loss
                       else ("global_batch_size", global_batch_size))
        if total is not None:
            # The local mean's count n: OpenRLHF's sum / total * dp_size = mean * (dp_size * n / total).
            n = int(mask.sum()) if self.token_level_loss else int(mask.any(dim=-1).sum())
            loss = loss * host_factor(dp_size * n, total, name)
        with torch.no_grad():
            # k1 with d = log_probs - old: -d = old - log_probs, unclamped.
            ppo_kl = ops.masked_mean(ops.kl_penalty(old_log_probs, log_probs, "k1"), mask)
            vllm_kl = (None if rollout_log_probs is None
                       else ops.masked_mean(ops.kl_penalty(rollout_log_probs, old_log_probs, "k1"), mask))
        return loss, clip_ratio, ppo_kl, vllm_kl
