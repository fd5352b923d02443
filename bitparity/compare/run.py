"""Run every op on the conformance suite on every available backend and measure agreement, accuracy and cost.

For each op x backend it reports:
- exact: % of result elements whose bits equal the canonical result (the `numpy` backend, the spec executed);
- max ulp: the worst error against the float64 meaning, in the op's ulp measure (docs/spec.md, section 10),
  and a histogram of those errors;
- logdiff: max |logp - logp_canonical| for ops in log space, the train/inference quantity;
- time: median and spread of the op's time on the op's timing case, and the median's ratio to `native` on the
  same device; the backends' runs interleave (timing.measure_interleaved), so a change of load hits them alike.
The gradient cases (compare/grad_cases.py: "<op>.backward" and the training steps) are rows of their own: their
max ulp is against the float64 backward meanings (reference/float64.py) in spec 26.12's measure (the softmax family
and the RL losses: ulps of a per-row floor; sum, exp, masked_mean, kl_penalty, ppo_policy_loss: relative) or
spec 29.14's (the model blocks, the embedding, GradientFold and the training steps: units U = 2^-24 of the tensor's
largest magnitude); a bfloat16 gradient at bfloat16's resolution;
their time is the backward alone, on a graph built once (the training steps: the whole case), against torch autograd
(torch.optim, torch's clip_grad_norm_) on the same device.
For each case it records the output digest (golden.digest) of every backend that ran it, the unit `bitparity diff`
compares, and for a gradient case each tensor's digest too.  The `cuda` backend in the Triton interpreter (no GPU)
runs a stated subset, INTERPRETER_RULE, and is not timed: the interpreter costs a second or more per
vocabulary-sized row, and its time says nothing about a GPU.
"""

import importlib
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from .. import ops
from ..backends import availability
from ..reference import float64
from . import cases, golden, grad_cases, metrics
from .cases import ELEMENTWISE_OPS, MODEL_OPS, RL_OPS, SAMPLING_OPS, SOFTMAX_OPS
from .grad_cases import GRAD_OPS
from .cli_common import Progress
from .timing import Timing, busy, measure_interleaved

OPS = SOFTMAX_OPS + ELEMENTWISE_OPS + RL_OPS + SAMPLING_OPS + MODEL_OPS
ALL_OPS = OPS + GRAD_OPS            # compare's default: the forward ops, then the gradient cases' ops
LOG_SPACE = ("logsumexp", "log_softmax", "token_logprobs")
DEFAULT_BACKENDS = ("numpy", "cpu", "cuda", "ascend", "native")

# The Triton interpreter's share of the suite: every row kind and adversarial input at one segment (spec 3), none
# of the vocabulary-sized rows, which cost it seconds each (tests/backends/test_bit_identity.py runs those on it);
# of the filtering ops, about a second a case there, one in three (their cases cycle through five filter settings
# within each row kind, so every setting and every kind stays).
INTERPRETER_MAX_ELEMENTS = 8192
INTERPRETER_THINNED, INTERPRETER_STRIDE = ("filter_logits", "sample"), 3
INTERPRETER_RULE = (f"Triton interpreter: the forward cases whose largest input holds at most "
                    f"{INTERPRETER_MAX_ELEMENTS} elements, of {' and '.join(INTERPRETER_THINNED)} one in "
                    f"{INTERPRETER_STRIDE}; of the gradient cases, the first quick case of each op but "
                    f"{', '.join(grad_cases.INTERPRETER_SKIPS)}; not timed")
# Per op and backend: one warm-up call, then runs until 0.1 s of them and at least 3 (at most 100): a hundred runs
# of a 1 ms call, five of a 20 ms one, three of the host emulation's sample (0.6 s); about 20 CPU-seconds in all.
TIMING = {"warmup": 1, "min_runs": 3, "repeats": 100, "budget_s": 0.1}
# The gradient ops' timing cases are about a millisecond each (their backward alone, on small shapes): half the
# forward's budget still gives tens of runs, and keeps the 23 of them within compare's minute.
GRAD_BUDGET_S = 0.05

# Upper edges of the ulp-error histogram bins after the exact-zero bin; then (1024, inf) and inf.
ULP_EDGES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 1024.0)
ULP_BIN_LABELS = ("0", "<=1/8", "<=1/4", "<=1/2", "<=1", "<=2", "<=4", "<=8", "<=16", "<=64", "<=1024",
                  ">1024", "inf")


