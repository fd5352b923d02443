"""Which of torch's ops make the native RL step's rollout and trainer disagree, on this machine.

Runs the step of `bitparity rl-check` (spec §25, seed 0) on the native backend with every op of the model
and the RL step taken from the canonical `cpu` backend except one family, left to torch: one row per family.
A family whose row shows 0.0 computes each row the same way whatever batch, padding or kernel path it takes
here (it may still differ from other platforms and from the canonical bits); one with a non-zero row is a
source of the rollout/trainer mismatch by itself. The swap is done on the native backend module inside this
process only. Run: python benchmarks/rl_mismatch_sources.py
"""

import torch
from tabulate import tabulate

from bitparity.backends import _module
from bitparity.compare.report import cpu_name
from bitparity.models import ModelConfig
from bitparity.rl import check, default_requests

# The contract ops the step calls, by family: each family is left native alone in its row.
FAMILIES = {"linear (matmul)": ("linear",), "attention (SDPA)": ("attention",), "rms_norm": ("rms_norm",),
            "silu_mul": ("silu_mul",), "rotary": ("rotary",),
            "softmax, log-probs, sampling": ("softmax", "log_softmax", "token_logprobs", "sample", "topk"),
            "RL ops (KL, GAE, whiten, PPO)": ("kl_penalty", "gae", "masked_whiten", "ppo_policy_loss", "sum")}


def _step():
    requests = default_requests(0, vocab=ModelConfig().vocab)
    return check.summary(*check.run_step(*check.models("native", 0, ModelConfig()), requests))


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    native, cpu = _module("native"), _module("cpu")
    every = [op for ops in FAMILIES.values() for op in ops]
    torch_ops = {op: getattr(native, op) for op in every}
    rows = []
    for family, ops in [("every op (all torch)", every), *FAMILIES.items(), ("none (all canonical)", ())]:
        for op in every:
            setattr(native, op, torch_ops[op] if op in ops else getattr(cpu, op))
        s = _step()
        rows.append((family, f"{s['logprob']['max_abs_diff']:.3g}", f"{s['logprob']['percent']:.1f}",
                     f"{s['value']['max_abs_diff']:.3g}", f"{s['value']['percent']:.1f}"))
    for op in every:
        setattr(native, op, torch_ops[op])
    print(tabulate(rows, headers=("left to torch", "max |dlogp|", "logp bitwise %", "max |dvalue|", "value bitwise %"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
