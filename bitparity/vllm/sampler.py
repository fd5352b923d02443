"""vLLM's V1 sampler replaced by bitparity.sample (spec 30.8).

How it is installed: the plugin replaces the name `Sampler` in `vllm.v1.worker.gpu_model_runner` (the module
whose `GPUModelRunner.__init__`, and so `CPUModelRunner`'s, builds `self.sampler = Sampler(logprobs_mode=...)`)
by `CanonicalSampler`, a subclass. Each instance decides once, from the engine's config (vLLM's current config
while the runner is built), whether the engine serves a bitparity model: if not, every call is the stock
sampler's, so other models in the same process keep vLLM's sampling.

Per step, for the rows of the step's requests (in the input batch's order, the order of the model's
attention metadata):
- token = bitparity.sample(logits, seed, position, temperature, top_k, top_p, min_p) (spec 22), with
  position = the request's seq_len after this step (the model's forward records it: prompt length + j for the
  j-th generated token, as the trainer counts it), seed = the request's `SamplingParams.seed`, read from
  the seeded torch.Generator vLLM keeps for it (`initial_seed()`), and temperature 0 (greedy) where vLLM's
  temperature is below its greedy threshold 1e-5. An unseeded sampled request gets a fresh seed each step
  from this sampler's own generator (seeded with the engine's `seed`): its tokens are random as vLLM's are,
  and its log-probs are still the canonical ones of the tokens drawn.
- its log-prob: `logprobs_mode` "raw_logprobs" -> log_softmax of the model's logits; "processed_logprobs" ->
  log_softmax of the temperature-scaled, min-p/top-k/top-p filtered logits (greedy rows: the raw ones), the
  distribution sampled from; "raw_logits" / "processed_logits" the same rows before the log_softmax. Every
  row is bitparity.log_softmax (spec 8.3; bit-identical to token_logprobs at the token), so top-k log-probs
  and ranks (vLLM's: the entries >= the token's) come from the same canonical row.
- logits processors vLLM applies before sampling that can change the argmax (allowed token ids, bad words,
  min_tokens, logit bias) are vLLM's own code on a float32 copy, as in the stock sampler; min-p is read from
  vLLM's built-in processor and applied by bitparity's filter (spec 21's order).

Refused with ValueError: penalties (repetition, frequency, presence), argmax-invariant logits processors
other than vLLM's min-p, `logprob_token_ids` (the scoring API), speculative decoding (refused by the model).

vLLM's CPU generator bug: the runner rewinds a discarded row's generator with `Generator.set_offset`, which
CPU generators do not support, so a seeded request whose prompt is chunked crashed the stock engine. This
sampler needs only the seed, so it replaces each request's generator in the runner's table (the dict it is
handed as `sampling_metadata.generators`) by a `SeedOnly` that keeps the seed and ignores offsets.
"""

import torch
from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample.sampler import Sampler

from .. import ops

GREEDY_BELOW = 1e-5                 # vLLM's _SAMPLING_EPS: a temperature below it is greedy
_STEP = {"seq_lens": None}          # the last forward's per-request seq_lens (None: a profiling run)


def record_step():
    """Called by the model at the start of each forward: the step's seq_lens from the attention metadata (one
    per request, in the input batch's order), or None in vLLM's profiling run (no metadata)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available
    metadata = get_forward_context().attn_metadata if is_forward_context_available() else None
    if isinstance(metadata, dict):
        metadata = next(iter(metadata.values()), None)
    _STEP["seq_lens"] = None if metadata is None else metadata.seq_lens


class SeedOnly:
    """What replaces a request's torch.Generator in the runner's table: its seed, and offsets that the
    runner may rewind (a no-op: the noise is a function of (seed, position) only)."""

    def __init__(self, seed):
        self.seed = seed

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return 0

    def set_offset(self, offset):
        pass


def _int64(seed):
    """torch's generator seed (uint64) -> the int64 SamplingParams.seed it came from."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


_KINDS = {"raw_logprobs": "raw", "raw_logits": "raw", "processed_logprobs": "processed",
          "processed_logits": "processed"}


