"""Multi-step RL (spec 29.13): rollout with the current weights, a PPO update through spec 29's backward, the
next rollout with the new weights, on one backend; the weights are the same bits on every canonical backend.

The update's layout: the sequences in request order, right-padded with token 0 to a power of two columns,
in micro-batches of `micro_batch` (a power of two) sequences, so every op's rows in a micro-batch are a
power-of-two block of the whole batch's rows and `GradientFold` gives the gradient of one backward over all
of them (spec 29.1): the weights do not depend on `micro_batch`.
"""

import hashlib
from dataclasses import dataclass

import torch

from .. import distributed, ops, optim
from ..compare.metrics import canonical_bits
from ..parallel import hf as parallel_hf
from .rollout import Rollout, rollout
from .trainer import RLSettings, _response_layout, rl_step


@dataclass(frozen=True)
class UpdateSettings:
    """The PPO update's constants (spec 29.13): AdamW's, the gradient-norm clip, sequences per micro-batch."""
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch: int = 4


def _power_of_two(n):
    return 1 << max(0, (n - 1).bit_length())


def _trainer_forward(policy, done, micro_batch, temperature, columns):
    """Per micro-batch, with autograd: (request indices, scored log-probs of its generated tokens, flattened in
    (request, position) order). Sequences right-padded with token 0 to `columns`, a power of two."""
    requests = done.requests
    sequences = [list(r.prompt) + list(t) for r, t in zip(requests, done.tokens)]
    for start in range(0, len(requests), micro_batch):
        chunk = range(start, min(start + micro_batch, len(requests)))
        tokens = _response_layout([sequences[r] for r in chunk], columns, 0, policy.device)
        lengths = torch.tensor([len(sequences[r]) for r in chunk], dtype=torch.int64, device=policy.device)
        logits, _, _, _ = policy.prefill(tokens, lengths)
        scored = parallel_hf.token_logprobs(policy, logits[:, :-1], tokens[:, 1:], temperature=temperature,
                                            backend=policy.backend)
        first = [len(requests[r].prompt) - 1 for r in chunk]
        yield chunk, torch.cat([scored[i, f:f + len(done.tokens[r])] for i, (r, f) in enumerate(zip(chunk, first))])


def shard(done, rank, world):
    """This rank's requests of a rollout (spec 28.1): the r-th of W consecutive blocks of 2^ceil(log2 n) / W
    request slots, cut to the n requests (so the last ranks may hold fewer, or none)."""
    block = _power_of_two(len(done.requests)) // world
    if block < 1:
        raise ValueError(f"a world of {world} ranks needs at least {world} requests' slots; got "
                         f"{len(done.requests)} requests")
    mine = slice(rank * block, (rank + 1) * block)
    return Rollout(done.requests[mine], done.tokens[mine], done.logprobs[mine], done.values[mine],
                   done.caches[mine], done.steps)


def _sequence_columns(policy, done):
    columns = _power_of_two(max(len(r.prompt) + len(t) for r, t in zip(done.requests, done.tokens)))
    if columns > policy.config.max_positions:
        raise ValueError(f"the longest sequence, padded to {columns} columns, must fit max_positions = "
                         f"{policy.config.max_positions}")
    return columns


