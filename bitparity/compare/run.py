"""Run every op on the case suite on every available backend and measure agreement, accuracy and cost.

For each op x backend it reports:
- exact: % of elements whose bits equal the canonical result (the `numpy` backend, the spec executed);
- max ulp: the worst error against the float64 meaning, in the op's ulp measure (docs/spec.md, section 10);
- logdiff: max |logp - logp_canonical| for ops in log space, the train/inference quantity;
- time: median wall time of the op on the timing case, and its ratio to `native` on the same device.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import ops
from ..backends import availability, device_type
from ..reference import float64
from . import cases, metrics

OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs", "exp", "log")
LOG_SPACE = ("logsumexp", "log_softmax", "token_logprobs")
ROW_SHAPES = {"quick": ((8, 1000), (4, 32000), (1, 151936)),
              "full": ((3, 63), (64, 1025), (16, 16385), (8, 32000), (4, 151936))}
TIMING_SHAPE = {"quick": (16, 32000), "full": (64, 32000)}
ELEMENTWISE_N = {"quick": 1 << 16, "full": 1 << 20}
TEMPERATURES = (1.0, 0.7)


@dataclass
class Result:
    op: str
    backend: str
    elements: int = 0
    identical: int = 0
    max_ulp: float = 0.0
    logdiff: float = 0.0
    median_ms: float = float("nan")
    ratio_to_native: float = float("nan")
    notes: list = field(default_factory=list)

    @property
    def exact_percent(self):
        return 100.0 * self.identical / self.elements if self.elements else float("nan")


def _finite_scale(w):
    """max(1, max |w| over finite entries) per row: the conditioning of log-space results."""
    a = np.where(np.isfinite(w), np.abs(w), 0.0)
    return np.maximum(1.0, a.max(axis=1))


def ulp_floor(op, x, mask, scale, ref):
    """The per-element floor of the ulp measure for op (docs/spec.md, section 10)."""
    x64 = x.numpy().astype(np.float64)
    if mask is not None:
        x64 = np.where(mask.numpy(), x64, 0.0)
    if op == "sum":
        return np.abs(x64).sum(axis=1)
    if op in LOG_SPACE:
        mag = _finite_scale(x64 * scale)
        return mag[:, None] if op == "log_softmax" else mag
    if op == "softmax":
        return np.nan_to_num(ref, nan=0.0).max(axis=1, keepdims=True)
    return None


def _inputs(op, kind, shape, temperature, seed):
    if op in ("exp", "log"):
        return (cases.make_elementwise(op, shape, seed),), None
    x, mask = cases.make_logits(kind, *shape, seed)
    if op == "token_logprobs":
        return (x, cases.make_tokens(x, seed)), temperature
    if op == "sum":
        return (x, mask), None
    return (x, mask), temperature


def _call(op, backend, args, temperature, device="cpu"):
    moved = tuple(a.to(device) if a is not None else None for a in args)
    fn = getattr(ops, op)
    if temperature is None:
        return fn(*moved, backend=backend)
    return fn(*moved, temperature=temperature, backend=backend)


def _device(backend):
    return "cpu" if backend == "native" else device_type(backend)


def _reference64(op, args, temperature):
    arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    if op in ("exp", "log"):
        return getattr(float64, op)(arrays[0])
    if op == "sum":
        return float64.sum(*arrays)
    return getattr(float64, op)(*arrays, ops.inverse_temperature(temperature))


def _case_list(op, suite):
    if op in ("exp", "log"):
        return [(None, ELEMENTWISE_N[suite], None)]
    out = []
    for shape in ROW_SHAPES[suite]:
        for kind in cases.ROW_KINDS:
            if op == "token_logprobs" and kind == "masked":
                continue
            temps = (None,) if op == "sum" else (TEMPERATURES if kind == "random" else (1.0,))
            out.extend((kind, shape, t) for t in temps)
    return out


def _time(fn, budget_s=0.5, max_runs=7):
    fn()                                    # warm-up: builds, caches, first-call costs
    times = []
    start = time.perf_counter()
    while len(times) < max_runs and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000.0 * float(np.median(times))


def compare(backends=None, ops_=OPS, suite="quick", seed=0, progress=None):
    """Run the suite; returns a list of Result, one per (op, backend)."""
    names = [b for b in (backends or ("numpy", "cpu", "cuda", "ascend", "native")) if availability(b)[0]]
    if "numpy" not in names:
        names.insert(0, "numpy")
    results = []
    for op in ops_:
        per_backend = {b: Result(op, b) for b in names}
        for kind, shape, temperature in _case_list(op, suite):
            args, temp = _inputs(op, kind, shape, temperature, seed)
            ref64 = _reference64(op, args, temp)
            floor = None if op in ("exp", "log") else ulp_floor(op, args[0], args[1] if op != "token_logprobs" else None,
                                                                  ops.inverse_temperature(temp or 1.0), ref64)
            canonical = _call(op, "numpy", args, temp)
            for b in names:
                got = canonical if b == "numpy" else _call(op, b, args, temp, _device(b)).cpu()
                r = per_backend[b]
                r.elements += got.numel()
                r.identical += int((metrics.canonical_bits(got) == metrics.canonical_bits(canonical)).sum())
                err = metrics.ulp_error(got.double().numpy(), ref64, floor)
                r.max_ulp = max(r.max_ulp, metrics.max_or_zero(err))
                if op in LOG_SPACE:
                    r.logdiff = max(r.logdiff, metrics.logdiff(got, canonical))
            if progress:
                progress(f"{op} {kind or ''} {shape} T={temp}")
        timing_args, timing_temp = _inputs(op, "random", TIMING_SHAPE[suite] if op not in ("exp", "log")
                                           else ELEMENTWISE_N[suite], 1.0, seed)
        native_ms = {}
        for b in names:
            dev = _device(b)
            moved = tuple(a.to(dev) if a is not None else None for a in timing_args)
            per_backend[b].median_ms = _time(lambda: _call(op, b, moved, timing_temp, dev))
            if dev not in native_ms:
                native_ms[dev] = _time(lambda: _call(op, "native", moved, timing_temp, dev))
            per_backend[b].ratio_to_native = per_backend[b].median_ms / native_ms[dev]
        results.extend(per_backend.values())
    return results