@dataclass
class Result:
    op: str
    backend: str
    cases: int = 0
    elements: int = 0
    identical: int = 0
    max_ulp: float = 0.0
    logdiff: float = 0.0
    timing: Timing = None               # None: not timed
    ratio_to_native: float = float("nan")
    ulp_counts: np.ndarray = field(default_factory=lambda: np.zeros(len(ULP_BIN_LABELS), dtype=np.int64))

    @property
    def exact_percent(self):
        return 100.0 * self.identical / self.elements if self.elements else float("nan")

    @property
    def median_ms(self):
        return self.timing.median_ms if self.timing else float("nan")


@dataclass
class Run:
    tier: str
    seed: int
    backends: list      # names, numpy first
    results: list       # Result per (op, backend), op by op
    cases: list         # {"name", "op", "shapes", "digests": {backend: hex}} per case, in suite order
    skipped: dict       # backend asked for but not available here -> why (backends.availability)
    subsets: dict       # backend that ran part of the suite -> the rule it followed
    warnings: list      # what makes the run's numbers doubtful (a busy machine), as sentences


def ulp_histogram(err):
    """Counts of err per ULP_BIN_LABELS bin: exactly 0, (edge_{k-1}, edge_k], beyond the last edge, inf."""
    err = np.asarray(err).reshape(-1)
    finite = err[np.isfinite(err) & (err > 0)]
    inner = np.bincount(np.searchsorted(ULP_EDGES, finite, side="left"), minlength=len(ULP_EDGES) + 1)
    return np.concatenate([[np.count_nonzero(err == 0)], inner, [np.count_nonzero(np.isinf(err))]])


def _flat64(out):
    parts = out if isinstance(out, tuple) else (out,)
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in parts])


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


# -- float64 meanings of the gradient cases: {tensor: (meaning, ulp floor or None, unit or None)} ----------

U29 = 2.0 ** -24                 # spec 29.14's unit, times the largest magnitude of the gradient


def _np(t):
    """A tensor as numpy (a bfloat16 one upcast to float32, exactly); other values as they are."""
    if not isinstance(t, torch.Tensor):
        return t
    return (t.detach().to(torch.float32) if t.is_floating_point() else t.detach()).numpy()


def _in_units(named):
    """Spec 29.14's measure for each tensor: units of U29 times its meaning's largest finite magnitude."""
    out = {}
    for name, ref in ((n, r) for n, r in named.items() if r is not None):     # linear without a bias: no dbias
        finite = np.abs(ref[np.isfinite(ref)])
        out[name] = (ref, None, max(U29 * (float(finite.max()) if finite.size else 0.0), 2.0 ** -149))
    return out


def _softmax_grad_reference(op, args, kwargs, g):
    x, second = (_np(a) for a in args)
    scale = 1.0 if op == "sum" else ops.inverse_temperature(kwargs["temperature"])
    dx, floor = float64.softmax_family_backward(op, x, second, scale, g)
    return {"dlogits" if op in ("entropy", "token_logprobs") else "dx":
            (dx, None if floor is None else np.broadcast_to(floor, dx.shape), None)}


def _rl_grad_reference(op, args, kwargs, g):
    n = [_np(a) for a in args]
    if op == "masked_mean":
        x, mask = n
        rows = (x, mask) if kwargs.get("dim") is not None else (x.reshape(1, -1), mask.reshape(1, -1))
        return {"dx": (float64.masked_mean_backward(rows[1], g.reshape(-1))[0].reshape(x.shape), None, None)}
    if op == "masked_whiten":
        x, mask = n
        dx, floor = float64.masked_whiten_backward(
            x.reshape(1, -1), mask.reshape(1, -1), kwargs.get("shift_mean", True), kwargs.get("unbiased", True), 1e-8,
            kwargs.get("eps_mode", "add"), g.reshape(1, -1))
        return {"dx": (dx.reshape(x.shape), np.broadcast_to(floor, dx.shape).reshape(x.shape), None)}
    if op == "kl_penalty":
        logp, ref_logp, kind = n
        dlogp, dref = float64.kl_penalty_backward(logp, ref_logp, kind, kwargs.get("clamp"),
                                                  kwargs.get("log_ratio_clamp"), g)
        return {"dlogp": (dlogp, None, None), "dref_logp": (dref, None, None)}
    logp, old_logp, advantages, mask = n
    one, clip = np.float32(1), np.float32(0.2)
    dlogp = float64.ppo_policy_loss_backward(logp, old_logp, advantages, mask, float(one - clip), float(one + clip),
                                             kwargs.get("dual_clip"), 20.0, kwargs.get("agg", "token-mean"), float(g))
    return {"dlogp": (dlogp, None, None)}


