"""Gradient cases of the conformance suite: the backward of every differentiable op (spec 26, 29) and the
training steps (AdamW, SGD, clip_grad_norm_, GradientFold, spec 29.1 and 29.10-29.12).

A gradient case is built like a forward case (compare/cases.py): from (kind, shape, seed) only, on demand,
in the quick and full tiers, with the forward suite's row kinds, IEEE specials, masks and bfloat16 inputs.
Its upstream gradient comes from the seed too and is part of the case. Running it on a backend gives every
input and parameter gradient (or, for a training step, every updated tensor) as a separate named float32
tensor ("dx", "dweight", "exp_avg", ...), so a golden mismatch names the tensor, not just the case.

Op names: "<op>.backward" for the backward of ops.<op> (its inputs' gradients by torch.autograd.grad of the op's
differentiable outputs against the case's upstream gradient), and "AdamW.step", "SGD.step", "clip_grad_norm_"
and "GradientFold" for bitparity.optim. Case names start with the op name, so they never collide with a forward
case. A bfloat16 input's gradient is bfloat16 (rounded once, spec 29.8) and is recorded upcast to float32,
which is exact.

On `native` (torch's own ops) the gradient is torch autograd's, and the training steps are torch.optim's
AdamW and SGD, torch.nn.utils.clip_grad_norm_ and `.grad +=` accumulation: the baseline, not canonical.
"""

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np
import torch

from .. import ops, optim
from . import cases
from .cases import (ADVERSARIAL_KINDS, MODEL_CASES, RL_TENSORS, RL_VARIANTS, ROW_KINDS, TIERS, make_logits,
                    make_rl_adversarial, make_rl_batch, model_inputs)

SOFTMAX_GRAD_OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs")
RL_GRAD_OPS = ("masked_mean", "masked_whiten", "kl_penalty", "ppo_policy_loss")
MODEL_GRAD_OPS = ("linear", "rms_norm", "rotary", "attention", "silu_mul", "moe", "embedding")
BACKWARD_OPS = SOFTMAX_GRAD_OPS + ("exp", "topk") + RL_GRAD_OPS + MODEL_GRAD_OPS
STEP_OPS = ("AdamW.step", "SGD.step", "clip_grad_norm_", "GradientFold")
GRAD_OPS = tuple(f"{op}.backward" for op in BACKWARD_OPS) + STEP_OPS

# The differentiable tensor arguments of each op, (recorded name, positional index), in argument order.
WRT = {**{op: (("dx", 0),) for op in ("sum", "logsumexp", "log_softmax", "softmax", "exp", "topk",
                                      "masked_mean", "masked_whiten", "rotary")},
       "entropy": (("dlogits", 0),), "token_logprobs": (("dlogits", 0),),
       "kl_penalty": (("dlogp", 0), ("dref_logp", 1)), "ppo_policy_loss": (("dlogp", 0),),
       "linear": (("dx", 0), ("dweight", 1), ("dbias", 2)), "rms_norm": (("dx", 0), ("dweight", 1)),
       "attention": (("dq", 0), ("dk", 1), ("dv", 2)), "silu_mul": (("dgate", 0), ("dup", 1)),
       "moe": (("dx", 0), ("drouter_weight", 1), ("dgate_proj", 2), ("dup_proj", 3), ("ddown_proj", 4)),
       "embedding": (("dweight", 1),)}

# Sizes. The quick tier is small: `bitparity compare` runs it on five backends (the cuda one in the Triton
# interpreter, ascend in a host emulation) within its minute; the full tier reaches RL-sized rows.
GRAD_ROW_SHAPE = {"quick": (6, 500), "full": (64, 1025)}
GRAD_ADVERSARIAL_SHAPE = {"quick": (4, 256), "full": (64, 4096)}
GRAD_VOCAB_SHAPES = {"quick": (), "full": ((16, 32000), (4, 151936))}
GRAD_RL_SHAPE = {"quick": (4, 256), "full": (64, 4096)}
GRAD_ELEMENTWISE_N = {"quick": 4096, "full": 1 << 20}
# Model ops: the forward suite's quick cases (already small) in both tiers; the full tier adds these.
GRAD_MODEL_FULL = {"linear": [("random", (64, 1100, 64))], "rms_norm": [("random", (64, 4096))],
                   "rotary": [("random", (64, 8, 128))], "attention": [("prefill", (2, 4, 64, 64, 64))],
                   "silu_mul": [("sweep", (1 << 20,))], "moe": [("random", (32, 256, 8, 64, 2))],
                   "embedding": [("random", (512, 4096, 64))]}
