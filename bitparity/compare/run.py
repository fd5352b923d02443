"""Run every op on the conformance suite on every available backend and measure agreement, accuracy and cost.

For each op x backend it reports:
- exact: % of result elements whose bits equal the canonical result (the `numpy` backend, the spec executed);
- max ulp: the worst error against the float64 meaning, in the op's ulp measure (docs/spec.md, section 10),
  and a histogram of those errors;
- logdiff: max |logp - logp_canonical| for ops in log space, the train/inference quantity;
- time: median wall time of the op on the op's timing case, and its ratio to `native` on the same device.
For each case it records every backend's output digest (golden.digest), the unit `bitparity diff` compares.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from .. import ops
from ..backends import availability
from ..reference import float64
from . import cases, golden, metrics
from .cases import ELEMENTWISE_OPS, MODEL_OPS, RL_OPS, SAMPLING_OPS, SOFTMAX_OPS
from .cli_common import Progress
from .timing import measure

OPS = SOFTMAX_OPS + ELEMENTWISE_OPS + RL_OPS + SAMPLING_OPS + MODEL_OPS
LOG_SPACE = ("logsumexp", "log_softmax", "token_logprobs")
DEFAULT_BACKENDS = ("numpy", "cpu", "cuda", "ascend", "native")

# Upper edges of the ulp-error histogram bins after the exact-zero bin; then (1024, inf) and inf.
ULP_EDGES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 1024.0)
ULP_BIN_LABELS = ("0", "<=1/8", "<=1/4", "<=1/2", "<=1", "<=2", "<=4", "<=8", "<=16", "<=64", "<=1024",
                  ">1024", "inf")


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
    ulp_counts: np.ndarray = field(default_factory=lambda: np.zeros(len(ULP_BIN_LABELS), dtype=np.int64))

    @property
    def exact_percent(self):
        return 100.0 * self.identical / self.elements if self.elements else float("nan")


@dataclass
class Run:
    tier: str
    seed: int
    backends: list      # names, numpy first
    results: list       # Result per (op, backend), op by op
    cases: list         # {"name", "op", "shapes", "digests": {backend: hex}} per case, in suite order


def ulp_histogram(err):
    """Counts of err per ULP_BIN_LABELS bin: exactly 0, (edge_{k-1}, edge_k], beyond the last edge, inf."""
    err = np.asarray(err).reshape(-1)
    finite = err[np.isfinite(err) & (err > 0)]
    inner = np.bincount(np.searchsorted(ULP_EDGES, finite, side="left"), minlength=len(ULP_EDGES) + 1)
    return np.concatenate([[np.count_nonzero(err == 0)], inner, [np.count_nonzero(np.isinf(err))]])


def _flat64(out):
    parts = out if isinstance(out, tuple) else (out,)
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in parts])


def _flat_tensor(out):
    """An op's outputs as one float32 vector; token ids and indices (< 2**24) convert exactly."""
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


# -- float64 references: (args, kwargs) of a case -> (meaning flattened, ulp floor or None) --------

def _softmax_reference(op, args, kwargs):
    x, second = args
    xn = x.numpy()
    if op == "sum":
        mn = None if second is None else second.numpy()
        ref = float64.sum(xn, mn)
        return ref, ulp_floor(op, x, second, 1.0, ref).reshape(-1)
    scale = ops.inverse_temperature(kwargs["temperature"])
    if op == "token_logprobs":
        ref = float64.token_logprobs(xn, second.numpy(), scale)
        return ref, ulp_floor(op, x, None, scale, ref)
    mask = second
    ref = getattr(float64, op)(xn, None if mask is None else mask.numpy(), scale)
    floor = ulp_floor(op, x, mask, scale, ref)
    return ref.reshape(-1), None if floor is None else np.broadcast_to(floor, ref.shape).reshape(-1)


def _elementwise_reference(op, args, kwargs):
    return getattr(float64, op)(args[0].numpy()), None


def _rl_reference(op, args, kwargs):
    n = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    if op == "gae":
        rewards, values, mask, gamma, lam = n
        g32 = np.float32(gamma)
        ref = _flat64(float64.gae(rewards, values, mask, np.zeros(rewards.shape[0]), float(g32),
                                  float(g32) * float(np.float32(lam)), kwargs.get("mask_mode", "carry")))
        return ref, np.full(ref.size, np.abs(ref).max())
    if op == "masked_mean":
        x, mask = n
        rows = (x, mask) if kwargs.get("dim") is not None else (x.reshape(1, -1), mask.reshape(1, -1))
        return float64.masked_mean(*rows), None
    if op == "masked_whiten":
        x, mask = n
        ref = float64.masked_whiten(x.reshape(1, -1), mask.reshape(1, -1), kwargs.get("shift_mean", True),
                                    kwargs.get("unbiased", True), 1e-8, kwargs.get("eps_mode", "add")).reshape(-1)
        return ref, np.full(ref.size, 1.0)
    if op == "kl_penalty":
        logp, ref_logp, kind = n
        return float64.kl_penalty(logp, ref_logp, kind, kwargs.get("clamp"), kwargs.get("log_ratio_clamp")).reshape(-1), None
    logp, old_logp, advantages, mask = n
    one, clip = np.float32(1), np.float32(0.2)
    return _flat64(float64.ppo_policy_loss(logp, old_logp, advantages, mask, float(one - clip), float(one + clip),
                                           kwargs.get("dual_clip"), 20.0, kwargs.get("agg", "token-mean"))), None