def _model_grad_reference(op, args, kwargs, g):
    n = [_np(a) for a in args]
    if op == "linear":
        return _in_units(dict(zip(("dx", "dweight", "dbias"), float64.linear_backward(*n, g))))
    if op == "rms_norm":
        return _in_units(dict(zip(("dx", "dweight"), float64.rms_norm_backward(*n, g))))
    if op == "rotary":
        return _in_units({"dx": float64.rotary_backward(n[1], n[2], g)})
    if op == "silu_mul":
        return _in_units(dict(zip(("dgate", "dup"), float64.silu_mul_backward(*n, g))))
    if op == "embedding":
        return _in_units({"dweight": float64.embedding_backward(n[0], n[1].shape[0], g)})
    if op == "moe":
        x, router, gate, up, down, top_k = n
        names = ("dx", "drouter_weight", "dgate_proj", "dup_proj", "ddown_proj")
        return _in_units(dict(zip(names, float64.moe_backward(x, router, gate, up, down, top_k,
                                                              kwargs.get("norm_topk_prob", True), g))))
    q, k, v = n
    batch, heads, tq, d = q.shape
    groups = [t.reshape(batch * heads, t.shape[2], d) for t in (q, k, v, g)]
    lengths = np.repeat(kwargs["kv_lengths"].numpy(), heads)
    grads = float64.attention_backward(*groups[:3], lengths, kwargs["causal"], ops.attention_scale(d), groups[3])
    return _in_units({name: t.reshape(like.shape) for name, t, like in zip(("dq", "dk", "dv"), grads, (q, k, v))})


def _step_reference(op, inputs):
    if op == "clip_grad_norm_":
        grads, max_norm = inputs
        norm, clipped = float64.clip_grad_norm([_np(t) for t in grads], max_norm)
        return _in_units({"norm": np.array([norm]), **{f"grad{i}": t for i, t in enumerate(clipped)}})
    if op == "GradientFold":
        x, weight, bias, g = (_np(t) for t in inputs)
        _, dweight, dbias = float64.linear_backward(x, weight, bias, g)
        return _in_units({"dweight": dweight, "dbias": dbias})
    weight, grads, hyper = inputs
    weight, grads = _np(weight), [_np(t) for t in grads]
    if op == "AdamW.step":
        w, m, v = float64.adamw_steps(weight, grads, hyper["lr"], (0.9, 0.999), 1e-8, hyper["weight_decay"])
        return _in_units({"weight": w, "exp_avg": m, "exp_avg_sq": v})
    w, buf = float64.sgd_steps(weight, grads, **hyper)
    return _in_units({"weight": w, "momentum_buffer": buf})


BF16_UNIT = 2.0 ** 16            # bfloat16's ulp over float32's


def _in_bfloat16_resolution(named):
    """The measures of gradients that are bfloat16 (of bfloat16 inputs, rounded once): bfloat16's ulps of
    max(|meaning|, floor), or spec 29.14's unit 2^16 times as large, since no bfloat16 result resolves finer."""
    out = {}
    for name, (ref, floor, unit) in named.items():
        if unit is None:
            unit = BF16_UNIT * metrics.ulp32(np.abs(ref) if floor is None else np.maximum(np.abs(ref), floor))
        out[name] = (ref, None, BF16_UNIT * unit if np.isscalar(unit) else unit)
    return out


def grad_reference(case, inputs):
    """{tensor: (float64 meaning, ulp floor or None, unit or None)} of a gradient case; {} where the gradient is
    exact data movement without a float64 question (topk's placement)."""
    if case.op in grad_cases.STEP_OPS:
        return _step_reference(case.op, inputs)
    args, kwargs, _ = inputs
    named = _backward_reference(case.op[:-len(".backward")], inputs)
    bf16 = any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)
    return _in_bfloat16_resolution(named) if bf16 else named


def _backward_reference(op, inputs):
    args, kwargs, (g,) = inputs
    g = g.numpy()
    if op in grad_cases.SOFTMAX_GRAD_OPS:
        return _softmax_grad_reference(op, args, kwargs, g)
    if op in grad_cases.RL_GRAD_OPS:
        return _rl_grad_reference(op, args, kwargs, g)
    if op == "exp":
        with np.errstate(over="ignore", invalid="ignore"):
            return {"dx": (g.astype(np.float64) * np.exp(args[0].numpy().astype(np.float64)), None, None)}
    return {} if op == "topk" else _model_grad_reference(op, args, kwargs, g)