# bfloat16 inputs (the activations of a bf16 model): the gradient is rounded once to bfloat16.
GRAD_BF16 = {"linear": ("random", (5, 63, 33)), "rms_norm": ("random", (8, 64)), "embedding": ("random", (12, 50, 16))}
GRAD_EMBEDDING = {"quick": [("random", (12, 50, 16)), ("repeated", (33, 7, 8))], "full": []}
TRAIN_N = {"quick": 1000, "full": 1 << 20}
CLIP_SHAPES = {"quick": ((40, 25), (300,), (7, 3, 5)), "full": ((1024, 1024), (4096,), (64, 8, 128))}
# rows, K, N, micro-batch rows: micro-batches hold whole 32-row linear gradient blocks (spec 29.2, 2.0.0)
FOLD_SHAPE = {"quick": (72, 40, 8, 32), "full": (1000, 256, 64, 64)}


@dataclass(frozen=True)
class GradCase:
    """One named gradient case: its op ("<op>.backward" or a training step), its smallest tier, the shapes of its
    inputs (the upstream gradient as "g"), the names of the tensors it records, in order, how to build its inputs
    (on the CPU, on demand) and how to prepare a run: prepare(backend, inputs) -> a call that does the timed work
    (the backward of a graph built once, or the training steps) and returns {tensor name: tensor}."""
    name: str
    op: str
    tier: str
    shapes: dict
    tensors: tuple
    build: Callable = field(repr=False, compare=False)
    prepare: Callable = field(repr=False, compare=False)

    def inputs(self):
        return self.build()

    def run(self, backend, inputs=None):
        """{tensor name: float32 tensor on the CPU} of the case on backend."""
        out = self.prepare(backend, inputs if inputs is not None else self.build())()
        return {name: out[name].detach().to("cpu", torch.float32) for name in self.tensors}


def _upstream(seed, shape, salt):
    """The upstream gradient: standard normal float32 of shape, from the seed."""
    rng = np.random.default_rng([seed, *shape, 300 + salt])
    return torch.from_numpy(np.asarray(rng.standard_normal(shape), dtype=np.float32))


# -- the backward of an op ------------------------------------------------------------------

def _backward_prepare(op, backend, inputs):
    """Build op's graph once on backend's device with fresh leaves; the call returns its input gradients
    (retain_graph, so it can be timed repeatedly)."""
    args, kwargs, upstream = inputs
    device = cases.backend_device(backend)
    args, kwargs = cases.to_device((args, kwargs), device)
    args = list(args)
    names, leaves = [], []
    for name, i in WRT[op]:
        if i < len(args) and isinstance(args[i], torch.Tensor):
            args[i] = args[i].detach().clone().requires_grad_()
            names.append(name)
            leaves.append(args[i])
    with torch.enable_grad():
        out = getattr(ops, op)(*args, **kwargs, backend=backend)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [g.to(device) for g in upstream]

    def call():
        return dict(zip(names, torch.autograd.grad(outs[:len(grads)], leaves, grads, retain_graph=True)))
    return call


def _backward_case(op, tier, kind, shape_name, build, shapes):
    names = tuple(name for name, _ in WRT[op] if name != "dbias" or "bias" in shapes)    # linear without a bias
    return GradCase(f"{op}.backward/{kind}/{shape_name}", f"{op}.backward", tier, shapes, names, build,
                    partial(_backward_prepare, op))


