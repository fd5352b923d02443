"""The trainer side of one RL step (spec §25.5): recompute log-probs and values of the finished sequences with
full-sequence forwards in another batch order and padding, a reference policy's log-probs for the KL, then
token rewards, GAE, whitening and the PPO loss, all with bitparity ops on the policy's backend.

Everything after the forwards runs on one fixed layout, [request, response position], right-padded to the
longest response: masked_whiten and the token-mean loss sum over the whole tensor in row-major order
(spec §15), so their bits depend on that layout, and it is the same for every backend and trainer layout.
"""

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from .. import distributed, ops
from ..compare.metrics import canonical_bits
from ..parallel import hf as parallel_hf


@dataclass(frozen=True)
class TrainerLayout:
    """How the trainer batches the sequences: `order` a permutation of the request indices (None: reversed),
    `pad_extra` padding columns beyond the longest sequence, `micro_batch` sequences per forward (None: all)."""
    order: tuple = None
    pad_extra: int = 3
    micro_batch: int = 5


@dataclass(frozen=True)
class RLSettings:
    """The RL step's constants (spec §25.5): sampling temperature, k1 KL coefficient, GAE's gamma and lambda,
    PPO's symmetric clip."""
    temperature: float = 0.7
    kl_coef: float = 0.05
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2


@dataclass
class StepResult:
    """One RL step, every tensor [requests, longest response] in request order with `mask` marking the
    generated tokens (padding: token -1, zeros elsewhere, and what GAE carries into returns); loss, clip
    fraction 0-d."""
    tokens: torch.Tensor
    mask: torch.Tensor
    logp_rollout: torch.Tensor
    values_rollout: torch.Tensor
    logp_train: torch.Tensor
    values_train: torch.Tensor
    ref_logp: torch.Tensor
    scores: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    whitened: torch.Tensor
    returns: torch.Tensor
    ratio: torch.Tensor
    loss: torch.Tensor
    clip_fraction: torch.Tensor


def sequence_score(tokens):
    """The task score of a response: the fraction of even token ids minus 1/2, computed in binary64
    (correctly rounded everywhere) and rounded once to binary32."""
    return np.float32(sum(t % 2 == 0 for t in tokens) / len(tokens) - 0.5)


def _response_layout(rows, width, fill, device):
    """Per-request 1-d tensors or token lists -> [requests, width] on device, right-padded with fill."""
    dtype = rows[0].dtype if torch.is_tensor(rows[0]) else torch.int64
    out = torch.full((len(rows), width), fill, dtype=dtype, device=device)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row if torch.is_tensor(row) else torch.tensor(row, dtype=torch.int64)
    return out


def recompute(model, rollout, layout, temperature, width=None):
    """Log-probs (at `temperature`) and values of every generated token, by full-sequence forwards of prompt +
    response in `layout`, returned in the response layout [requests, width] (default: the longest response;
    zeros past a length).

    Token t of a sequence is scored by the logits and value at position t - 1, the state it was sampled from."""
    requests, n = rollout.requests, len(rollout.requests)
    order = tuple(reversed(range(n))) if layout.order is None else tuple(layout.order)
    if sorted(order) != list(range(n)):
        raise ValueError(f"layout.order must be a permutation of range({n}); got {order}")
    micro = n if layout.micro_batch is None else layout.micro_batch
    if micro < 1 or layout.pad_extra < 0:
        raise ValueError(f"layout needs micro_batch >= 1 and pad_extra >= 0; got {micro}, {layout.pad_extra}")
    sequences = [list(r.prompt) + list(t) for r, t in zip(requests, rollout.tokens)]
    columns = max(map(len, sequences)) + layout.pad_extra
    if columns > model.config.max_positions:
        raise ValueError(f"the longest sequence plus layout.pad_extra must fit max_positions = "
                         f"{model.config.max_positions}; got {columns}")
    width = max(map(len, rollout.tokens)) if width is None else width
    logp = torch.zeros(n, width, device=model.device)
    values = torch.zeros(n, width, device=model.device)
    for start in range(0, n, micro):
        chunk = order[start:start + micro]
        tokens = _response_layout([sequences[r] for r in chunk], columns, 0, model.device)
        lengths = torch.tensor([len(sequences[r]) for r in chunk], dtype=torch.int64, device=model.device)
        logits, vals, _, _ = model.prefill(tokens, lengths)
        scored = parallel_hf.token_logprobs(model, logits[:, :-1], tokens[:, 1:], temperature=temperature,
                                            backend=model.backend)
        for i, r in enumerate(chunk):
            first, count = len(requests[r].prompt) - 1, len(rollout.tokens[r])
            logp[r, :count] = scored[i, first:first + count]
            values[r, :count] = vals[i, first:first + count]
    return logp, values


