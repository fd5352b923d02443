"""Beam search over any next-token function, with HF transformers' rules for finished beams (spec 23.1).

Every step ranks candidates with ops.beam_search_step, so the search makes the same choices on every
backend; the bookkeeping here (which beams finish, which run on, when to stop) is host code that
only compares and multiplies float32 values.
"""

import numbers
from typing import NamedTuple

import numpy as np
import torch

from . import ops

class BeamSearchOutput(NamedTuple):
    sequences: torch.Tensor     # int64 [B, num_beams, L]: prompt and generated tokens, best first, padded with EOS
    scores: torch.Tensor        # float32 [B, num_beams]: sum of log-probs * RN32(generated ** -length_penalty)
    lengths: torch.Tensor       # int64 [B, num_beams]: prompt + generated tokens, EOS included


def _check(step_fn, input_ids, num_beams, max_new_tokens, eos_token_id, length_penalty, early_stopping):
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable (sequences int64 [N, L] -> logits [N, V]); "
                        f"got {type(step_fn).__name__}")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of dtype int64; got {type(input_ids).__name__}")
    ops._check_layout("input_ids", input_ids)
    if input_ids.dtype != torch.int64:
        raise TypeError(f"input_ids must have dtype torch.int64; got {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must have shape [B, P] with B, P >= 1; got {tuple(input_ids.shape)}")
    if bool((input_ids < 0).any()):
        raise ValueError(f"input_ids must be token ids >= 0; got {int(input_ids.min())}")
    ops._positive_int("num_beams", num_beams)
    ops._positive_int("max_new_tokens", max_new_tokens)
    if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, numbers.Integral) or eos_token_id < 0:
        raise ValueError(f"eos_token_id must be an integer >= 0; got {eos_token_id!r}")
    length_penalty = ops._real("length_penalty", length_penalty)
    factors = ops.length_factor([1, max_new_tokens], length_penalty)
    if not np.all((factors >= np.finfo(np.float32).tiny) & np.isfinite(factors)):
        raise ValueError(f"length_penalty must keep length ** -length_penalty a normal float32 for lengths up "
                         f"to max_new_tokens = {max_new_tokens}; got {length_penalty}")
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never'; got {early_stopping!r}")
    return length_penalty


def _next_logits(step_fn, running, num_beams, eos_token_id):
    batch, width, length = running.shape
    logits = step_fn(running.reshape(batch * width, length))
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != batch * width:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"step_fn must return logits of shape [{batch * width}, V] for {batch * width} "
                         f"sequences; got {got}")
    vocab = logits.shape[1]
    if 2 * num_beams > vocab or eos_token_id >= vocab:
        raise ValueError(f"num_beams must be at most V / 2 and eos_token_id below V = {vocab}; "
                         f"got num_beams={num_beams}, eos_token_id={eos_token_id}")
    return logits.reshape(batch, width, vocab)


def _cannot_improve(pool, best_running, generated, max_new_tokens, length_penalty, early_stopping):
    """HF's stopping rule for a request whose pool is full (spec 23.1)."""
    if early_stopping is True:
        return True
    length = max_new_tokens if early_stopping == "never" and length_penalty > 0 else generated
    return np.float32(best_running) * ops.length_factor(length, length_penalty) <= pool[-1][0]


def beam_search(step_fn, input_ids, *, num_beams, max_new_tokens, eos_token_id, length_penalty=1.0,
                early_stopping=False, backend=None):
    """Beam search: step_fn(sequences int64 [N, L]) -> next-token logits [N, V] (float32, bfloat16 or float16);
    input_ids int64 [B, P], ids in [0, V) (checked once step_fn has given V); 2 * num_beams <= V, eos_token_id < V.

    Follows HF transformers' beam search (spec 23.1): running beams are ranked by their sum of
    log-probabilities; a hypothesis finishes with EOS (counted in its length) or at max_new_tokens and is
    scored sum * RN32(generated_length ** -length_penalty); each request keeps the num_beams best;
    early_stopping is HF's (True: stop when num_beams have finished; False: HF's heuristic; "never").
    Returns BeamSearchOutput(sequences, scores, lengths), best first (float32 scores, int64 otherwise).
    Every step ranks with beam_search_step on the backend given, so numpy, cpu, cuda and ascend make the
    same choices; native ranks with torch's ops. Not differentiable: logits that require grad are refused
    (call step_fn's model under torch.no_grad()).
    """
    length_penalty = _check(step_fn, input_ids, num_beams, max_new_tokens, eos_token_id, length_penalty,
                            early_stopping)
    # step_fn may index with the ids, and torch's indexing reads a lazily negated view's raw memory.
    input_ids = ops._dense(input_ids)
    batch = input_ids.shape[0]
    running = input_ids[:, None, :]                           # [B, 1, P]: the prompt is the one beam at first
    running_scores = torch.zeros(batch, 1, dtype=torch.float32, device=input_ids.device)
    pools = [[] for _ in range(batch)]                        # (score, sequence), best first, at most num_beams
    done = [False] * batch
    for generated in range(1, max_new_tokens + 1):
        logits = _next_logits(step_fn, running, num_beams, eos_token_id)
        if generated == 1 and int(input_ids.max()) >= logits.shape[2]:     # V is known once step_fn has answered
            raise ValueError(f"input_ids must lie in [0, V) = [0, {logits.shape[2]}) (V from step_fn's logits); "
                             f"got {int(input_ids.max())}")
        # The 2 * num_beams best candidates: each beam has one EOS candidate at most, so at least
        # num_beams of them continue.
        scores, parents, tokens = ops.beam_search_step(running_scores, logits, 2 * num_beams, backend=backend)
        length = running.shape[2]
        candidates = torch.cat([running.gather(1, parents[:, :, None].expand(-1, -1, length)), tokens[:, :, None]], 2)
        ends = (tokens == eos_token_id) | (generated == max_new_tokens)
        factor = ops.length_factor(generated, length_penalty)
        for b in range(batch):
            if done[b]:
                continue
            # Only the num_beams best candidates may finish; the rest are there to keep num_beams running.
            finished = [(np.float32(scores[b, r].item()) * factor, candidates[b, r])
                        for r in range(num_beams) if ends[b, r]]
            pools[b] = sorted(pools[b] + finished, key=lambda h: -h[0])[:num_beams]     # stable: older first
        if generated == max_new_tokens:
            break
        keep = torch.stack([(~row).nonzero()[:num_beams, 0] for row in tokens == eos_token_id])
        running = candidates.gather(1, keep[:, :, None].expand(-1, -1, length + 1))
        running_scores = scores.gather(1, keep)
        for b in range(batch):
            if not done[b] and len(pools[b]) == num_beams:
                done[b] = bool(_cannot_improve(pools[b], running_scores[b, 0].item(), generated, max_new_tokens,
                                               length_penalty, early_stopping))
        if all(done):
            break
    return _output(pools, eos_token_id, input_ids.device)


def _output(pools, eos_token_id, device):
    longest = max(len(seq) for pool in pools for _, seq in pool)
    sequences = torch.full((len(pools), len(pools[0]), longest), eos_token_id, dtype=torch.int64, device=device)
    lengths = torch.zeros(sequences.shape[:2], dtype=torch.int64, device=device)
    for b, pool in enumerate(pools):
        for i, (_, seq) in enumerate(pool):
            sequences[b, i, :len(seq)] = seq
            lengths[b, i] = len(seq)
    scores = torch.tensor([[float(score) for score, _ in pool] for pool in pools], dtype=torch.float32, device=device)
    return BeamSearchOutput(sequences, scores, lengths)
