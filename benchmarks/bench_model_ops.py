"""Model building blocks (spec 24) at the sizes of a tiny transformer: each canonical backend against native.

The shapes are those of the end-to-end RL model (spec 25): a [256, 64] activation through a [4096, 64]
weight (and one decode row), attention over 32 groups (4 heads x 8 sequences) of 48 keys of 16 dims as a
48-query prefill and a one-query decode step, and ops.moe (8 experts, top-2, intermediate 32) on 256 tokens.
native is torch's own ops (F.linear, SDPA, HF's RMSNorm and SwiGLU arithmetic) on the same CPU, in the same
run. Without a GPU the cuda backend runs in the Triton interpreter and ascend in the host emulation (see the
availability lines): their times are the interpreter's and the emulation's, not a GPU's or an NPU's.
Run: python benchmarks/bench_model_ops.py
"""

import numpy as np
import torch
from tabulate import tabulate

from bitparity import ops
from bitparity.backends import _module, availability
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure

BACKENDS = ("native", "cpu", "cuda", "ascend", "numpy")


def _randn(rng, *shape, scale=1.0):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def cases():
    """(op, shape label, arguments) of each row; op "moe" is ops.moe, the others are contract calls."""
    rng = np.random.default_rng(0)
    weight = _randn(rng, 4096, 64, scale=0.1)
    k, v = _randn(rng, 32, 48, 16), _randn(rng, 32, 48, 16)
    lengths = torch.full((32,), 48)
    experts = (_randn(rng, 8, 64), _randn(rng, 8, 32, 64, scale=0.1), _randn(rng, 8, 32, 64, scale=0.1),
               _randn(rng, 8, 64, 32, scale=0.1))
    return [
        ("linear", "[256, 64] x [4096, 64]", (_randn(rng, 256, 64), weight, None)),
        ("linear", "[1, 64] x [4096, 64]", (_randn(rng, 1, 64), weight, None)),
        ("attention", "prefill [32, 48, 48, 16]", (_randn(rng, 32, 48, 16), k, v, lengths, True, 0.25)),
        ("attention", "decode [32, 1, 48, 16]", (_randn(rng, 32, 1, 16), k, v, lengths, True, 0.25)),
        ("rms_norm", "[256, 64]", (_randn(rng, 256, 64), _randn(rng, 64), 1e-6)),
        ("rotary", "[256, 64]", (_randn(rng, 256, 64), _randn(rng, 256, 32), _randn(rng, 256, 32))),
        ("silu_mul", "[256 * 256]", (_randn(rng, 65536), _randn(rng, 65536))),
        ("moe", "[256, 64], E 8, top-2, I 32", (_randn(rng, 256, 64), *experts, 2)),
    ]


def _call(name, op, args):
    if op == "moe":
        return lambda: ops.moe(*args, backend=name)
    return lambda: getattr(_module(name), op)(*args)


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    names = [name for name in BACKENDS if availability(name)[0]]
    for name in names:
        print(f"{name}: {availability(name)[1]}")
    rows = []
    for op, label, args in cases():
        times = {name: measure(_call(name, op, args), repeats=5, budget_s=10).median_ms for name in names}
        for name, ms in times.items():
            rows.append((op, label, name, f"{ms:.3g}", f"{ms / times['native']:.3g}"))
    print(tabulate(rows, headers=("op", "shape", "backend", "median ms", "x native (time)"), tablefmt="github"))


if __name__ == "__main__":
    main()