def ppo_update(policy, reference, done, optimizer, update=UpdateSettings(), settings=RLSettings(), *, group=None):
    """One PPO update on a finished rollout: returns (StepResult of this rank's requests, or None when it holds
    none; gradient norm before clipping).

    The step (spec 25.5: rollout-vs-trainer log-probs, advantages, loss) is rl_step's, without autograd. The
    update's forwards then recompute the log-probabilities with autograd in its own layout — the same bits,
    checked — and the loss's gradient w.r.t. them is sent back through each micro-batch's graph separately,
    the parameter gradients folded (29.1), clipped (29.10) and applied by AdamW (29.12).

    With a process group (spec 28.1) every rank passes the whole rollout and works on its shard: the
    whitening and the loss over the group, the gradients folded across the ranks, the same update everywhere."""
    micro = update.micro_batch
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1 or micro & (micro - 1):
        raise ValueError(f"micro_batch must be a power of two; got {micro!r}")
    width, columns = max(map(len, done.tokens)), _sequence_columns(policy, done)
    if group is not None:
        done = shard(done, torch.distributed.get_rank(group), torch.distributed.get_world_size(group))
    params = [p for p in policy.parameters() if p.requires_grad]
    native = policy.backend == "native"
    if native and group is not None:
        raise ValueError("data-parallel updates fold gradients by spec 28.1 on a canonical backend; the native "
                         "backend is torch's single-process baseline (use it without a process group)")
    reduce, over = (ops, {}) if group is None else (distributed, {"group": group})
    if done.requests:
        with torch.no_grad():
            result = rl_step(policy, reference, done, settings=settings, width=width, group=group)
        logp_rollout, whitened, mask = result.logp_rollout, result.whitened, result.mask
    else:                                # no sequence here: this rank still takes part in rl_step's collectives
        result = None
        logp_rollout = whitened = torch.zeros(0, width, device=policy.device)
        mask = torch.zeros(0, width, dtype=torch.bool, device=policy.device)
        distributed.masked_whiten(whitened, mask, group=group, backend=policy.backend)
        distributed.ppo_policy_loss(whitened, whitened, whitened, mask, clip_low=settings.clip,
                                    clip_high=settings.clip, group=group, backend=policy.backend)
    pieces = list(_trainer_forward(policy, done, micro, settings.temperature, columns))
    logp = torch.zeros(len(done.requests), width, device=policy.device)
    for chunk, scored in pieces:
        offset = 0
        for r in chunk:
            count = len(done.tokens[r])
            logp[r, :count] = scored[offset:offset + count].detach()
            offset += count
    if result is not None and not native and not torch.equal(canonical_bits(logp), canonical_bits(result.logp_train)):
        raise RuntimeError("the update's forward gave other log-probability bits than the trainer step's: a "
                           "backend is not batch-invariant")
    leaf = logp.clone().requires_grad_(True)
    loss, _ = reduce.ppo_policy_loss(leaf, logp_rollout, whitened, mask, clip_low=settings.clip,
                                     clip_high=settings.clip, backend=policy.backend, **over)
    (d_logp,) = torch.autograd.grad(loss, leaf)
    fold = None if native else optim.GradientFold(params)      # native: torch's own .grad += accumulation
    for chunk, scored in pieces:
        upstream = torch.cat([d_logp[r, :len(done.tokens[r])] for r in chunk])
        scored.backward(upstream)
        if fold is not None:
            fold.add(len(chunk) * columns)                     # every op folded these rows (spec 29.1)
    if native:
        norm = torch.nn.utils.clip_grad_norm_(params, update.max_grad_norm)
    else:
        if pieces:
            fold.finish()
        if group is not None:
            distributed.fold_gradients(params, group=group, backend=policy.backend)
        norm = parallel_hf.clip_grad_norm_(params, update.max_grad_norm, backend=policy.backend)
    optimizer.step()
    optimizer.zero_grad()
    return result, norm


def weights_digest(model):
    """SHA-256 (hex) of every parameter's float32 bits, little-endian, in `parameters()` order (spec 29.13); a
    parameter sharded by bitparity.parallel.shard_model is gathered whole first (spec 31.5), so every rank of a
    sharded model must call it."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(canonical_bits(parallel_hf.full(p)).cpu().numpy().astype("<i4").tobytes())
    return h.hexdigest()


def train(policy, reference, requests_for_step, steps, max_batch, update=UpdateSettings(), settings=RLSettings()):
    """`steps` iterations of rollout then PPO update; yields (step, Rollout, StepResult, gradient norm). The
    native backend trains with torch's own AdamW, clip and gradient accumulation: the baseline."""
    hyper = {"lr": update.lr, "betas": update.betas, "eps": update.eps, "weight_decay": update.weight_decay}
    optimizer = (torch.optim.AdamW(policy.parameters(), **hyper) if policy.backend == "native"
                 else optim.AdamW(policy.parameters(), **hyper, backend=policy.backend))
    reference.requires_grad_(False)
    for step in range(steps):
        done = rollout(policy, requests_for_step(step), max_batch=max_batch, temperature=settings.temperature)
        result, norm = ppo_update(policy, reference, done, optimizer, update, settings)
        yield step, done, result, norm