def _with_upstream(forward_build, op, seed, salt):
    """(args, kwargs, upstream) from a forward build: upstream of the shape of the op's differentiable output."""
    args, kwargs = forward_build()
    with torch.no_grad():                       # torch's own op, for the output's shape only
        out = getattr(ops, op)(*args, **kwargs, backend="native")
    first = out[0] if isinstance(out, tuple) else out
    return args, kwargs, (_upstream(seed, tuple(first.shape), salt),)


def _dims(shape):
    return "x".join(map(str, shape))


# softmax family, exp and topk -----------------------------------------------------------------

def _softmax_grad_inputs(op, kind, rows, n, temperature, bf16, seed):
    args, kwargs = cases._softmax_inputs(op, kind, rows, n, temperature, seed)
    if bf16:
        args = (args[0].to(torch.bfloat16), *args[1:])
    return _with_upstream(lambda: (args, kwargs), op, seed, BACKWARD_OPS.index(op))


def _softmax_grad_case(op, tier, kind, rows, n, temperature, seed, bf16=False):
    shapes = {"x": [rows, n], "g": [rows] if op in ("logsumexp", "entropy", "token_logprobs", "sum") else [rows, n]}
    if op == "token_logprobs":
        shapes["tokens"] = [rows]
    elif kind == "masked":
        shapes["mask"] = [rows, n]
    build = partial(_softmax_grad_inputs, op, kind, rows, n, temperature, bf16, seed)
    return _backward_case(op, tier, kind + ("-bf16" if bf16 else ""),
                          f"{rows}x{n}" + ("" if temperature == 1.0 else f"/T{temperature:g}"), build, shapes)


def _softmax_grad_cases(op, seed):
    kinds = [k for k in ROW_KINDS if not (op == "token_logprobs" and k == "masked")]
    temps = (1.0,) if op == "sum" else cases.TEMPERATURES
    for tier in TIERS:
        rows, n = GRAD_ROW_SHAPE[tier]
        for kind in kinds:
            for temperature in (temps if kind == "random" else (1.0,)):
                yield _softmax_grad_case(op, tier, kind, rows, n, temperature, seed)
        yield _softmax_grad_case(op, tier, "random", rows, n, 1.0, seed, bf16=True)
        for kind in ADVERSARIAL_KINDS:
            yield _softmax_grad_case(op, tier, kind, *GRAD_ADVERSARIAL_SHAPE[tier], 1.0, seed)
        for rows, n in GRAD_VOCAB_SHAPES[tier]:
            yield _softmax_grad_case(op, tier, "random", rows, n, 1.0, seed)


def _exp_grad_cases(seed):
    for tier in TIERS:
        n = GRAD_ELEMENTWISE_N[tier]
        build = partial(lambda n: _with_upstream(lambda: ((cases.make_elementwise("exp", n, seed),), {}), "exp",
                                                 seed, BACKWARD_OPS.index("exp")), n)
        size = n + len(cases.ELEMENTWISE_SPECIALS)
        yield _backward_case("exp", tier, "sweep", str(n), build, {"x": [size], "g": [size]})


def _topk_grad_cases(seed):
    for tier in TIERS:
        rows, n = GRAD_ROW_SHAPE[tier]
        for kind in ("random", "equal", "specials"):
            build = partial(lambda kind: _with_upstream(lambda: ((make_logits(kind, rows, n, seed)[0], 50), {}),
                                                        "topk", seed, BACKWARD_OPS.index("topk")), kind)
            yield _backward_case("topk", tier, f"k50/{kind}", f"{rows}x{n}", build, {"x": [rows, n], "g": [rows, 50]})


# RL losses ------------------------------------------------------------------------------

def _rl_grad_inputs(op, variant, kind, rows, t, seed):
    rl = (make_rl_batch if kind == "padded" else make_rl_adversarial)(rows, t, seed)
    extra, kwargs = RL_VARIANTS[op][variant]
    args = tuple(rl[name] for name in RL_TENSORS[op]) + extra
    return _with_upstream(lambda: (args, dict(kwargs)), op, seed, BACKWARD_OPS.index(op))


