"""What `bitparity rl-check` measures: one RL step on a backend, the rollout-vs-trainer agreement of log-probs
and values, and for torch's native ops the same measured over several rollout batch caps and trainer
micro-batch sizes.

The model is TinyMoEPolicy (spec §25), or with an `HFModel` (bitparity.models.hf_policy) an unmodified Hugging
Face causal LM patched onto bitparity ops (`rl-check --model NAME` / `--config FILE`): everything else is the
same code."""

from dataclasses import asdict

from .. import metrics
from ..compare.metrics import canonical_bits
from ..models import ModelConfig, TinyMoEPolicy
from ..models.hf_policy import HFModel, describe
from ..models.hf_policy import policies as hf_policies
from .rollout import default_requests, rollout
from .train import UpdateSettings, train, weights_digest
from .trainer import RLSettings, TrainerLayout, digest, rl_step

MAX_BATCH = 6                                    # the rollout's cap on running requests
# Spec §25.6: the digest of the default step, by seed; every canonical backend on every machine must give it.
PUBLISHED_DIGESTS = {0: "a3d9cf2673861c475deae53ed2fffd80b2d46219f57116a7f2a82f698ebb89bb"}
NATIVE_BATCH_CAPS = (1, 2, 4, None)              # None: every request may run at once
NATIVE_MICRO_BATCHES = (1, 4, None)              # None: one trainer forward over all sequences


def agreement(a, b, mask):
    """Over the tokens where mask holds: max |a - b| and how many are the same bits."""
    equal = (canonical_bits(a) == canonical_bits(b))[mask]
    return {"max_abs_diff": float((a - b)[mask].abs().max()), "bitwise_equal": int(equal.sum()),
            "tokens": int(mask.sum()), "percent": 100.0 * float(equal.double().mean())}


def models(backend, seed, config=None):
    """(policy, reference): the policy from `seed`, the KL reference from seed + 1. `config`: a TinyMoEPolicy
    ModelConfig (None: spec §25.1's), or an HFModel (a patched HF causal LM, bitparity.models.hf_policy)."""
    if isinstance(config, HFModel):
        return hf_policies(config, backend, seed)
    return TinyMoEPolicy(config, seed, backend), TinyMoEPolicy(config, seed + 1, backend)


def _publishes(config):
    """Whether spec §25.6's step digest is this model's: TinyMoEPolicy's default config, or the HF `tiny` model,
    which is the same model. (29.13's weights digest is not the HF model's: its parameters are HF's tensors in
    HF's order, the experts' gate and up projections one tensor.)"""
    return config is None or isinstance(config, HFModel) and config.name == "tiny"


def _config_doc(config):
    return describe(config) if isinstance(config, HFModel) else asdict(config)


def run_step(policy, reference, requests, max_batch=MAX_BATCH, layout=TrainerLayout(), settings=RLSettings(),
             engine=rollout):
    """(Rollout, StepResult) of one RL step; engine: the rollout function (bitparity.rl.rollout's, or
    bitparity.vllm.rollout's for `--rollout vllm`)."""
    done = engine(policy, requests, max_batch=max_batch, temperature=settings.temperature)
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


def check(backend, seed, native=False, correction=None, model=None, engine=rollout):
    """The rl-check document: the default step on `backend` (with spec §25.6's digest for the seed, where it
    publishes one), and with native=True the same step on the native backend and its sweep; with correction
    (rollout_correction's keyword arguments) each step's mismatch metrics (spec 27.2). `model`: None for
    TinyMoEPolicy (spec §25), or an HFModel (a patched HF model; §25.6's digest applies to `tiny` only).
    engine: the step's rollout function (run_step). Returns (document, {backend name: (Rollout, StepResult)})."""
    config = model or ModelConfig()
    requests = default_requests(seed, vocab=config.vocab)
    runs = {backend: run_step(*models(backend, seed, config), requests, engine=engine)}
    doc = {"backend": backend, "seed": seed, **({} if model is None else {"model": model.name}),
           "config": _config_doc(config), "max_batch": MAX_BATCH,
           "trainer_layout": asdict(TrainerLayout()), "settings": asdict(RLSettings()),
           **summary(*runs[backend], correction)}
    published = PUBLISHED_DIGESTS.get(seed) if _publishes(model) else None
    doc["published_digest"] = published
    doc["matches_published"] = None if published is None else doc["digest"] == published
    if native:
        runs.setdefault("native", run_step(*models("native", seed, config), requests))
        doc["native"] = {**summary(*runs["native"], correction), "sweep": native_sweep(seed, requests, config)}
    return doc, runs



