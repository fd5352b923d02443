"""CPU cost of sample at [64, 151936] with top-k 50, top-p 0.9: the canonical backends against torch's
sort-based sampling (the `native` backend: vLLM v1's PyTorch path) in the same run.

Two timings per backend: the contract op `sample` (tokens only, what vLLM's sampler computes), and
bitparity.sample with logprobs="processed" (tokens plus the log-probability a trainer recomputes).
The canonical backend is `cpu` where it has the op, else `numpy`; the table says which ran.
Run: python benchmarks/bench_sample.py
"""

import numpy as np
import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.backends import _module
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure

ROWS, VOCAB = 64, 151936
PARAMS = {"temperature": 0.7, "top_k": 50, "top_p": 0.9}


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, VOCAB, generator=g) * 3
    seeds, positions = torch.arange(ROWS), torch.arange(ROWS) * 17
    # The contract's per-row arguments, as ops.sample builds them.
    scale = torch.full((ROWS,), float(np.float32(1) / np.float32(PARAMS["temperature"])))
    contract = (x, scale, torch.full((ROWS,), PARAMS["top_k"]), torch.full((ROWS,), PARAMS["top_p"]),
                torch.zeros(ROWS), torch.zeros(ROWS, dtype=torch.bool), seeds, positions)
    names = ["native", *(name for name in ("cpu", "numpy") if hasattr(_module(name), "sample"))][:2]
    rows, base = [], {}
    for name in names:
        tokens_ms = measure(lambda: _module(name).sample(*contract), repeats=5).median_ms
        full_ms = measure(lambda: bp.sample(x, seeds, positions, backend=name, **PARAMS), repeats=5).median_ms
        base.setdefault("tokens", tokens_ms)
        base.setdefault("full", full_ms)
        rows.append((name, f"{tokens_ms:.1f}", f"{tokens_ms / base['tokens']:.3g}",
                     f"{full_ms:.1f}", f"{full_ms / base['full']:.3g}"))
    print(f"sample at [{ROWS}, {VOCAB}], T = {PARAMS['temperature']}, top-k {PARAMS['top_k']}, top-p {PARAMS['top_p']}")
    print(tabulate(rows, headers=("backend", "tokens ms", "x native", "tokens + processed logprobs ms", "x native"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
