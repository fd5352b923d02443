"""CPU cost of one RL step on TinyMoEPolicy (spec §25, the model `bitparity rl-check` runs): the rollout (12
requests, continuous batching, max batch 6) and the trainer step (two recompute forwards, GAE, whitening, KL,
PPO) on a canonical backend against the identical model on torch's own ops (`native`), in the same run.

The canonical backend is `cpu` where it has the model ops, else `numpy`; the table says which ran.
Run: python benchmarks/bench_rl_step.py
"""

import torch
from tabulate import tabulate

from bitparity.backends import _module
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure
from bitparity.models import ModelConfig
from bitparity.rl import default_requests, rl_step, rollout
from bitparity.rl.check import MAX_BATCH, models
from bitparity.rl.trainer import RLSettings

SEED = 0


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    requests = default_requests(SEED)
    temperature = RLSettings().temperature
    canonical = next(name for name in ("cpu", "numpy") if hasattr(_module(name), "attention"))
    rows, base = [], {}
    for name in ("native", canonical):
        policy, reference = models(name, SEED)
        done = rollout(policy, requests, max_batch=MAX_BATCH, temperature=temperature)
        rollout_ms = measure(lambda: rollout(policy, requests, max_batch=MAX_BATCH, temperature=temperature),
                             repeats=3, warmup=0).median_ms
        trainer_ms = measure(lambda: rl_step(policy, reference, done), repeats=3, warmup=0).median_ms
        base.setdefault("rollout", rollout_ms)
        base.setdefault("trainer", trainer_ms)
        rows.append((name, f"{rollout_ms:.0f}", f"{rollout_ms / base['rollout']:.3g}",
                     f"{trainer_ms:.0f}", f"{trainer_ms / base['trainer']:.3g}"))
    c = ModelConfig()
    tokens = sum(r.max_new_tokens for r in requests)
    print(f"TinyMoEPolicy (vocab {c.vocab}, hidden {c.hidden}, {c.layers} layers, {c.experts} experts top-{c.top_k}), "
          f"{len(requests)} requests, {tokens} generated tokens, max batch {MAX_BATCH}")
    print(tabulate(rows, headers=("backend", "rollout ms", "x native", "trainer step ms", "x native"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
