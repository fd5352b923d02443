"""linear (spec 24.1, 2.0.0) on the cpu backend against torch float32, forward and forward + backward, at the
issue-24 shapes: [128, 1024] x [32768, 1024] (an lm_head), [2048, 1024] x [1024, 1024] and [512, 4096] x
[4096, 4096].

Each repetition times torch and bitparity back to back (interleaved), so load from other processes falls on
both; the ratio is of the medians. With --threads 1 the times are the process's CPU time (time.process_time), which
other processes' load inflates far less than wall time on a shared machine. The `20 int8` column is the floor of
any method that multiplies the 20 digit-slice pairs as int8 GEMMs: 20 times one torch._int_mm (oneDNN, VNNI here)
of one x slice by one weight slice at the shape, over torch's float32 time, in the same run (forward rows).
The forward calls reuse one weight, as a rollout does (the cpu backend caches its quantised form, checked by a full
bit comparison each call). Forward + backward is y.backward(g) through
torch's autograd: torch's F.linear against bitparity.linear (dx, dW and db by spec 29.2).
Run: python benchmarks/bench_linear.py [--repeats N] [--threads T]
"""

import argparse
import time

import torch
from tabulate import tabulate

import bitparity as bp
from bitparity import spec
from bitparity.backends import cpu
from bitparity.backends.cpu import int_linear
from bitparity.compare.report import cpu_name

SHAPES = ((128, 1024, 32768), (2048, 1024, 1024), (512, 4096, 4096))


CLOCK = [time.perf_counter]                     # time.process_time with --threads 1


def _seconds(fn):
    start = CLOCK[0]()
    fn()
    return CLOCK[0]() - start


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def _forward(x, w):
    return (lambda: torch.nn.functional.linear(x, w)), (lambda: bp.linear(x, w, backend="cpu"))


def _backward(x, w, b, g):
    def torch_step():
        torch.nn.functional.linear(x, w, b).backward(g)

    def bitparity_step():
        bp.linear(x, w, b, backend="cpu").backward(g)
    return torch_step, bitparity_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's); 1: CPU time")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if torch.get_num_threads() == 1:
        CLOCK[0] = time.process_time
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
          f"torch._int_mm exact here: {int_linear.int_mm_is_exact()}, clock: {CLOCK[0].__name__}")
    lib = cpu.build()._lib
    rows = []
    gen = torch.Generator().manual_seed(0)
    for m, k, n in SHAPES:
        x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) / k ** 0.5
        b, g = torch.randn(n, generator=gen), torch.randn(m, n, generator=gen)
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        x_slice = int_linear.quantise(lib, x, spec.LINEAR_BX, 1)[0][0]
        w_slice = int_linear.quantise(lib, w, spec.LINEAR_BW, 1)[0][0]
        for label, (reference, ours) in (("forward", _forward(x, w)), ("forward+backward", _backward(xg, wg, bg, g))):
            reference(), ours()                                     # warm-up: builds, probe, weight cache
            int8 = (lambda: int_linear._int_mm(x_slice, w_slice)) if label == "forward" else reference
            times = [(_seconds(reference), _seconds(ours), _seconds(int8)) for _ in range(args.repeats)]
            t_ref, t_ours, t_int8 = (_median([t[i] for t in times]) for i in range(3))
            floor = f"{20 * t_int8 / t_ref:.2f}" if label == "forward" else ""
            rows.append((f"[{m}, {k}] x [{n}, {k}]", label, f"{t_ref * 1e3:.0f}", f"{t_ours * 1e3:.0f}",
                         f"{t_ours / t_ref:.2f}", floor))
            print(*rows[-1], sep=" | ", flush=True)                 # as it goes: the large shapes take minutes
    print(tabulate(rows, headers=("shape", "pass", "torch ms", "bitparity cpu ms", "ratio", "20 int8 / torch"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
