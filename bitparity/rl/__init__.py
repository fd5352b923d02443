"""One RL step end to end on TinyMoEPolicy (or a patched HF model, bitparity.models.HFPolicy): a rollout engine
with continuous batching and a KV cache, and a trainer that recomputes log-probs and values in another layout,
then GAE, whitening, KL and the PPO loss."""

from .rollout import Request, Rollout, default_requests, rollout
from .trainer import RLSettings, StepResult, TrainerLayout, digest, rl_step

__all__ = ["Request", "Rollout", "default_requests", "rollout",
           "RLSettings", "StepResult", "TrainerLayout", "digest", "rl_step"]