def _rl_grad_cases(op, seed):
    for tier in TIERS:
        rows, t = GRAD_RL_SHAPE[tier]
        for variant in RL_VARIANTS[op]:        # the forward suite's variants
            for kind in ("padded", "adversarial"):
                shapes = {name: [rows, t] for name in RL_TENSORS[op]}
                shapes["g"] = {"masked_mean": [rows] if variant == "rows" else [], "ppo_policy_loss": []}.get(
                    op, [rows, t])
                build = partial(_rl_grad_inputs, op, variant, kind, rows, t, seed)
                yield _backward_case(op, tier, f"{variant}/{kind}", f"{rows}x{t}", build, shapes)


# model blocks and the embedding --------------------------------------------------------------

def _model_grad_inputs(op, kind, shape, bf16, seed):
    args, kwargs = model_inputs(op, kind, shape, seed)
    if bf16:
        args = tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
    return _with_upstream(lambda: (args, kwargs), op, seed, BACKWARD_OPS.index(op))


def _embedding_grad_inputs(kind, shape, bf16, seed):
    """tokens [M] over a vocabulary of V (repeated: every token among the first 3, each row of the table folded
    from many positions; random: about a fifth of the vocabulary never occurs, its rows -0.0), weight [V, D]."""
    m, vocab, d = shape
    rng = np.random.default_rng([seed, *shape, 210])
    tokens = torch.from_numpy(rng.integers(0, 3 if kind == "repeated" else vocab, m).astype(np.int64))
    weight = torch.from_numpy(rng.standard_normal((vocab, d)).astype(np.float32))
    weight = weight.to(torch.bfloat16) if bf16 else weight
    return (tokens, weight), {}, (_upstream(seed, (m, d), BACKWARD_OPS.index("embedding")),)


def _model_grad_case(op, tier, kind, shape, seed, bf16=False):
    if op == "embedding":
        m, vocab, d = shape
        shapes = {"tokens": [m], "weight": [vocab, d], "g": [m, d]}
        build = partial(_embedding_grad_inputs, kind, shape, bf16, seed)
    else:
        shapes = dict(cases._model_shapes(op, kind, shape))
        build = partial(_model_grad_inputs, op, kind, shape, bf16, seed)
        shapes["g"] = list(_with_upstream_shape(op, shape))
    return _backward_case(op, tier, kind + ("-bf16" if bf16 else ""), _dims(shape), build, shapes)


def _with_upstream_shape(op, shape):
    """The shape of the op's output, in the terms of cases.MODEL_CASES."""
    if op == "linear":
        return shape[0], shape[2]
    if op == "attention":
        b, h, tq, _, d = shape
        return b, h, tq, d
    if op == "moe":
        return shape[:2]
    return shape


def _model_grad_cases(op, seed):
    for tier in TIERS:
        specs = GRAD_EMBEDDING[tier] if op == "embedding" else (MODEL_CASES[op]["quick"] if tier == "quick" else [])
        for kind, shape in specs + GRAD_MODEL_FULL[op] * (tier == "full"):
            yield _model_grad_case(op, tier, kind, shape, seed)
        if tier == "quick" and op in GRAD_BF16:
            yield _model_grad_case(op, tier, *GRAD_BF16[op], seed, bf16=True)


# -- training steps (spec 29.1, 29.10-29.12) -------------------------------------------------

ADAMW_VARIANTS = {"default": {"lr": 1e-3, "weight_decay": 1e-2}, "lr0.1-no-decay": {"lr": 0.1, "weight_decay": 0.0},
                  "specials": {"lr": 1e-3, "weight_decay": 1e-2}}
SGD_VARIANTS = {"plain": {"lr": 0.1}, "momentum-dampening-decay": {"lr": 0.05, "momentum": 0.9, "dampening": 0.1,
                                                                   "weight_decay": 1e-2},
                "nesterov": {"lr": 0.05, "momentum": 0.9, "nesterov": True}, "specials": {"lr": 0.1, "momentum": 0.9}}
