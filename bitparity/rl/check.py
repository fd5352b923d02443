"""What `bitparity rl-check` measures: one RL step on a backend, the rollout-vs-trainer agreement of log-probs
and values, and for torch's native ops the same measured over several rollout batch caps and trainer
micro-batch sizes."""

from dataclasses import asdict

from .. import metrics
from ..compare.metrics import canonical_bits
from ..models import ModelConfig, TinyMoEPolicy
from .rollout import default_requests, rollout
from .trainer import RLSettings, TrainerLayout, digest, rl_step

MAX_BATCH = 6                                    # the rollout's cap on running requests
# Spec §25.6: the digest of the default step, by seed; every canonical backend on every machine must give it.
PUBLISHED_DIGESTS = {0: "3a94278aba62a56765e8ad969f24b6f9db20b0b3fb02899c4a07461fe3bef286"}
NATIVE_BATCH_CAPS = (1, 2, 4, None)              # None: every request may run at once
NATIVE_MICRO_BATCHES = (1, 4, None)              # None: one trainer forward over all sequences


def agreement(a, b, mask):
    """Over the tokens where mask holds: max |a - b| and how many are the same bits."""
    equal = (canonical_bits(a) == canonical_bits(b))[mask]
    return {"max_abs_diff": float((a - b)[mask].abs().max()), "bitwise_equal": int(equal.sum()),
            "tokens": int(mask.sum()), "percent": 100.0 * float(equal.double().mean())}


def models(backend, seed, config=None):
    """(policy, reference): the policy from `seed`, the KL reference from seed + 1."""
    return TinyMoEPolicy(config, seed, backend), TinyMoEPolicy(config, seed + 1, backend)


def run_step(policy, reference, requests, max_batch=MAX_BATCH, layout=TrainerLayout(), settings=RLSettings()):
    """(Rollout, StepResult) of one RL step."""
    done = rollout(policy, requests, max_batch=max_batch, temperature=settings.temperature)
    return done, rl_step(policy, reference, done, layout, settings)


def summary(done, result, correction=None):
    """The numbers rl-check reports for one step; with correction (rollout_correction's keyword arguments), the
    canonical mismatch metrics of spec 27.2 too."""
    mask = result.mask
    logp = agreement(result.logp_train, result.logp_rollout, mask)
    value = agreement(result.values_train, result.values_rollout, mask)
    ratio_one = bool((result.ratio[mask] == 1.0).all())
    return {"requests": len(done.requests), "steps": len(done.steps),
            "decode_batch_sizes": sorted({len(s["decode"]) for s in done.steps}),
            "logprob": logp, "value": value, "loss": float(result.loss), "clip_fraction": float(result.clip_fraction),
            "ratio_exactly_one": ratio_one, "digest": digest(result),
            "consistent": logp["bitwise_equal"] == logp["tokens"] and value["bitwise_equal"] == value["tokens"]
            and ratio_one,
            **({} if correction is None else {"mismatch": {name: float(v) for name, v in metrics.mismatch(
                result.logp_train, result.logp_rollout, mask, correction=correction).items()}})}


def native_sweep(seed, requests, config=None):
    """The native backend's rollout-vs-trainer mismatch for each rollout batch cap and trainer micro-batch."""
    policy, reference = models("native", seed, config)
    rows = []
    for cap in NATIVE_BATCH_CAPS:
        done = rollout(policy, requests, max_batch=cap or len(requests), temperature=RLSettings().temperature)
        for micro in NATIVE_MICRO_BATCHES:
            result = rl_step(policy, reference, done, TrainerLayout(micro_batch=micro))
            logp = agreement(result.logp_train, result.logp_rollout, result.mask)
            value = agreement(result.values_train, result.values_rollout, result.mask)
            rows.append({"max_batch": cap or "all", "micro_batch": micro or "all",
                         "max_abs_logp_diff": logp["max_abs_diff"], "logp_equal_percent": logp["percent"],
                         "max_abs_value_diff": value["max_abs_diff"], "value_equal_percent": value["percent"]})
    return rows


def check(backend, seed, native=False, correction=None):
    """The rl-check document: the default step on `backend` (with spec §25.6's digest for the seed, where it
    publishes one), and with native=True the same step on the native backend and its sweep; with correction
    (rollout_correction's keyword arguments) each step's mismatch metrics (spec 27.2).
    Returns (document, {backend name: (Rollout, StepResult)})."""
    config = ModelConfig()
    requests = default_requests(seed, vocab=config.vocab)
    runs = {backend: run_step(*models(backend, seed, config), requests)}
    doc = {"backend": backend, "seed": seed, "config": asdict(config), "max_batch": MAX_BATCH,
           "trainer_layout": asdict(TrainerLayout()), "settings": asdict(RLSettings()),
           **summary(*runs[backend], correction)}
    published = PUBLISHED_DIGESTS.get(seed)
    doc["published_digest"] = published
    doc["matches_published"] = None if published is None else doc["digest"] == published
    if native:
        runs.setdefault("native", run_step(*models("native", seed, config), requests))
        doc["native"] = {**summary(*runs["native"], correction), "sweep": native_sweep(seed, requests, config)}
    return doc, runs