# Spec 24.7's floors: the scale each result is conditioned by (float64's *_magnitude); rms_norm's measure is
# relative (no floor), and silu_mul's relative with float32's smallest normal as its floor (no subnormal ulps).
def _model_reference(op, args, kwargs):
    n = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    if op == "rms_norm":
        return float64.rms_norm(*n).reshape(-1), None
    if op == "silu_mul":
        return float64.silu_mul(*n), np.full(n[0].size, np.finfo(np.float32).tiny)
    if op == "attention":
        q, k, v = n
        batch, heads, tq, d = q.shape
        groups = [t.reshape(batch * heads, t.shape[2], d) for t in (q, k, v)]
        lengths = np.repeat(kwargs["kv_lengths"].numpy(), heads)
        n = (*groups, lengths, kwargs["causal"], ops.attention_scale(d))
    return getattr(float64, op)(*n).reshape(-1), getattr(float64, f"{op}_magnitude")(*n).reshape(-1)


REFERENCES = {**{op: _softmax_reference for op in SOFTMAX_OPS},
              **{op: _elementwise_reference for op in ELEMENTWISE_OPS},
              **{op: _rl_reference for op in RL_OPS},
              **{op: _model_reference for op in MODEL_OPS}}


def reference(op, args, kwargs):
    """(float64 meaning flattened, ulp floor or None) of a case's inputs; (None, None) for an op without one."""
    fn = REFERENCES.get(op)
    return fn(op, args, kwargs) if fn else (None, None)


# -- running ----------------------------------------------------------------------

def _time(fn, budget_s=0.5, max_runs=7, device="cpu"):
    """Median ms of fn on device (timing.measure: device events on a GPU or NPU, perf_counter on the CPU)."""
    return measure(fn, device, warmup=1, repeats=max_runs, budget_s=budget_s, min_runs=1).median_ms


def _measure(r, got, canonical, ref, floor):
    r.elements += got.numel()
    r.identical += int((metrics.canonical_bits(got) == metrics.canonical_bits(canonical)).sum())
    if ref is None:
        r.max_ulp = float("nan")
    else:
        err = metrics.ulp_error(got.double().numpy(), ref, floor)
        r.max_ulp = max(r.max_ulp, metrics.max_or_zero(err))
        r.ulp_counts += ulp_histogram(err)
    if r.op in LOG_SPACE:
        r.logdiff = max(r.logdiff, metrics.logdiff(got, canonical))


def _time_op(op, names, tier, seed, per_backend):
    timing = cases.timing_case(op, tier, seed)
    inputs = timing.inputs()
    native_ms = {}
    for b in names:
        dev = cases.backend_device(b)
        if dev not in native_ms:                 # native on the same device is the yardstick
            native_inputs = cases.to_device(inputs, dev)
            native_ms[dev] = _time(lambda: getattr(ops, op)(*native_inputs[0], **native_inputs[1], backend="native"),
                                   device=dev)
        per_backend[b].median_ms = (native_ms[dev] if b == "native"
                                    else _time(lambda: timing.run(b, inputs), device=dev))
        per_backend[b].ratio_to_native = per_backend[b].median_ms / native_ms[dev]


def compare(backends=None, ops_=OPS, tier="quick", seed=0, progress=True):
    """Run the tier's cases of ops_ on the backends available here (numpy always): a Run.

    Cases are built, run and measured one at a time, so memory holds one case's tensors."""
    names = [b for b in (backends or DEFAULT_BACKENDS) if availability(b)[0]]
    if "numpy" not in names:
        names.insert(0, "numpy")
    per_backend = {(op, b): Result(op, b) for op in ops_ for b in names}
    records = []
    suite = cases.suite(tier, ops_, seed)
    with Progress(len(suite), f"compare {tier}", enabled=progress) as bar:
        for case in suite:
            inputs = case.inputs()
            with np.errstate(all="ignore"):         # adversarial cases overflow in float64 on purpose
                ref, floor = reference(case.op, *inputs)
            canonical_out = case.run("numpy", inputs)
            canonical = _flat_tensor(canonical_out)
            digests = {"numpy": golden.digest(canonical_out)}
            for b in names:
                out = canonical_out if b == "numpy" else case.run(b, inputs)
                digests[b] = golden.digest(out)
                with np.errstate(all="ignore"):
                    _measure(per_backend[(case.op, b)], _flat_tensor(out), canonical, ref, floor)
            records.append({"name": case.name, "op": case.op, "shapes": case.shapes, "digests": digests})
            bar.step(case.name)
    for op in ops_:
        _time_op(op, names, tier, seed, {b: per_backend[(op, b)] for b in names})
    return Run(tier, seed, names, list(per_backend.values()), records)
