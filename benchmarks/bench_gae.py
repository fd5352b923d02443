"""GAE cost on the CPU: bitparity's canonical backends against the Python reverse loop (the native baseline).

The baseline is the loop TRL, verl and OpenRLHF all write: one torch step per
time step over a [B] slice. Prints a table of median times and the speed-up.
Run: python benchmarks/bench_gae.py
"""

import platform
import time

import numpy as np
import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.compare import cases

SHAPES = ((256, 4096), (4096, 512))
BACKENDS = ("native", "cpu", "numpy")


def median_ms(fn, runs=5):
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def main():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"machine: {cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    rows = []
    for b, t in SHAPES:
        d = cases.make_rl_batch(b, t, seed=0)
        times = {name: median_ms(lambda: bp.gae(d["rewards"], d["values"], d["mask"], 0.99, 0.95, backend=name))
                 for name in BACKENDS}
        for name in BACKENDS:
            rows.append((f"[{b}, {t}]", name, f"{times[name]:.2f}", f"{times['native'] / times[name]:.1f}x"))
    print(tabulate(rows, headers=("shape", "backend", "median ms", "speed-up vs Python loop"), tablefmt="github"))


if __name__ == "__main__":
    main()
