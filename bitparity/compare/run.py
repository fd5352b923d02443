"""Run every op on the case suite on every available backend and measure agreement, accuracy and cost.

For each op x backend it reports:
- exact: % of result elements whose bits equal the canonical result (the `numpy` backend, the spec executed);
- max ulp: the worst error against the float64 meaning, in the op's ulp measure (docs/spec.md, section 10);
- logdiff: max |logp - logp_canonical| for ops in log space, the train/inference quantity;
- time: median wall time of the op on the timing case, and its ratio to `native` on the same device.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .. import ops
from ..backends import availability, device_type
from ..reference import float64
from . import cases, metrics
from .timing import measure

SOFTMAX_OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs")
ELEMENTWISE_OPS = ("exp", "log")
RL_OPS = ("gae", "masked_mean", "masked_whiten", "kl_penalty", "ppo_policy_loss")
OPS = SOFTMAX_OPS + ELEMENTWISE_OPS + RL_OPS
LOG_SPACE = ("logsumexp", "log_softmax", "token_logprobs")

ROW_SHAPES = {"quick": ((8, 1000), (4, 32000), (1, 151936)),
              "full": ((3, 63), (64, 1025), (16, 16385), (8, 32000), (4, 151936))}
TIMING_SHAPE = {"quick": (16, 32000), "full": (64, 32000)}
ELEMENTWISE_N = {"quick": 1 << 16, "full": 1 << 20}
RL_SHAPES = {"quick": ((4, 1000), (2, 8192)), "full": ((64, 512), (8, 8192))}
RL_TIMING_SHAPE = {"quick": (64, 512), "full": (256, 4096)}
TEMPERATURES = (1.0, 0.7)


@dataclass
class Case:
    args: tuple                 # tensors and scalars, in the op's positional order
    kwargs: dict                # keyword arguments other than backend
    reference: np.ndarray       # float64 meaning, flattened
    floor: np.ndarray = None    # ulp floor per element (broadcast to reference), or None for plain ulps


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

    @property
    def exact_percent(self):
        return 100.0 * self.identical / self.elements if self.elements else float("nan")


def _flat64(out):
    parts = out if isinstance(out, tuple) else (out,)
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in parts])


def _flat_tensor(out):
    parts = out if isinstance(out, tuple) else (out,)
    return torch.cat([p.detach().cpu().reshape(-1) for p in parts])


def _finite_scale(w):
    """max(1, max |w| over finite entries) per row: the conditioning of log-space results."""
    a = np.where(np.isfinite(w), np.abs(w), 0.0)
    return np.maximum(1.0, a.max(axis=1))


def ulp_floor(op, x, mask, scale, ref):
    """The per-element floor of the ulp measure for a softmax-family op (docs/spec.md, section 10)."""
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


# -- case suites: one generator per op family ------------------------------------

def _softmax_cases(op, suite, seed, shapes=None):
    for shape in shapes or ROW_SHAPES[suite]:
        for kind in cases.ROW_KINDS:
            if op == "token_logprobs" and kind == "masked":
                continue
            for temperature in ((None,) if op == "sum" else (TEMPERATURES if kind == "random" else (1.0,))):
                x, mask = cases.make_logits(kind, *shape, seed)
                xn, mn = x.numpy(), None if mask is None else mask.numpy()
                if op == "sum":
                    ref = float64.sum(xn, mn)
                    yield Case((x, mask), {}, ref, ulp_floor(op, x, mask, 1.0, ref).reshape(-1))
                    continue
                scale = ops.inverse_temperature(temperature)
                if op == "token_logprobs":
                    tokens = cases.make_tokens(x, seed)
                    ref = float64.token_logprobs(xn, tokens.numpy(), scale)
                    yield Case((x, tokens), {"temperature": temperature}, ref,
                               ulp_floor(op, x, None, scale, ref))
                    continue
                ref = getattr(float64, op)(xn, mn, scale)
                floor = ulp_floor(op, x, mask, scale, ref)
                floor = None if floor is None else np.broadcast_to(floor, ref.shape).reshape(-1)
                yield Case((x, mask), {"temperature": temperature}, ref.reshape(-1), floor)


def _elementwise_cases(op, suite, seed, n=None):
    x = cases.make_elementwise(op, n or ELEMENTWISE_N[suite], seed)
    yield Case((x,), {}, getattr(float64, op)(x.numpy()))


def _rl_cases(op, suite, seed, shapes=None):
    for b, t in shapes or RL_SHAPES[suite]:
        rl = cases.make_rl_batch(b, t, seed)
        n = {k: v.numpy() for k, v in rl.items()}
        if op == "gae":
            for gamma, lam in ((1.0, 1.0), (0.99, 0.95)):
                g32 = np.float32(gamma)
                ref = float64.gae(n["rewards"], n["values"], n["mask"], np.zeros(b), float(g32),
                                  float(g32) * float(np.float32(lam)), "carry")
                yield Case((rl["rewards"], rl["values"], rl["mask"], gamma, lam), {}, _flat64(ref),
                           np.full(2 * b * t, np.abs(_flat64(ref)).max()))
        elif op == "masked_mean":
            yield Case((rl["advantages"], rl["mask"]), {}, float64.masked_mean(n["advantages"].reshape(1, -1),
                                                                               n["mask"].reshape(1, -1)))
        elif op == "masked_whiten":
            ref = float64.masked_whiten(n["advantages"].reshape(1, -1), n["mask"].reshape(1, -1), True, True, 1e-8)
            yield Case((rl["advantages"], rl["mask"]), {}, ref.reshape(-1), np.full(ref.size, 1.0))
        elif op == "kl_penalty":
            for kind in ("k1", "k2", "k3", "abs"):
                yield Case((rl["logp"], rl["ref_logp"], kind), {},
                           float64.kl_penalty(n["logp"], n["ref_logp"], kind, None, None).reshape(-1))
        else:
            for agg in ops.PPO_AGGS:
                ref = float64.ppo_policy_loss(n["logp"], n["old_logp"], n["advantages"], n["mask"],
                                              float(np.float32(1) - np.float32(0.2)),
                                              float(np.float32(1) + np.float32(0.2)), None, 20.0, agg)
                yield Case((rl["logp"], rl["old_logp"], rl["advantages"], rl["mask"]), {"agg": agg}, _flat64(ref))


def case_list(op, suite, seed=0):
    if op in SOFTMAX_OPS:
        return list(_softmax_cases(op, suite, seed))
    if op in ELEMENTWISE_OPS:
        return list(_elementwise_cases(op, suite, seed))
    return list(_rl_cases(op, suite, seed))


def timing_case(op, suite, seed=0):
    if op in SOFTMAX_OPS:
        return next(_softmax_cases(op, suite, seed, shapes=(TIMING_SHAPE[suite],)))
    if op in ELEMENTWISE_OPS:
        return next(_elementwise_cases(op, suite, seed, n=ELEMENTWISE_N[suite]))
    return next(_rl_cases(op, suite, seed, shapes=(RL_TIMING_SHAPE[suite],)))


# -- running ----------------------------------------------------------------------

def _device(backend):
    return "cpu" if backend == "native" else device_type(backend)


def _call(op, backend, case, device="cpu"):
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in case.args)
    return getattr(ops, op)(*args, **case.kwargs, backend=backend)


def _time(fn, budget_s=0.5, max_runs=7, device="cpu"):
    return measure(fn, device, warmup=1, repeats=max_runs, budget_s=budget_s, min_runs=1).median_ms


def compare(backends=None, ops_=OPS, suite="quick", seed=0, progress=None):
    """Run the suite; returns a list of Result, one per (op, backend)."""
    names = [b for b in (backends or ("numpy", "cpu", "cuda", "ascend", "native")) if availability(b)[0]]
    if "numpy" not in names:
        names.insert(0, "numpy")
    results = []
    for op in ops_:
        per_backend = {b: Result(op, b) for b in names}
        for case in case_list(op, suite, seed):
            canonical = _flat_tensor(_call(op, "numpy", case))
            for b in names:
                got = canonical if b == "numpy" else _flat_tensor(_call(op, b, case, _device(b)))
                r = per_backend[b]
                r.elements += got.numel()
                r.identical += int((metrics.canonical_bits(got) == metrics.canonical_bits(canonical)).sum())
                err = metrics.ulp_error(got.double().numpy(), case.reference, case.floor)
                r.max_ulp = max(r.max_ulp, metrics.max_or_zero(err))
                if op in LOG_SPACE:
                    r.logdiff = max(r.logdiff, metrics.logdiff(got, canonical))
            if progress:
                progress(f"{op}: case done")
        timing = timing_case(op, suite, seed)
        native_ms = {}
        for b in names:
            dev = _device(b)
            if dev not in native_ms:                 # native on the same device is the yardstick
                native_ms[dev] = _time(lambda: _call(op, "native", timing, dev))
            per_backend[b].median_ms = (native_ms[dev] if b == "native"
                                        else _time(lambda: _call(op, b, timing, dev)))
            per_backend[b].ratio_to_native = per_backend[b].median_ms / native_ms[dev]
        results.extend(per_backend.values())
    return results
