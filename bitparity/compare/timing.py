"""Timing one call on a device: warm-up, repeats, median and spread.

The clock follows the device the call's tensors live on: CUDA events on a GPU,
NPU events (torch.npu.Event) on Ascend, time.perf_counter on the CPU.  Device
clocks time the queued work itself, so every repeat is bracketed by a pair of
events and the device is synchronised before they are read.
"""

import time
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    runs: int
    clock: str


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


def measure(fn, device="cpu", warmup=1, repeats=7, budget_s=None, min_runs=3):
    """Time fn() on device after warmup calls: up to repeats runs, fewer (but at least min_runs)
    once budget_s seconds of runs have passed."""
    module = _device_module(device)
    for _ in range(warmup):                   # builds, caches, first-call costs
        fn()
    if module is not None:
        module.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < repeats:
        times.append(_once(fn, module))
        if budget_s is not None and len(times) >= min_runs and time.perf_counter() - start > budget_s:
            break
    q1, median, q3 = np.percentile(times, (25, 50, 75))
    return Timing(float(median), float(q1), float(q3), min(times), max(times), len(times), clock_name(device))
