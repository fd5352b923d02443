"""The rollout engine: continuous batching with a per-request KV cache (spec §25.4).

At every step, in this order: the running requests each decode one token, as one batch in a rotated order;
then waiting requests that have arrived join, while fewer than `max_batch` requests are running, and their
prompts are prefilled together, right-padded; every request in either group samples one token with
bitparity.sample (its seed, the token's absolute position, logprobs="scaled"); requests that reach
max_new_tokens leave. So the decode batch changes from step to step, and a request's tokens are computed in
batches of changing size, order and padding, which is exactly what a batch-invariant model must survive.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from ..parallel import hf as parallel_hf


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), how many tokens to generate, its sampling seed and the step it arrives at."""
    prompt: tuple
    max_new_tokens: int
    seed: int
    arrival: int = 0


@dataclass
class Rollout:
    """Per request (in request order): the generated tokens, the log-probability of each under
    softmax(logits / temperature) and the value of the state it was sampled from, and its final KV cache
    (per layer [H, max_positions, hd] keys and values); `steps` lists, per engine step, the decode batch
    (request indices in batch order) and the requests that joined."""
    requests: list
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    values: list = field(default_factory=list)
    caches: list = field(default_factory=list)
    steps: list = field(default_factory=list)


def default_requests(seed, count=12, vocab=4096):
    """`count` requests with prompts of 2 to 12 tokens, 3 to 14 new tokens and arrivals spread over the
    first steps, drawn from numpy's PCG64 (portable) seeded with `seed`."""
    rng = np.random.Generator(np.random.PCG64(seed))
    arrivals = np.sort(rng.integers(0, 2 * count // 3, count))
    return [Request(prompt=tuple(int(t) for t in rng.integers(0, vocab, int(rng.integers(2, 13)))),
                    max_new_tokens=int(rng.integers(3, 15)), seed=seed * 1000 + i, arrival=int(a))
            for i, a in enumerate(arrivals)]


def _check_requests(requests, config):
    if not requests:
        raise ValueError("requests must not be empty")
    for i, r in enumerate(requests):
        if not r.prompt or any(not 0 <= t < config.vocab for t in r.prompt):
            raise ValueError(f"requests[{i}].prompt must be a non-empty sequence of token ids in [0, {config.vocab})")
        if r.max_new_tokens < 1 or r.arrival < 0:
            raise ValueError(f"requests[{i}] must have max_new_tokens >= 1 and arrival >= 0")
        if len(r.prompt) + r.max_new_tokens > config.max_positions:
            raise ValueError(f"requests[{i}]: prompt plus max_new_tokens must fit max_positions = "
                             f"{config.max_positions}; got {len(r.prompt)} + {r.max_new_tokens}")


class _Sequence:
    """One running request: its KV cache (per layer [H, max_positions, hd], NaN where not yet written),
    how many positions it holds, and what it has sampled."""

    def __init__(self, model, request):
        c = model.config
        shape = (c.heads, c.max_positions, c.head_dim)
        self.keys = [torch.full(shape, float("nan"), device=model.device) for _ in range(c.layers)]
        self.vals = [torch.full(shape, float("nan"), device=model.device) for _ in range(c.layers)]
        self.length = len(request.prompt)        # positions in the cache once the prompt is prefilled
        self.tokens, self.logprobs, self.values = [], [], []


def _sample(model, logits, values, batch, seqs, requests, temperature, positions):
    seeds = torch.tensor([requests[r].seed for r in batch], dtype=torch.int64, device=model.device)
    tokens, logprobs = parallel_hf.sample(model, logits, seeds, positions, temperature=temperature, logprobs="scaled",
                                          backend=model.backend)
    for i, r in enumerate(batch):
        seqs[r].tokens.append(int(tokens[i]))
        seqs[r].logprobs.append(logprobs[i])
        seqs[r].values.append(values[i])


def _decode(model, batch, seqs, requests, temperature):
    """One decode step for the running requests in `batch` order: each feeds its last sampled token."""
    positions = torch.tensor([seqs[r].length for r in batch], dtype=torch.int64, device=model.device)
    tokens = torch.tensor([seqs[r].tokens[-1] for r in batch], dtype=torch.int64, device=model.device)
    slots = int(positions.max()) + 1      # the batch's caches, cut to the slots the longest one needs
    key_cache = [torch.stack([seqs[r].keys[layer][:, :slots] for r in batch]) for layer in range(model.config.layers)]
    value_cache = [torch.stack([seqs[r].vals[layer][:, :slots] for r in batch]) for layer in range(model.config.layers)]
    logits, values, new_keys, new_vals = model.decode(tokens, positions, key_cache, value_cache)
    for i, r in enumerate(batch):
        for layer in range(model.config.layers):
            seqs[r].keys[layer][:, seqs[r].length] = new_keys[layer][i]
            seqs[r].vals[layer][:, seqs[r].length] = new_vals[layer][i]
        seqs[r].length += 1
    _sample(model, logits, values, batch, seqs, requests, temperature, positions + 1)


def _prefill(model, joiners, seqs, requests, temperature):
    """The joiners' prompts as one right-padded batch (pad id 0); each samples its first token."""
    lengths = torch.tensor([len(requests[r].prompt) for r in joiners], dtype=torch.int64, device=model.device)
    tokens = torch.zeros(len(joiners), int(lengths.max()), dtype=torch.int64, device=model.device)
    for i, r in enumerate(joiners):
        tokens[i, :lengths[i]] = torch.tensor(requests[r].prompt, dtype=torch.int64)
    logits, values, keys, vals = model.prefill(tokens, lengths)
    rows = torch.arange(len(joiners), device=model.device)
    for i, r in enumerate(joiners):
        for layer in range(model.config.layers):
            seqs[r].keys[layer][:, :lengths[i]] = keys[layer][i, :, :lengths[i]]
            seqs[r].vals[layer][:, :lengths[i]] = vals[layer][i, :, :lengths[i]]
    last = lengths - 1
    _sample(model, logits[rows, last], values[rows, last], joiners, seqs, requests, temperature, lengths)


@torch.no_grad()
def rollout(model, requests, *, max_batch, temperature):
    """Generate every request's tokens with continuous batching (module docstring); returns a Rollout.
    Inference only: no autograd graph is built.

    max_batch caps the running requests; the decode batch of step s is the running requests sorted by
    index and rotated left by s mod their count, so its order changes even when its members do not."""
    _check_requests(requests, model.config)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int; got {max_batch!r}")
    waiting = sorted(range(len(requests)), key=lambda r: (requests[r].arrival, r))
    seqs, running, steps, step = {}, [], [], 0
    while waiting or running:
        decoding = sorted(running)
        if decoding:
            shift = step % len(decoding)
            decoding = decoding[shift:] + decoding[:shift]
            _decode(model, decoding, seqs, requests, temperature)
        joiners = []
        while waiting and requests[waiting[0]].arrival <= step and len(running) + len(joiners) < max_batch:
            joiners.append(waiting.pop(0))
        if joiners:
            for r in joiners:
                seqs[r] = _Sequence(model, requests[r])
            _prefill(model, joiners, seqs, requests, temperature)
        steps.append({"decode": decoding, "prefill": joiners})
        running = [r for r in running + joiners if len(seqs[r].tokens) < requests[r].max_new_tokens]
        step += 1
    out = Rollout(requests=list(requests), steps=steps)
    for r in range(len(requests)):
        out.tokens.append(seqs[r].tokens)
        out.logprobs.append(torch.stack(seqs[r].logprobs))
        out.values.append(torch.stack(seqs[r].values))
        out.caches.append((seqs[r].keys, seqs[r].vals))
    return out
