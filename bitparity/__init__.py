"""bitparity: deterministic RL operators with one canonical float32 order.

Every op is defined by the evaluation order in docs/spec.md and gives the same
bits on every backend: `cpu` (compiled C), `numpy` (the spec executed
literally), `cuda` (Triton), `ascend` (Ascend C). `native` is torch's own ops,
the baseline for comparison.
"""

import importlib.metadata

from . import compat, distributed, metrics, optim
from .backends import backends, current_backend, use_backend
from .beam import BeamSearchOutput, beam_search
from .hf import patch, unpatch
from .ops import (attention, beam_search_step, embedding, entropy, exp, filter_logits, gae, kl_penalty, linear, log,
                  log_softmax, logsumexp, masked_mean, masked_whiten, moe, ppo_policy_loss, rms_norm,
                  rollout_correction, rotary, rotary_tables, sample, silu_mul, softmax, sum, token_logprobs, topk)
from .spec import SPEC_VERSION

# The installed distribution's version, whose one source is pyproject.toml. None for a checkout that is on
# sys.path without being installed (scripts/*.py allow that), as in a run document's versions.bitparity.
try:
    __version__ = importlib.metadata.version("bitparity")
except importlib.metadata.PackageNotFoundError:
    __version__ = None

__all__ = [
    "__version__", "SPEC_VERSION", "backends", "current_backend", "use_backend",
    "sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs", "exp", "log",
    "gae", "masked_mean", "masked_whiten", "kl_penalty", "ppo_policy_loss", "rollout_correction", "metrics", "compat",
    "topk", "filter_logits", "sample", "beam_search_step", "beam_search", "BeamSearchOutput",
    "linear", "rms_norm", "rotary", "rotary_tables", "attention", "silu_mul", "moe", "embedding",
    "optim", "distributed", "patch", "unpatch",
]