# Spec 29.13: the weights digest after `steps` updates from seed 0, micro-batches of 4 sequences.
PUBLISHED_WEIGHTS_DIGESTS = {(0, 3): "e5f3e1315b56dd9f49dc50ad1c6a3f2967df6557d5b4881336867ae9c3ab27dc"}


def train_check(backend, seed, steps, micro_batch=UpdateSettings().micro_batch, native=False, world_size=1,
                config=None, tp=1, ep=1):
    """The multi-step rl-check document: per step the rollout-vs-trainer agreement, the loss and the gradient
    norm, then the weights digest (spec 29.13); with native=True torch's own training for the same steps and
    how far its weights drift from the canonical run's. Step s samples default_requests(seed + s). With
    world_size > 1 the updates run data-parallel on that many gloo ranks on 127.0.0.1 (spec 28.1); with tp or ep
    > 1 each of those is tp x ep ranks holding an HF model sharded by bitparity.parallel.shard_model (spec 31.5),
    world_size x tp x ep processes in all. `config`
    (default: spec 25.1's) changes the model: a ModelConfig, or an HFModel (a patched HF model, its parameters
    in HF's named_parameters order, then the value head); then no digest is published."""
    published_config = config is None
    config = config or ModelConfig()
    update = UpdateSettings(micro_batch=micro_batch)

    def requests_for_step(step):
        return default_requests(seed + step, vocab=config.vocab)

    def run(name):
        policy, reference = models(name, seed, config)
        rows = []
        for step, done, result, norm in train(policy, reference, requests_for_step, steps, MAX_BATCH, update):
            rows.append({"step": step, **summary(done, result), "grad_norm": float(norm),
                         "weights_digest": weights_digest(policy)})
        return policy, rows

    if world_size > 1 or tp > 1 or ep > 1:
        rows, digest_ = _spawned_train(backend, seed, steps, micro_batch, world_size, config, tp, ep)
    else:
        policy, rows = run(backend)
        digest_ = weights_digest(policy)
    doc = {"backend": backend, "seed": seed, "steps": steps, "world_size": world_size, "tp": tp, "ep": ep,
           **({"model": config.name} if isinstance(config, HFModel) else {}), "config": _config_doc(config),
           "max_batch": MAX_BATCH, "update": asdict(update), "settings": asdict(RLSettings()), "per_step": rows,
           "weights_digest": digest_}
    published = PUBLISHED_WEIGHTS_DIGESTS.get((seed, steps)) if published_config else None
    doc["published_weights_digest"] = published
    doc["matches_published"] = None if published is None else doc["weights_digest"] == published
    doc["consistent"] = all(r["consistent"] for r in rows)
    if native:
        if world_size > 1 or tp > 1 or ep > 1:
            raise ValueError("native=True compares one process's weights: use it with world_size, tp and ep 1")
        native_policy, native_rows = run("native")
        drift = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(policy.parameters(),
                                                                                     native_policy.parameters()))
        doc["native"] = {"per_step": native_rows, "weights_digest": weights_digest(native_policy),
                         "max_abs_weight_drift": drift}
    return doc


# A spawned rl-check's whole run (data-parallel or sharded: a sharded --steps 2 on the numpy backend takes many
# minutes on a loaded machine); each collective's own timeout is 120 s.
WORLD_TIMEOUT_S = 1800


