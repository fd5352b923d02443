"""CPU cost of the model building blocks (spec 24): the canonical `cpu` backend against the `native` backend
(torch's own ops: F.linear, SDPA, HF's RMSNorm and SwiGLU arithmetic) on the same CPU, in one run.

Each row is one contract call at a Qwen3-like shape (hidden 64, 4096 outputs; 4 heads x 8 sequences of 48
tokens, head dim 16); moe is ops.moe (8 experts, top-2) on each backend. Ratios are cpu / native.
Run: python benchmarks/bench_model_ops.py
"""

import torch
from tabulate import tabulate

from bitparity import ops
from bitparity.backends import _module
from bitparity.compare.report import cpu_name
from bitparity.compare.timing import measure


def _cases():
    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    w = randn(4096, 64, scale=0.1)
    q, kv = randn(32, 48, 16), randn(2, 32, 48, 16)
    lengths = torch.full((32,), 48)
    experts = (randn(8, 64), randn(8, 32, 64, scale=0.1), randn(8, 32, 64, scale=0.1), randn(8, 64, 32, scale=0.1))
    moe_x = randn(256, 64)
    return [
        ("linear [256, 64] x [4096, 64]", "linear", (randn(256, 64), w, None)),
        ("linear [1, 64] x [4096, 64]", "linear", (randn(1, 64), w, None)),
        ("attention prefill [32, 48, 48, 16] causal", "attention", (q, kv[0], kv[1], lengths, True, 0.25)),
        ("attention decode [32, 1, 48, 16]", "attention", (q[:, -1:].contiguous(), kv[0], kv[1], lengths, True, 0.25)),
        ("rms_norm [256, 64]", "rms_norm", (randn(256, 64), randn(64), 1e-6)),
        ("silu_mul [256 x 4096]", "silu_mul", (randn(256 * 4096), randn(256 * 4096))),
        ("moe [256, 64], E = 8, top-2, I = 32", None, (moe_x, *experts, 2)),
    ]


def _call(name, op, args):
    if op is None:
        return lambda: ops.moe(*args, backend=name)
    return lambda: getattr(_module(name), op)(*args)


def main():
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    rows = []
    for label, op, args in _cases():
        native_ms, cpu_ms = (measure(_call(name, op, args), repeats=9, budget_s=2.0).median_ms
                             for name in ("native", "cpu"))
        rows.append((label, f"{native_ms:.3f}", f"{cpu_ms:.3f}", f"{cpu_ms / native_ms:.3g}"))
    print(tabulate(rows, headers=("op", "native ms", "cpu ms", "cpu / native"), tablefmt="github"))


if __name__ == "__main__":
    main()
