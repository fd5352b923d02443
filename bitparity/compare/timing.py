"""Timing calls on a device: warm-up, repeats, median and spread, and whether the spread says the
machine was busy.

The clock follows the device the call's tensors live on: CUDA events on a GPU,
NPU events (torch.npu.Event) on Ascend, time.perf_counter on the CPU.  Device
clocks time the queued work itself, so every repeat is bracketed by a pair of
events and the device is synchronised before they are read.
"""

import time
from dataclasses import dataclass

import numpy as np
import torch

# A measurement whose interquartile range exceeds this share of its median is noisy; when the typical
# (median) measurement of a run is, the machine was busy: its times, and their ratios, are not to be trusted.
# Calibrated on the 2-core AMD EPYC of docs/benchmarks.md: idle (load 0.5) the median spread was 14%, with two
# busy-loop processes or the test suite beside it 33-37%.
NOISY_SPREAD = 0.25


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    runs: int
    clock: str

    @property
    def spread(self):
        """The interquartile range over the median: run-to-run noise relative to the time."""
        return (self.q3_ms - self.q1_ms) / self.median_ms


def _device_module(device):
    return getattr(torch, device) if device in ("cuda", "npu") else None


def clock_name(device):
    return {"cuda": "CUDA events", "npu": "NPU events"}.get(device, "perf_counter")


def _once(fn, module):
    """Milliseconds of one call of fn."""
    if module is None:
        t0 = time.perf_counter()
        fn()
        return 1000.0 * (time.perf_counter() - t0)
    start, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _finished(times, repeats, budget_s, min_runs):
    return len(times) >= repeats or (budget_s is not None and len(times) >= min_runs
                                     and sum(times) > 1000.0 * budget_s)


def measure_interleaved(fns, device="cpu", warmup=1, repeats=7, budget_s=None, min_runs=3):
    """{name: Timing} of each call in fns ({name: fn}) on device, after warmup calls of each.

    The runs interleave: each round times every unfinished call once, in fns' order, so a change of
    load on a shared machine falls on all of them alike instead of on whichever ran then.  A call is
    finished after repeats runs, or earlier once it has min_runs runs and budget_s seconds of them."""
    module = _device_module(device)
    for fn in fns.values():
        for _ in range(warmup):               # builds, caches, first-call costs
            fn()
    if module is not None:
        module.synchronize()
    times = {name: [] for name in fns}
    active = list(fns)
    while active:
        for name in active:
            times[name].append(_once(fns[name], module))
        active = [name for name in active if not _finished(times[name], repeats, budget_s, min_runs)]
    return {name: _summary(t, clock_name(device)) for name, t in times.items()}


def measure(fn, device="cpu", warmup=1, repeats=7, budget_s=None, min_runs=3):
    """Time fn() on device after warmup calls: up to repeats runs, fewer (but at least min_runs)
    once budget_s seconds of runs have passed."""
    return measure_interleaved({fn: fn}, device, warmup, repeats, budget_s, min_runs)[fn]


def _summary(times, clock):
    q1, median, q3 = np.percentile(times, (25, 50, 75))
    return Timing(float(median), float(q1), float(q3), min(times), max(times), len(times), clock)


def busy(timings):
    """Why the spread of timings says the machine was busy, or None: when the median of their spreads
    (interquartile range over median) exceeds NOISY_SPREAD."""
    spreads = [t.spread for t in timings]
    if not spreads or float(np.median(spreads)) <= NOISY_SPREAD:
        return None
    noisy = sum(s > NOISY_SPREAD for s in spreads)
    return (f"the machine looks busy: the median timing spread (interquartile range over median) is "
            f"{100 * float(np.median(spreads)):.0f}%, and {noisy} of {len(spreads)} timings spread more than "
            f"{100 * NOISY_SPREAD:.0f}%; times and ratios to native are unreliable, rerun on an idle machine")