def _combined(rows):
    """Every rank's summary of its shard -> one agreement table over all tokens (None: a rank without requests)."""
    rows = [r for r in rows if r is not None]
    combined = {}
    for key in ("logprob", "value"):
        parts = [r[key] for r in rows]
        equal, tokens = sum(p["bitwise_equal"] for p in parts), sum(p["tokens"] for p in parts)
        combined[key] = {"max_abs_diff": max(p["max_abs_diff"] for p in parts), "bitwise_equal": equal,
                         "tokens": tokens, "percent": 100.0 * equal / tokens}
    combined["requests"] = sum(r["requests"] for r in rows)
    combined["ratio_exactly_one"] = all(r["ratio_exactly_one"] for r in rows)
    combined["consistent"] = all(r["consistent"] for r in rows)
    combined["loss"], combined["clip_fraction"] = rows[0]["loss"], rows[0]["clip_fraction"]   # global on every rank
    return combined


def _rank_train(rank, world, port, backend, seed, steps, micro_batch, config, tp, ep, results):
    """One rank of a data-parallel train_check (spawned): the same rollouts on every rank, the update sharded;
    with tp or ep > 1 the HF model sharded over this rank's TP and EP groups (spec 31.5), the data-parallel
    group being the ranks that hold the same shards."""
    import datetime
    import os

    import torch
    import torch.distributed as dist

    from .. import optim
    from ..parallel import hf as parallel_hf
    from .rollout import rollout
    from .train import ppo_update

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    # The ranks share this machine's cores: torch's intra-op threads of every rank spinning on all of them would
    # compete (no bit depends on the thread count).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        update = UpdateSettings(micro_batch=micro_batch)
        dp_group, tp_group, ep_group = parallel_hf.process_groups(tp, ep)
        data_parallel = world // (tp * ep)
        policy, reference = models(backend, seed, config)
        if tp > 1 or ep > 1:
            for model in (policy, reference):
                parallel_hf.shard_policy(model, tp_group=tp_group if tp > 1 else None,
                                         ep_group=ep_group if ep > 1 else None)
        reference.requires_grad_(False)
        optimizer = optim.AdamW(policy.parameters(), lr=update.lr, betas=update.betas, eps=update.eps,
                                weight_decay=update.weight_decay, backend=backend)
        rows = []
        for step in range(steps):
            done = rollout(policy, default_requests(seed + step, vocab=config.vocab), max_batch=MAX_BATCH,
                           temperature=RLSettings().temperature)
            result, norm = ppo_update(policy, reference, done, optimizer, update,
                                      group=dp_group if data_parallel > 1 else None)
            mine = None if result is None else summary(done, result) | {"requests": len(result.tokens)}
            everyone = [None] * data_parallel
            dist.all_gather_object(everyone, mine, group=dp_group)
            rows.append({"step": step, **_combined(everyone), "grad_norm": float(norm),
                         "weights_digest": weights_digest(policy)})
        digest_ = weights_digest(policy)              # every rank: a sharded parameter is gathered (spec 31.5)
        if rank == 0:
            results.put(("ok", rows, digest_))
    except Exception as error:                   # reported by the parent, which exits 1 naming the rank
        results.put(("error", f"rank {rank}: {type(error).__name__}: {error}", None))
    finally:
        dist.destroy_process_group()


def _spawned_train(backend, seed, steps, micro_batch, data_parallel, config, tp, ep):
    """(per-step rows, weights digest) of a run on data_parallel x tp x ep gloo ranks over 127.0.0.1."""
    import multiprocessing
    import queue
    import socket

    world = data_parallel * tp * ep
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank_train, daemon=True,
                         args=(r, world, port, backend, seed, steps, micro_batch, config, tp, ep, results))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        status, rows, digest_ = results.get(timeout=WORLD_TIMEOUT_S)
    except queue.Empty:
        raise RuntimeError(f"the {world} ranks did not finish within {WORLD_TIMEOUT_S} s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if status != "ok":
        # The first report may be a rank that saw another one die: every rank's error, in the order they came.
        errors = [rows]
        while True:
            try:
                report = results.get(timeout=1)
            except queue.Empty:
                break
            if report[0] == "error":
                errors.append(report[1])
        raise RuntimeError("; ".join(errors))
    return rows, digest_
