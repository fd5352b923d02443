"""The `cpu` backend with one thread and with torch.get_num_threads() threads, with and without a competing load.

Issue 18: under load the backend's threads made a call several times slower than one thread.  This script
times representative ops both ways, first on the machine as it is, then while one busy-loop process per
logical core competes for every core (started here, each ending by itself after --load-seconds, and killed on
exit), and prints medians with their interquartile range and the ratio of the threaded time to the one-thread
time (above 1: the threads made the call slower).  The one- and many-thread calls take turns in every repeat,
so drift in the machine's load falls on both alike.  The first phase reports the share of the CPUs that other
processes used while it ran: a shared machine is not idle.  The script also checks that the thread count
changes no bit.

    python benchmarks/bench_cpu_threads.py [--repeats 21] [--load-seconds 300]
"""

import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np
import torch
from tabulate import tabulate

import bitparity as bp
from bitparity.backends import _module, availability
from bitparity.compare.report import cpu_name

# A busy loop that ends by itself after its deadline, so no competitor outlives a killed benchmark for long.
_BUSY = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def cases():
    """(op, shape label, call) of each row: the softmax family at a vocabulary-wide batch and at `bitparity
    bench`'s [16, 32000], linear at the RL model's shapes (spec 25: a [256, 64] activation and one decode
    row through a [4096, 64] weight), and the backend's sample (top-k 50, top-p 0.9) for 64 and 8 sequences,
    then bp.sample for 8, which adds ops.py's torch ops on [8, 32768] (torch's own threads)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32768, generator=generator) * 3
    small = torch.randn(16, 32000, generator=generator) * 3
    weight = torch.randn(4096, 64, generator=generator) * 0.1
    activation, row = torch.randn(256, 64, generator=generator), torch.randn(1, 64, generator=generator)
    seeds, positions = torch.arange(64), torch.full((64,), 17)
    cpu = _module("cpu")

    def sample(rows):
        per_row = (torch.full((rows,), 1 / 0.7), torch.full((rows,), 50), torch.full((rows,), 0.9),
                   torch.zeros(rows), torch.zeros(rows, dtype=torch.bool))
        return lambda: cpu.sample(x[:rows], *per_row, seeds[:rows], positions[:rows])

    return [
        ("softmax", "[256, 32768]", lambda: bp.softmax(x, backend="cpu")),
        ("log_softmax", "[256, 32768]", lambda: bp.log_softmax(x, backend="cpu")),
        ("softmax", "[16, 32000]", lambda: bp.softmax(small, backend="cpu")),
        ("linear", "[256, 64] x [4096, 64]", lambda: bp.linear(activation, weight, backend="cpu")),
        ("linear", "[1, 64] x [4096, 64]", lambda: bp.linear(row, weight, backend="cpu")),
        ("backend sample", "[64, 32768]", sample(64)),
        ("backend sample", "[8, 32768]", sample(8)),
        ("bp.sample", "[8, 32768]", lambda: bp.sample(x[:8], seeds[:8], positions[:8], temperature=0.7, top_k=50,
                                                      top_p=0.9, backend="cpu")),
    ]


def _bits(result):
    parts = result if isinstance(result, tuple) else (result,)
    return tuple(p.view(torch.int32) if p.dtype == torch.float32 else p for p in parts)


def _timed(fn, threads):
    torch.set_num_threads(threads)
    start = time.perf_counter()
    result = fn()
    return 1e3 * (time.perf_counter() - start), result


def one_and_many(fn, threads, repeats):
    """ms of each repeat of fn with 1 thread and with threads, taken in turn after a warm-up of each; raises
    if the two give different bits."""
    _, one = _timed(fn, 1)
    _, many = _timed(fn, threads)
    if not all(torch.equal(a, b) for a, b in zip(_bits(one), _bits(many))):
        raise AssertionError("the thread count changed bits")
    times = ([], [])
    for _ in range(repeats):
        times[0].append(_timed(fn, 1)[0])
        times[1].append(_timed(fn, threads)[0])
    torch.set_num_threads(threads)
    return times


def _busy_jiffies():
    """(busy, total) CPU time of the whole machine in clock ticks, from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]                            # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def _own_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def phase(label, threads, repeats):
    """The table rows of every case in one phase, and the share of the CPUs other processes used meanwhile."""
    busy0, total0 = _busy_jiffies()
    own0 = _own_cpu_s()
    rows = []
    for op, shape, fn in cases():
        one, many = one_and_many(fn, threads, repeats)
        q1, med1, q3 = np.percentile(one, (25, 50, 75))
        qn1, medn, qn3 = np.percentile(many, (25, 50, 75))
        rows.append((op, shape, label, f"{med1:.3g} ({q1:.3g}-{q3:.3g})", f"{medn:.3g} ({qn1:.3g}-{qn3:.3g})",
                     f"{medn / med1:.2f}"))
    busy1, total1 = _busy_jiffies()
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    others = (busy1 - busy0 - (_own_cpu_s() - own0) * ticks_per_s) / max(total1 - total0, 1)
    return rows, max(others, 0.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--load-seconds", type=float, default=300.0,
                        help="upper bound on the competing load's life, should the script be killed")
    args = parser.parse_args()

    ok, how = availability("cpu")
    if not ok:
        raise SystemExit(f"cpu backend unavailable: {how}")
    threads, cores = torch.get_num_threads(), os.cpu_count()
    print(f"CPU: {cpu_name()}; {cores} logical cores; torch {torch.__version__}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"bitparity cpu: {how}")

    idle_rows, others = phase("no added load", threads, args.repeats)
    print(f"no added load: other processes used {100 * others:.0f}% of the CPUs "
          f"(load average {os.getloadavg()[0]:.2f} at its end)")
    load = [subprocess.Popen([sys.executable, "-c", _BUSY, str(args.load_seconds)]) for _ in range(cores)]
    try:
        time.sleep(0.5)                                   # let every competitor reach its loop
        load_rows, _ = phase(f"{cores} busy loops", threads, args.repeats)
    finally:
        for process in load:
            process.kill()
        for process in load:
            process.wait()
    print(tabulate(idle_rows + load_rows,
                   headers=("op", "shape", "machine", "1 thread ms (IQR)", f"{threads} threads ms (IQR)",
                            f"{threads} / 1"), tablefmt="github"))


if __name__ == "__main__":
    main()
