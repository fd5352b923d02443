"""GAE cost on the CPU: bitparity's canonical backends against the Python reverse loop (the native baseline).

The baseline is the loop TRL, verl and OpenRLHF all write: one torch step per
time step over a [B] slice. Prints a table of median times and the speed-up.
Run: python benchmarks/bench_gae.py
"""

import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.compare import cases
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure

SHAPES = ((256, 4096), (4096, 512))
BACKENDS = ("native", "cpu", "numpy")


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    rows = []
    for b, t in SHAPES:
        d = cases.make_rl_batch(b, t, seed=0)
        times = {name: measure(lambda: bp.gae(d["rewards"], d["values"], d["mask"], 0.99, 0.95, backend=name),
                               repeats=5).median_ms
                 for name in BACKENDS}
        for name in BACKENDS:
            rows.append((f"[{b}, {t}]", name, f"{times[name]:.2f}", f"{times['native'] / times[name]:.1f}x"))
    print(tabulate(rows, headers=("shape", "backend", "median ms", "speed-up vs Python loop"), tablefmt="github"))


if __name__ == "__main__":
    main()
