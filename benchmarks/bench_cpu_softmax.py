"""Cost of the `cpu` backend against torch's own CPU ops, in one process.

For log_softmax and token_logprobs at the two shapes RL trainers meet most
([64, 151936]: a Qwen-vocabulary micro-batch; [4096, 32000]: a Llama-2-
vocabulary batch of tokens), prints torch's time, the cpu backend's time and
their ratio: medians of runs taken in turn after a warm-up, with the same thread
count for both (torch.get_num_threads(); set OMP_NUM_THREADS to change it).
The baseline is what an RL stack calls: torch.log_softmax, and
torch.log_softmax + gather for the log-probs of the sampled tokens.

    python benchmarks/bench_cpu_softmax.py [--repeats 9]
"""

import argparse
import os
import statistics
import time

import torch
from tabulate import tabulate

from bitparity.backends import cpu
from bitparity.compare.report import cpu_name

SHAPES = ((64, 151936), (4096, 32000))


def median_ms(fns, repeats):
    """Median ms of each fn; the fns take turns in every repeat, so drift in the
    machine's load (a shared 2-core VM) falls on all of them alike."""
    for fn in fns:
        fn()                               # warm-up: page faults, caches, thread pool
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, t in zip(fns, times):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    ok, how = cpu.availability()
    if not ok:
        raise SystemExit(f"cpu backend unavailable: {how}")
    print(f"CPU: {cpu_name()}; {os.cpu_count()} logical cores; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"bitparity cpu: {how}")

    rows = []
    generator = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(shape, generator=generator) * 3
        tokens = torch.randint(0, shape[1], (shape[0],), generator=generator)
        scale = torch.ones(shape[0])                       # the contract's per-row scale, T = 1
        cases = (
            ("log_softmax",
             lambda: torch.log_softmax(x, dim=-1),
             lambda: cpu.log_softmax(x, None, scale)),
            ("token_logprobs",
             lambda: torch.log_softmax(x, dim=-1).gather(-1, tokens[:, None])[:, 0],
             lambda: cpu.token_logprobs(x, tokens, scale)),
        )
        for op, native, canonical in cases:
            t_native, t_cpu = median_ms((native, canonical), args.repeats)
            rows.append((op, f"[{shape[0]}, {shape[1]}]", f"{t_native:.1f}", f"{t_cpu:.1f}",
                         f"{t_cpu / t_native:.2f}"))
        del x                              # [4096, 32000] float32 is 524 MB: one input at a time
    print(tabulate(rows, headers=("op", "shape", "torch ms", "bitparity cpu ms", "cpu / torch"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