# -- running ----------------------------------------------------------------------

def interpreted(backend):
    """True for an available `cuda` backend whose kernels the Triton interpreter runs (TRITON_INTERPRET=1)."""
    return backend == "cuda" and getattr(importlib.import_module("bitparity.backends.cuda"), "_INTERPRETED", False)


def interpreter_subset(suite):
    """The names of the suite's cases the Triton interpreter runs (INTERPRETER_RULE)."""
    gradient = [c for c in suite if isinstance(c, grad_cases.GradCase)]
    picked = (grad_cases.interpreter_case(op) for op in dict.fromkeys(c.op for c in gradient))
    names = {c.name for c in picked if c is not None}
    suite = [c for c in suite if not isinstance(c, grad_cases.GradCase)]
    small = [c for c in suite if max(math.prod(shape) for shape in c.shapes.values()) <= INTERPRETER_MAX_ELEMENTS]
    position = Counter()                    # of the case among its op's small cases
    for case in small:
        if case.op not in INTERPRETER_THINNED or position[case.op] % INTERPRETER_STRIDE == 0:
            names.add(case.name)
        position[case.op] += 1
    return names


def _flat32(out):
    """An op's outputs as one float32 array; token ids and indices (< 2**24) convert exactly."""
    parts = out if isinstance(out, tuple) else (out,)
    return np.concatenate([p.detach().cpu().numpy().astype(np.float32).reshape(-1) for p in parts])


def _measure(r, got, canonical, ref, floor, unit=None):
    """Add a case's output to r: bits against canonical, and the error against ref, in ulps of max(|ref|, floor)
    or, where unit is given (spec 29.14's measure), in those absolute units."""
    r.cases += 1
    r.elements += got.size
    r.identical += metrics.identical(got, canonical)
    if ref is None:
        r.max_ulp = float("nan")
    else:
        err = metrics.ulp_error(got, ref, floor) if unit is None else metrics.unit_error(got, ref, unit)
        r.max_ulp = max(r.max_ulp, metrics.max_or_zero(err))
        r.ulp_counts += ulp_histogram(err)
    if r.op in LOG_SPACE:
        r.logdiff = max(r.logdiff, metrics.logdiff(got, canonical))


def _time_op(op, inputs, names, results):
    """Time op on names' backends and on native, the yardstick, on each of their devices (runs interleaved
    per device); set each Result's timing and ratio to native on its device."""
    for dev in dict.fromkeys(cases.backend_device(b) for b in names):
        args, kwargs = cases.to_device(inputs, dev)
        group = [b for b in names if b != "native" and cases.backend_device(b) == dev]
        calls = {b: partial(getattr(ops, op), *args, **kwargs, backend=b) for b in ("native", *group)}
        timings = measure_interleaved(calls, dev, **TIMING)
        if "native" in names and cases.backend_device("native") == dev:
            group.append("native")
        for b in group:
            results[b].timing = timings[b]
            results[b].ratio_to_native = timings[b].median_ms / timings["native"].median_ms


def _grad_flat(case, out, ref):
    """A gradient case's tensors as one float32 array, and (meaning, floor, unit) concatenated alike (None where
    there is no meaning)."""
    got = np.concatenate([out[t].numpy().reshape(-1) for t in case.tensors])
    if not ref:
        return got, None, None, None
    meaning = np.concatenate([np.asarray(ref[t][0], dtype=np.float64).reshape(-1) for t in case.tensors])
    parts = [(ref[t][1], ref[t][2], out[t].numel()) for t in case.tensors]
    floor = None if parts[0][0] is None else np.concatenate([np.asarray(f).reshape(-1) for f, _, _ in parts])
    unit = (None if parts[0][1] is None
            else np.concatenate([np.broadcast_to(np.reshape(u, -1), (n,)) for _, u, n in parts]))
    return got, meaning, floor, unit


def _run_grad_case(case, names, subsets, interpreted_cases, per_backend):
    """Run a gradient case on every backend: its record (digests of the whole output and of each tensor)."""
    inputs = case.inputs()
    with np.errstate(all="ignore"):
        ref = grad_reference(case, inputs)
    canonical_out = case.run("numpy", inputs)
    canonical, meaning, floor, unit = _grad_flat(case, canonical_out, ref)
    digests, tensors = {}, {}
    for b in names:
        if b in subsets and case.name not in interpreted_cases:
            continue
        out = canonical_out if b == "numpy" else case.run(b, inputs)
        digests[b] = golden.digest(tuple(out[t] for t in case.tensors))
        tensors[b] = golden.tensor_digests(out)
        with np.errstate(all="ignore"):
            _measure(per_backend[(case.op, b)], _grad_flat(case, out, None)[0], canonical, meaning, floor, unit)
    return {"name": case.name, "op": case.op, "shapes": case.shapes, "digests": digests, "tensors": tensors}


