"""Forward + backward on the CPU: the `cpu` backend's spec 26 gradients against torch autograd (the `native`
backend) in the same run, at the shapes an RL trainer differentiates:

- token_logprobs and log_softmax at [64, 151936] (Qwen's vocabulary) and [4096, 32000] (Llama 2's), T = 0.7;
- ppo_policy_loss at [512, 4096] (token-mean, dual clip 3).

Each timing is loss = op(...) -> reduce to a scalar -> backward, the median of several runs, and includes the
forward. Run: python benchmarks/bench_backward.py
"""

import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure

BACKENDS = ("native", "cpu")


def softmax_case(op, rows, vocab):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, vocab, generator=g) * 3
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    weights = torch.randn(rows, vocab, generator=g)

    def step(backend):
        xs = x.clone().requires_grad_()
        if op == "token_logprobs":
            loss = bp.token_logprobs(xs, tokens, 0.7, backend=backend).sum()
        else:
            loss = (bp.log_softmax(xs, None, 0.7, backend=backend) * weights).sum()
        loss.backward()
    return f"{op} [{rows}, {vocab}]", step


def ppo_case(b, t):
    g = torch.Generator().manual_seed(b)
    logp = -torch.rand(b, t, generator=g)
    old = logp + torch.randn(b, t, generator=g) * 0.1
    adv = torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.9

    def step(backend):
        lp = logp.clone().requires_grad_()
        bp.ppo_policy_loss(lp, old, adv, mask, dual_clip=3.0, backend=backend)[0].backward()
    return f"ppo_policy_loss [{b}, {t}]", step


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    cases = [softmax_case(op, rows, vocab) for op in ("token_logprobs", "log_softmax")
             for rows, vocab in ((64, 151936), (4096, 32000))] + [ppo_case(512, 4096)]
    table = []
    for name, step in cases:
        ms = {backend: measure(lambda: step(backend), repeats=5).median_ms for backend in BACKENDS}
        table.append((name, f"{ms['native']:.1f}", f"{ms['cpu']:.1f}", f"{ms['cpu'] / ms['native']:.2f}"))
    print("forward + backward, median of 5 runs")
    print(tabulate(table, headers=("op", "torch autograd ms", "cpu ms", "cpu / torch"), tablefmt="github"))


if __name__ == "__main__":
    main()