STEPS = 3
STEP_SPECIALS = np.array([np.nan, np.inf, -np.inf, 3.0e38, -3.0e38, 1e-40, -1e-40, 0.0, -0.0], dtype=np.float32)


def _train_inputs(n, variant, hyper, seed, salt):
    """(weight [n], STEPS gradients [n], the optimizer's hyper-parameters); with specials, the second gradient
    starts with NaN, +-inf, values near float32's maximum (whose squares overflow), subnormals and signed zeros."""
    rng = np.random.default_rng([seed, n, 400 + salt])
    weight = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * 0.1).astype(np.float32) for _ in range(STEPS)]
    if variant == "specials":
        grads[1][:len(STEP_SPECIALS)] = STEP_SPECIALS
    return torch.from_numpy(weight), [torch.from_numpy(g) for g in grads], dict(hyper)


def _optimizer(name, backend, params, hyper):
    if backend == "native":
        return getattr(torch.optim, name)(params, **hyper)
    return getattr(optim, name)(params, **hyper, backend=backend)


def _step_prepare(name, backend, inputs):
    """STEPS optimizer steps from the case's weight and gradients; records the weight and the optimizer state."""
    weight, grads, hyper = inputs
    device = cases.backend_device(backend)
    grads = [g.to(device) for g in grads]

    def call():
        p = torch.nn.Parameter(weight.to(device).clone())
        opt = _optimizer(name, backend, [p], hyper)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        state = opt.state[p]
        return {"weight": p.detach(), **{k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim()}}
    return call


def _step_cases(name, variants, seed):
    for tier in TIERS:
        n = TRAIN_N[tier]
        for variant, hyper in variants.items():
            tensors = ("weight", "exp_avg", "exp_avg_sq") if name == "AdamW" else \
                ("weight",) + (("momentum_buffer",) if hyper.get("momentum") else ())
            yield GradCase(f"{name}.step/{variant}/{n}", f"{name}.step", tier, {"weight": [n], "g": [STEPS, n]},
                           tensors,
                           partial(_train_inputs, n, variant, hyper, seed, STEP_OPS.index(f"{name}.step")),
                           partial(_step_prepare, name))


CLIP_VARIANTS = {"clipped": 1.0, "unclipped": 1e6, "inf-gradient": 1.0}


def _clip_inputs(shapes, variant, seed):
    """(gradients of the shapes, max_norm); inf-gradient puts +inf in the second (the norm is +inf)."""
    rng = np.random.default_rng([seed, len(shapes), 500])
    grads = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    if variant == "inf-gradient":
        grads[1].view(-1)[3] = float("inf")
    return grads, CLIP_VARIANTS[variant]


def _clip_prepare(backend, inputs):
    """clip_grad_norm_ over parameters holding the case's gradients, in order; records the norm and the
    clipped gradients."""
    device = cases.backend_device(backend)
    inputs, max_norm = inputs

    def call():
        params = [torch.nn.Parameter(torch.zeros_like(g, device=device)) for g in inputs]
        for p, g in zip(params, inputs):
            p.grad = g.to(device).clone()
        if backend == "native":
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = optim.clip_grad_norm_(params, max_norm, backend=backend)
        return {"norm": norm.reshape(1), **{f"grad{i}": p.grad for i, p in enumerate(params)}}
    return call


def _clip_cases(seed):
    for tier in TIERS:
        shapes = CLIP_SHAPES[tier]
        for variant in CLIP_VARIANTS:
            yield GradCase(f"clip_grad_norm_/{variant}/{'+'.join(map(_dims, shapes))}", "clip_grad_norm_", tier,
                           {f"grad{i}": list(s) for i, s in enumerate(shapes)},
                           ("norm",) + tuple(f"grad{i}" for i in range(len(shapes))),
                           partial(_clip_inputs, shapes, variant, seed), _clip_prepare)