@torch.no_grad()
def rl_step(policy, reference, rollout, layout=TrainerLayout(), settings=RLSettings(), *, width=None, group=None):
    """The trainer's step on a finished rollout: recomputed log-probs and values (policy), reference
    log-probs, rewards -kl_coef * k1 + score at the last token, GAE (carry), whitened advantages and the
    token-mean PPO loss against the rollout's log-probs (spec §25.5).

    Data-parallel (spec 28): with a process group, `rollout` holds this rank's requests, `width` is the global
    longest response, and the whitening and the loss run over the rank-order concatenation of every rank's rows
    (bitparity.distributed), so every rank gets the single-process step's bits for its rows. No autograd: the
    step's outputs are the update's targets (bitparity.rl.train differentiates the loss itself)."""
    backend, device = policy.backend, policy.device
    width = max(map(len, rollout.tokens)) if width is None else width
    tokens = _response_layout(rollout.tokens, width, -1, device)
    mask = tokens >= 0
    logp_rollout = _response_layout(rollout.logprobs, width, 0.0, device)
    values_rollout = _response_layout(rollout.values, width, 0.0, device)
    logp_train, values_train = recompute(policy, rollout, layout, settings.temperature, width)
    ref_logp, _ = recompute(reference, rollout, layout, settings.temperature, width)
    kl = ops.kl_penalty(logp_train, ref_logp, "k1", backend=backend)
    rewards = kl * float(np.float32(-settings.kl_coef))                              # one multiply
    scores = torch.tensor(np.array([sequence_score(t) for t in rollout.tokens], dtype=np.float32), device=device)
    last = torch.tensor([len(t) - 1 for t in rollout.tokens], device=device)
    rows = torch.arange(len(last), device=device)
    rewards[rows, last] = rewards[rows, last] + scores                               # one add
    advantages, returns = ops.gae(rewards, values_train, mask, settings.gamma, settings.lam, backend=backend)
    reduce, over = (ops, {}) if group is None else (distributed, {"group": group})     # one process, or the group
    whitened = reduce.masked_whiten(advantages, mask, backend=backend, **over)
    loss, clip_fraction = reduce.ppo_policy_loss(logp_train, logp_rollout, whitened, mask, clip_low=settings.clip,
                                                 clip_high=settings.clip, backend=backend, **over)
    ratio = ops.exp(logp_train - logp_rollout, backend=backend)
    return StepResult(tokens, mask, logp_rollout, values_rollout, logp_train, values_train, ref_logp, scores,
                      rewards, advantages, whitened, returns, ratio, loss, clip_fraction)


def digest(result):
    """SHA-256 (hex) of the step's bits (spec §25.6): the tokens as int64, then as int32 bit patterns with
    NaN canonicalised: rollout log-probs, rollout values, advantages, whitened advantages, returns, loss and
    clip fraction, each little-endian in row-major order."""
    h = hashlib.sha256(result.tokens.to(torch.int64).cpu().numpy().astype("<i8").tobytes())
    for t in (result.logp_rollout, result.values_rollout, result.advantages, result.whitened, result.returns,
              result.loss, result.clip_fraction):
        h.update(canonical_bits(t).numpy().astype("<i4").tobytes())
    return h.hexdigest()
