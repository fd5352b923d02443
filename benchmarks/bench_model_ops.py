"""Model building blocks (spec 24) at the sizes of a tiny transformer: each canonical backend against native.

The shapes are those of the end-to-end RL test's model: a [256, 64] activation through a
[4096, 64] weight (and one decode row), attention over 32 groups of 48 keys of 16 dims,
as a 48-query prefill and a one-query decode step. On a machine without a GPU the cuda backend
runs in the Triton interpreter on the CPU (see its availability line), so its times there are
the interpreter's, not a GPU's. Backends that lack an op are left out of its rows.
Run: python benchmarks/bench_model_ops.py
"""

import numpy as np
import torch
from tabulate import tabulate

from bitparity.backends import _module, availability
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure

BACKENDS = ("native", "cuda", "cpu", "numpy")


def _randn(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def cases():
    """(op, shape label, arguments) of each row."""
    rng = np.random.default_rng(0)
    weight = _randn(rng, 4096, 64)
    k, v = _randn(rng, 32, 48, 16), _randn(rng, 32, 48, 16)
    lengths = torch.full((32,), 48)
    return [
        ("linear", "[256, 64] x [4096, 64]", (_randn(rng, 256, 64), weight, None)),
        ("linear", "[1, 64] x [4096, 64]", (_randn(rng, 1, 64), weight, None)),
        ("attention", "prefill [32, 48, 48, 16]", (_randn(rng, 32, 48, 16), k, v, lengths, True, 0.25)),
        ("attention", "decode [32, 1, 48, 16]", (_randn(rng, 32, 1, 16), k, v, lengths, True, 0.25)),
        ("rms_norm", "[256, 64]", (_randn(rng, 256, 64), _randn(rng, 64), 1e-6)),
        ("rotary", "[256, 64]", (_randn(rng, 256, 64), _randn(rng, 256, 32), _randn(rng, 256, 32))),
        ("silu_mul", "[256 * 256]", (_randn(rng, 65536), _randn(rng, 65536))),
    ]


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    names = [name for name in BACKENDS if availability(name)[0]]
    for name in names:
        print(f"{name}: {availability(name)[1]}")
    rows = []
    for op, label, args in cases():
        times = {name: measure(lambda f=getattr(_module(name), op): f(*args), repeats=5, budget_s=10).median_ms
                 for name in names if hasattr(_module(name), op)}
        for name, ms in times.items():
            rows.append((op, label, name, f"{ms:.2f}", f"{ms / times['native']:.3g}"))
    print(tabulate(rows, headers=("op", "shape", "backend", "median ms", "x native (time)"), tablefmt="github"))


if __name__ == "__main__":
    main()