def _fold_inputs(shape, seed):
    rows, k, n, _ = shape
    rng = np.random.default_rng([seed, *shape, 600])
    x, weight = rng.standard_normal((rows, k)), rng.standard_normal((n, k)) / np.sqrt(k)
    bias, g = rng.standard_normal(n), rng.standard_normal((rows, n))
    return tuple(torch.from_numpy(a.astype(np.float32)) for a in (x, weight, bias, g))


def _fold_prepare(micro, backend, inputs):
    """linear's backward micro-batch by micro-batch (micro rows each, the last shorter), the parameter gradients
    combined by GradientFold (native: torch's `.grad +=`, left to right); records dweight and dbias."""
    device = cases.backend_device(backend)
    x, weight, bias, g = (t.to(device) for t in inputs)

    def call():
        w, b = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(bias.clone())
        fold = optim.GradientFold([w, b])
        for start in range(0, x.shape[0], micro):
            y = ops.linear(x[start:start + micro], w, b, backend=backend)
            y.backward(g[start:start + micro])
            if backend != "native":
                fold.add(y.shape[0])                   # this micro-batch's rows (spec 29.1)
        if backend != "native":
            fold.finish()
        return {"dweight": w.grad, "dbias": b.grad}
    return call


def _fold_cases(seed):
    for tier in TIERS:
        rows, k, n, micro = shape = FOLD_SHAPE[tier]
        yield GradCase(f"GradientFold/linear-micro{micro}/{rows}x{k}x{n}", "GradientFold", tier,
                       {"x": [rows, k], "weight": [n, k], "bias": [n], "g": [rows, n]}, ("dweight", "dbias"),
                       partial(_fold_inputs, shape, seed), partial(_fold_prepare, micro))


# -- the registry -------------------------------------------------------------------------------

def _cases_of(op, seed):
    """Every gradient case of op (a GRAD_OPS name), both tiers, in a fixed order."""
    if op in STEP_OPS:
        return {"AdamW.step": lambda: _step_cases("AdamW", ADAMW_VARIANTS, seed),
                "SGD.step": lambda: _step_cases("SGD", SGD_VARIANTS, seed),
                "clip_grad_norm_": lambda: _clip_cases(seed), "GradientFold": lambda: _fold_cases(seed)}[op]()
    forward = op[:-len(".backward")]
    if forward in SOFTMAX_GRAD_OPS:
        return _softmax_grad_cases(forward, seed)
    if forward in RL_GRAD_OPS:
        return _rl_grad_cases(forward, seed)
    if forward in MODEL_GRAD_OPS:
        return _model_grad_cases(forward, seed)
    return _exp_grad_cases(seed) if forward == "exp" else _topk_grad_cases(seed)


def suite(tier="quick", ops_=None, seed=0):
    """Every gradient case of the tier, op by op in GRAD_OPS order (or for the ops named)."""
    cases._check_tier(tier)
    unknown = sorted(set(ops_ or ()) - set(GRAD_OPS))
    if unknown:
        raise ValueError(f"ops must be among {', '.join(GRAD_OPS)}; got {', '.join(unknown)}")
    return [c for op in (ops_ or GRAD_OPS) for c in _cases_of(op, seed) if tier == "full" or c.tier == "quick"]


def timing_case(op, tier="quick", seed=0):
    """The case op's backward (or step) is timed on: its first case of the tier's own size."""
    return next(c for c in _cases_of(op, seed) if c.tier == tier)


# Gradient ops the Triton interpreter skips: sum, exp and topk, whose gradient is data movement done by ops.py with
# torch for every backend (spec 26.11; their forward kernels are in the forward suite), and moe, a composite of
# linear, topk, softmax and silu_mul whose backwards each have their own case (a moe case costs the interpreter
# seconds; on a GPU, gpu_check verifies every case).
INTERPRETER_SKIPS = ("sum.backward", "exp.backward", "topk.backward", "moe.backward")


def interpreter_case(op, seed=0):
    """The one case of op that the Triton interpreter runs in `compare` and gpu_check --interpret: its first quick
    case (the smallest row kind, or the first model case); None for INTERPRETER_SKIPS."""
    return None if op in INTERPRETER_SKIPS else next(iter(_cases_of(op, seed)))
