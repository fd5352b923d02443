"""Training through bitparity (spec 29) against torch autograd on the same CPU: forward + backward of linear and
attention, one AdamW step, and one full RL update of TinyMoEPolicy (rollout excluded), as median ms and ratios.

    python benchmarks/bench_training.py [--backend cpu] [--repeats 5]
"""

import argparse
import statistics
import time

import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.models import ModelConfig
from bitparity.rl.check import MAX_BATCH, models
from bitparity.rl.rollout import default_requests, rollout
from bitparity.rl.train import UpdateSettings, ppo_update


def _median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _linear(backend, m, k, n):
    x, w = torch.randn(m, k, requires_grad=True), torch.randn(n, k, requires_grad=True)
    g = torch.randn(m, n)
    ours = lambda: bp.linear(x, w, backend=backend).backward(g)                        # noqa: E731
    torch_ = lambda: torch.nn.functional.linear(x, w).backward(g)                       # noqa: E731
    return ours, torch_


def _attention(backend, groups, length, dim):
    q, k, v = (torch.randn(1, groups, length, dim, requires_grad=True) for _ in range(3))
    g = torch.randn(1, groups, length, dim)
    ours = lambda: bp.attention(q, k, v, backend=backend).backward(g)                   # noqa: E731
    torch_ = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)  # noqa: E731
    return ours, torch_


def _adamw(backend, n):
    p, q = torch.nn.Parameter(torch.randn(n)), torch.nn.Parameter(torch.randn(n))
    p.grad, q.grad = torch.randn(n), torch.randn(n)
    ours, theirs = bp.optim.AdamW([p], backend=backend), torch.optim.AdamW([q])
    return ours.step, theirs.step


def _rl_update(backend):
    def update(name):
        policy, reference = models(name, 0)
        opt = (torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0) if name == "native"
               else bp.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0, backend=name))
        done = rollout(policy, default_requests(0, vocab=ModelConfig().vocab), max_batch=MAX_BATCH, temperature=0.7)
        return lambda: ppo_update(policy, reference, done, opt, UpdateSettings())
    return update(backend), update("native")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cases = [("linear fwd+bwd, RL model q/k/v [256, 64] x [192, 64]", _linear(args.backend, 256, 64, 192)),
             ("linear fwd+bwd, lm_head [256, 64] x [4096, 64]", _linear(args.backend, 256, 64, 4096)),
             ("linear fwd+bwd, [2048, 1024] x [1024, 1024]", _linear(args.backend, 2048, 1024, 1024)),
             ("attention fwd+bwd, causal, 4 heads x 64 x 16", _attention(args.backend, 4, 64, 16)),
             ("attention fwd+bwd, causal, 8 heads x 512 x 64", _attention(args.backend, 8, 512, 64)),
             ("AdamW step, 1M parameters", _adamw(args.backend, 1 << 20)),
             ("RL update of TinyMoEPolicy (12 sequences)", _rl_update(args.backend))]
    rows = []
    for name, (ours, theirs) in cases:
        a, b = _median_ms(ours, args.repeats), _median_ms(theirs, args.repeats)
        rows.append((name, f"{a:.2f}", f"{b:.2f}", f"{a / b:.1f}x"))
    print(f"backend {args.backend}, torch {torch.__version__}, {torch.get_num_threads()} threads, median of "
          f"{args.repeats}")
    print(tabulate(rows, headers=("case", f"{args.backend} ms", "torch ms", "ratio"), tablefmt="github"))


if __name__ == "__main__":
    main()