def _time_grad_op(case, names, results):
    """Time a gradient case's work (grad_cases.GradCase.prepare) on names' backends and on native (torch autograd,
    torch.optim) on each of their devices, interleaved; set each Result's timing and ratio to native."""
    inputs = case.inputs()
    for dev in dict.fromkeys(cases.backend_device(b) for b in names):
        group = [b for b in names if b != "native" and cases.backend_device(b) == dev]
        calls = {b: case.prepare(b, inputs) for b in ("native", *group)}
        timings = measure_interleaved(calls, dev, **dict(TIMING, budget_s=GRAD_BUDGET_S))
        if "native" in names and cases.backend_device("native") == dev:
            group.append("native")
        for b in group:
            results[b].timing = timings[b]
            results[b].ratio_to_native = timings[b].median_ms / timings["native"].median_ms


def compare(backends=None, ops_=ALL_OPS, tier="quick", seed=0, progress=True):
    """Run the tier's cases of ops_ (forward ops and gradient ops, GRAD_OPS) on the backends available here (numpy
    always): a Run.

    Cases are built, run and measured one at a time, so memory holds one case's tensors; then each op is timed.
    progress: progress bars for the backends' set-up and both passes, and the busy-machine warning, on stderr."""
    asked = backends or DEFAULT_BACKENDS
    status = {}
    with Progress(len(asked), f"compare {tier}: backends", enabled=progress) as bar:
        for b in asked:                     # the first use of a compiled backend builds it
            status[b] = availability(b)
            bar.step(b)
    names = [b for b in asked if status[b][0]]
    if "numpy" not in names:
        names.insert(0, "numpy")
    subsets = {b: INTERPRETER_RULE for b in names if interpreted(b)}
    per_backend = {(op, b): Result(op, b) for op in ops_ for b in names}
    records = []
    forward_ops, gradient_ops = [op for op in ops_ if op not in GRAD_OPS], [op for op in ops_ if op in GRAD_OPS]
    suite = ((cases.suite(tier, forward_ops, seed) if forward_ops else [])
             + (grad_cases.suite(tier, gradient_ops, seed) if gradient_ops else []))
    interpreted_cases = interpreter_subset(suite)
    with Progress(len(suite), f"compare {tier}: agreement", enabled=progress) as bar:
        for case in suite:
            if isinstance(case, grad_cases.GradCase):
                records.append(_run_grad_case(case, names, subsets, interpreted_cases, per_backend))
                bar.step(case.name)
                continue
            inputs = case.inputs()
            with np.errstate(all="ignore"):         # adversarial cases overflow in float64 on purpose
                ref, floor = reference(case.op, *inputs)
            canonical_out = case.run("numpy", inputs)
            canonical = _flat32(canonical_out)
            digests = {}
            for b in names:
                if b in subsets and case.name not in interpreted_cases:
                    continue
                out = canonical_out if b == "numpy" else case.run(b, inputs)
                digests[b] = golden.digest(out)
                with np.errstate(all="ignore"):
                    _measure(per_backend[(case.op, b)], _flat32(out), canonical, ref, floor)
            records.append({"name": case.name, "op": case.op, "shapes": case.shapes, "digests": digests})
            bar.step(case.name)
    timed = [b for b in names if b not in subsets]
    with Progress(len(ops_), f"compare {tier}: timing", enabled=progress) as bar:
        for op in ops_:
            results = {b: per_backend[(op, b)] for b in timed}
            if op in GRAD_OPS:
                _time_grad_op(grad_cases.timing_case(op, tier, seed), timed, results)
            else:
                _time_op(op, cases.timing_case(op, tier, seed).inputs(), timed, results)
            bar.step(op)
    warning = busy([r.timing for r in per_backend.values() if r.timing])
    if warning and progress:
        print(f"bitparity compare: warning: {warning}", file=sys.stderr)
    return Run(tier, seed, names, list(per_backend.values()), records,
               skipped={b: why for b, (ok, why) in status.items() if not ok}, subsets=subsets,
               warnings=[warning] if warning else [])