class CanonicalSampler(Sampler):
    """vLLM's Sampler for engines serving a bitparity model (module docstring); the stock one otherwise."""

    def __init__(self, logprobs_mode="raw_logprobs", use_fp64_gumbel=False):
        super().__init__(logprobs_mode=logprobs_mode, use_fp64_gumbel=use_fp64_gumbel)
        from vllm.config import get_current_vllm_config_or_none

        from .plugin import serves
        config = get_current_vllm_config_or_none()
        self.canonical = config is not None and serves(config.model_config)
        if self.canonical:
            self.unseeded = torch.Generator().manual_seed(config.model_config.seed or 0)

    def forward(self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None):
        if not self.canonical:
            return super().forward(logits, sampling_metadata, predict_bonus_token, logprobs_mode_override)
        mode = logprobs_mode_override or self.logprobs_mode
        md = sampling_metadata
        rows = logits.shape[0]
        _refuse(md)
        seq_lens, _STEP["seq_lens"] = _STEP["seq_lens"], None
        if seq_lens is None:                   # vLLM's profiling run: no requests, positions 0
            positions = torch.zeros(rows, dtype=torch.int64)
        elif len(seq_lens) != rows:
            raise RuntimeError(f"bitparity sampler: {rows} logits rows for a step of {len(seq_lens)} requests")
        else:
            positions = seq_lens.to(torch.int64)
        x = self.apply_logits_processors(logits.to(torch.float32).clone(), md, predict_bonus_token)
        greedy = torch.ones(rows, dtype=torch.bool) if md.all_greedy else md.temperature[:rows] < GREEDY_BELOW
        temperature = torch.zeros(rows) if md.all_greedy else torch.where(greedy, 0.0, md.temperature[:rows])
        filters = _filters(md, rows, logits.shape[1])
        seeds = self._seeds(md.generators, greedy)
        tokens, _ = ops.sample(x, seeds, positions, temperature=temperature, **filters, logprobs="raw")
        if bool((tokens < 0).any()):
            row = int((tokens < 0).nonzero()[0])
            raise RuntimeError(f"bitparity sampler: row {row} has no distribution (a NaN or +inf logit, or every "
                               f"logit -inf)")
        logprobs = None
        if md.max_num_logprobs is not None:
            logprobs = _logprobs(logits, x, tokens, greedy, temperature, filters, mode, md.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=tokens.to(torch.int32)[:, None], logprobs_tensors=logprobs)

    def compute_logprobs(self, logits):
        """Prompt log-probs (the runner calls this for `prompt_logprobs`): canonical on a bitparity engine."""
        if not self.canonical:
            return super().compute_logprobs(logits)
        return ops.log_softmax(logits.to(torch.float32))

    def _seeds(self, generators, greedy):
        """int64 [R]: each seeded request's seed (its generator swapped for a SeedOnly: module docstring);
        a fresh one from this sampler's generator for unseeded sampled rows; 0 for greedy rows (unused)."""
        rows = greedy.shape[0]
        fresh = torch.randint(-2**63, 2**63 - 1, (rows,), dtype=torch.int64, generator=self.unseeded)
        seeds = torch.where(greedy, 0, fresh)
        for row, generator in list(generators.items()):
            if not isinstance(generator, SeedOnly):
                generator = generators[row] = SeedOnly(_int64(generator.initial_seed()))
            if row < rows:
                seeds[row] = generator.seed
        return seeds


def _refuse(md):
    problems = []
    if not md.no_penalties:
        problems.append("repetition, frequency or presence penalties")
    if md.logprob_token_ids:
        problems.append("logprob_token_ids")
    others = [type(p).__name__ for p in md.logitsprocs.argmax_invariant if type(p).__name__ != "MinPLogitsProcessor"]
    if others:
        problems.append(f"argmax-invariant logits processors {others}")
    if problems:
        raise ValueError(f"bitparity's vLLM sampler does not support {', '.join(problems)}")


def _filters(md, rows, vocab):
    """bitparity.sample's per-row top_k (0 = off; vLLM's 'off' is the vocabulary size), top_p and min_p."""
    top_k = torch.zeros(rows, dtype=torch.int64)
    if md.top_k is not None:
        k = md.top_k[:rows].to(torch.int64)
        top_k = torch.where((k > 0) & (k < vocab), k, 0)
    top_p = torch.ones(rows) if md.top_p is None else md.top_p[:rows].to(torch.float32)
    min_p = torch.zeros(rows)
    for p in md.logitsprocs.argmax_invariant:
        if p.min_p_count:
            min_p = torch.from_numpy(p.min_p_cpu[:rows].copy()).to(torch.float32)
    return {"top_k": top_k, "top_p": top_p, "min_p": min_p}


def _logprobs(raw, x, tokens, greedy, temperature, filters, mode, count):
    """LogprobsTensors of the distribution `mode` names (module docstring): the sampled token's entry, then the
    `count` largest (count -1: the whole row), and the sampled token's rank."""
    if _KINDS[mode] == "raw":
        dist = raw.to(torch.float32)
    else:
        dist = ops.filter_logits(x, temperature=torch.where(greedy, 1.0, temperature), **filters)
        dist[greedy] = x[greedy]
    values = ops.log_softmax(dist) if mode.endswith("logprobs") else dist
    picked = values.gather(1, tokens[:, None])
    ranks = (values >= picked).sum(dim=1)
    if count == -1:
        return LogprobsTensors(torch.empty(0), values, torch.empty(0))
    ids = tokens[:, None]
    if count > 0:
        top, top_ids = ops.topk(values, count)
        ids, picked = torch.cat([ids, top_ids], dim=1), torch.cat([picked, top], dim=1)
    return LogprobsTensors(ids.to(torch.int32), picked, ranks)
