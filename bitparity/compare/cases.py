"""Deterministic inputs and the conformance suite built from them.

Inputs are a function of (kind, shape, seed) only, so a failing case can be
rebuilt anywhere from its name.  Row kinds cover the numerics that break naive
code: wide dynamic range, ties (all-equal rows), near-one-hot rows (low
entropy), masks with fully masked rows, and IEEE specials; the adversarial
kinds add subnormals, values near float32's maximum, repeated maxima, signed
zeros and -inf rows.

The suite is a registry keyed by op name: `register(op, cases, timing)` adds
an op, `suite(tier)` lists every named case of a tier.  Each case is built
on demand and never stored, so a run holds one case's tensors at a time.
SUITE_VERSION changes whenever a case's name, shape or inputs change, which
invalidates the golden digests on purpose (bitparity/golden/).
"""

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np
import torch

from .. import ops
from ..backends import device_type

SUITE_VERSION = "1"
TIERS = ("quick", "full")
ROW_KINDS = ("random", "wide", "equal", "peaked", "masked", "specials")
ADVERSARIAL_KINDS = ("subnormal", "huge", "tied_max", "signed_zero", "neg_inf")


def _wide(rng, shape):
    """Magnitudes log-uniform over [1e-30, 1e30] with random signs, a few exact zeros."""
    mag = np.exp(rng.uniform(np.log(1e-30), np.log(1e30), shape))
    x = np.where(rng.random(shape) < 0.5, -mag, mag)
    return np.where(rng.random(shape) < 0.01, 0.0, x)


def _specials(rng, x):
    """Row r gets, by r % 4: a NaN; a +inf; some -inf; a mixture of +0.0 and -0.0."""
    rows, n = x.shape
    for r in range(rows):
        cols = rng.integers(0, n, size=max(1, n // 8))
        kind = r % 4
        if kind == 0:
            x[r, cols[0]] = np.nan
        elif kind == 1:
            x[r, cols[0]] = np.inf
        elif kind == 2:
            x[r, cols] = -np.inf
        else:
            x[r, cols] = np.where(rng.random(cols.size) < 0.5, 0.0, -0.0)
    return x


def _mask(rng, rows, n):
    """Random keep-masks, with row 0 fully masked and row 1 (if any) a left-padded prefix mask."""
    mask = rng.random((rows, n)) < 0.6
    mask[0] = False
    if rows > 1:
        mask[1] = np.arange(n) >= n // 3
    return mask


def make_logits(kind, rows, n, seed=0):
    """(x float32 [rows, n], mask bool [rows, n] or None) for a row kind."""
    rng = np.random.default_rng([seed, rows, n, ROW_KINDS.index(kind)])
    mask = None
    if kind == "random":
        x = rng.standard_normal((rows, n)) * 4.0
    elif kind == "wide":
        x = _wide(rng, (rows, n))
    elif kind == "equal":
        x = np.repeat(rng.standard_normal((rows, 1)) * 10.0, n, axis=1)
    elif kind == "peaked":
        x = rng.standard_normal((rows, n))
        x[np.arange(rows), rng.integers(0, n, rows)] += 40.0
    elif kind == "masked":
        x = rng.standard_normal((rows, n)) * 4.0
        mask = torch.from_numpy(_mask(rng, rows, n))
    elif kind == "specials":
        x = _specials(rng, rng.standard_normal((rows, n)) * 4.0)
    else:
        raise ValueError(f"kind must be one of {ROW_KINDS}; got {kind!r}")
    return torch.from_numpy(x.astype(np.float32)), mask


def make_tokens(x, seed=0):
    """Token ids [rows]: the row's argmax for even rows (the likely sample), uniform for odd rows."""
    rows, n = x.shape
    rng = np.random.default_rng([seed, rows, n, 99])
    tokens = rng.integers(0, n, rows)
    finite = torch.nan_to_num(x, nan=-np.inf)
    tokens[::2] = torch.argmax(finite, dim=1).numpy()[::2]
    return torch.from_numpy(tokens.astype(np.int64))


ELEMENTWISE_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45, 1.17549435e-38,
                                 3.4028235e38, 88.72283, 88.72284, -103.97207, -103.97208], dtype=np.float32)


def make_elementwise(op, n, seed=0):
    """float32 [15 + n] inputs for exp or log: the specials, then n values uniform over the interesting range
    (exp) or uniform bit patterns over the positive floats (log)."""
    rng = np.random.default_rng([seed, n, 7])
    if op == "exp":
        body = rng.uniform(-110.0, 95.0, n).astype(np.float32)
    else:
        body = rng.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.uint32).view(np.float32)
    return torch.from_numpy(np.concatenate([ELEMENTWISE_SPECIALS, body]).astype(np.float32))


def make_batch(rows, n, seed=0):
    """(x [rows, n], mask [rows, n]): row r is of kind ROW_KINDS[r % 6]; the mask is all True outside masked rows."""
    x = torch.empty(rows, n)
    mask = torch.ones(rows, n, dtype=torch.bool)
    for k, kind in enumerate(ROW_KINDS):
        idx = list(range(k, rows, len(ROW_KINDS)))
        if not idx:
            continue
        xk, mk = make_logits(kind, len(idx), n, seed)
        x[idx] = xk
        if mk is not None:
            mask[idx] = mk
    return x, mask


def make_rl_batch(rows, t, seed=0):
    """An RL batch [rows, t]: variable-length right-padded responses, rewards on the last token
    plus small per-token rewards, values, advantages, and log-probs of three policies close to
    each other (as consecutive PPO iterates are)."""
    rng = np.random.default_rng([seed, rows, t, 123])
    lengths = rng.integers(1, t + 1, rows)
    lengths[0] = t
    mask = np.arange(t)[None, :] < lengths[:, None]
    rewards = rng.standard_normal((rows, t)) * 0.01
    rewards[np.arange(rows), lengths - 1] += rng.standard_normal(rows) * 5.0
    logp = -np.abs(rng.standard_normal((rows, t))) * 2.0
    out = {
        "mask": mask,
        "rewards": rewards,
        "values": rng.standard_normal((rows, t)),
        "advantages": rng.standard_normal((rows, t)),
        "logp": logp,
        "old_logp": logp + rng.standard_normal((rows, t)) * 0.1,
        "ref_logp": logp + rng.standard_normal((rows, t)) * 0.05,
    }
    return {k: torch.from_numpy(v if v.dtype == bool else v.astype(np.float32)) for k, v in out.items()}


def make_adversarial(kind, rows, n, seed=0):
    """x float32 [rows, n] of an adversarial kind:
    subnormal: magnitudes log-uniform over float32's subnormals up to 1e-37, random signs, 5% zeros;
    huge: magnitudes within a factor 4 of float32's maximum, random signs (sums overflow, so does x / 0.7);
    tied_max: row r's maximum repeated at r + 2 positions;
    signed_zero: by r % 3, all +0.0, all -0.0, a mixture;
    neg_inf: by r % 4, all -inf, -inf but one finite, -inf but one +inf, half -inf."""
    rng = np.random.default_rng([seed, rows, n, 100 + ADVERSARIAL_KINDS.index(kind)])
    sign = np.where(rng.random((rows, n)) < 0.5, -1.0, 1.0)
    if kind == "subnormal":
        x = sign * np.exp(rng.uniform(np.log(1.4e-45), np.log(1e-37), (rows, n)))
        x[rng.random((rows, n)) < 0.05] = 0.0
    elif kind == "huge":
        x = sign * rng.uniform(0.85e38, 3.4e38, (rows, n))
    elif kind == "tied_max":
        x = rng.standard_normal((rows, n)) * 4.0
        for r in range(rows):
            x[r, rng.choice(n, size=min(n, r + 2), replace=False)] = x[r].max() + 1.0
    elif kind == "signed_zero":
        x = np.zeros((rows, n))
        x[1::3] = -0.0
        x[2::3] = np.where(rng.random((len(x[2::3]), n)) < 0.5, 0.0, -0.0)
    elif kind == "neg_inf":
        x = np.full((rows, n), -np.inf)
        cols = rng.integers(0, n, rows)
        x[1::4, cols[1::4]] = rng.standard_normal(len(x[1::4]))
        x[2::4, cols[2::4]] = np.inf
        x[3::4, : n // 2] = rng.standard_normal((len(x[3::4]), n // 2))
    else:
        raise ValueError(f"kind must be one of {ADVERSARIAL_KINDS}; got {kind!r}")
    return torch.from_numpy(x.astype(np.float32))


def make_subnormal_elementwise(op, n, seed=0):
    """float32 [n] inputs whose results (exp) or inputs (log) are subnormal: exp over [-104, -87],
    log over every positive subnormal bit pattern."""
    rng = np.random.default_rng([seed, n, 8])
    if op == "exp":
        x = rng.uniform(-104.0, -87.0, n).astype(np.float32)
    else:
        x = rng.integers(1, 0x00800000, n, dtype=np.int64).astype(np.uint32).view(np.float32)
    return torch.from_numpy(x)


def make_rl_adversarial(rows, t, seed=0):
    """make_rl_batch with the edges RL code trips on: row 1 fully masked (an empty response),
    policy log-ratios up to about +-40 (past PPO's ratio clamp of 20 and verl's KL clamps),
    and final rewards of magnitude up to 1e6."""
    rl = make_rl_batch(rows, t, seed)
    rng = np.random.default_rng([seed, rows, t, 124])
    rl["mask"][1:2] = False
    rl["old_logp"] = rl["logp"] + torch.from_numpy((rng.standard_normal((rows, t)) * 12.0).astype(np.float32))
    rl["ref_logp"] = rl["logp"] + torch.from_numpy((rng.standard_normal((rows, t)) * 15.0).astype(np.float32))
    rl["rewards"] = rl["rewards"] * torch.from_numpy((10.0 ** rng.uniform(0, 6, (rows, 1))).astype(np.float32))
    return rl


# -- the conformance suite ----------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One named case: its op, the smallest tier that holds it (every quick case is in the full tier
    too), the shapes of its tensor inputs, and how to build those inputs (on the CPU, on demand)."""
    name: str
    op: str
    tier: str
    shapes: dict
    build: Callable = field(repr=False, compare=False)     # () -> (args, kwargs) in the op's positional order

    def inputs(self):
        return self.build()

    def run(self, backend, inputs=None):
        """The op's output on backend; the inputs (built here unless given) move to the device it takes."""
        args, kwargs = to_device(inputs if inputs is not None else self.build(), backend_device(backend))
        return getattr(ops, self.op)(*args, **kwargs, backend=backend)


def to_device(inputs, device):
    """(args, kwargs) with every tensor, positional or keyword (per-row temperatures, seeds), on device."""
    args, kwargs = inputs

    def move(v):
        return v.to(device) if isinstance(v, torch.Tensor) else v
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def backend_device(backend):
    """The device a backend's inputs go to: each backend's own device; `native` (torch's ops) runs on this
    machine's accelerator, a GPU else an NPU, else the CPU, so that its digests say what torch does there."""
    if backend == "native":
        return next((d for d in (device_type("cuda"), device_type("ascend")) if d != "cpu"), "cpu")
    return device_type(backend)


_REGISTRY = {}      # op -> (cases(seed) -> iterable of Case, timing(tier, seed) -> Case)


def register(op, cases, timing):
    """Add op to the suite.  cases(seed) yields every Case of op, each tagged with its tier, in a
    fixed order; timing(tier, seed) gives the one case its cost is measured on."""
    _REGISTRY[op] = (cases, timing)


def registered_ops():
    return tuple(_REGISTRY)


def _check_tier(tier):
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}; got {tier!r}")


def suite(tier="quick", ops_=None, seed=0):
    """Every case of the tier, op by op in registry order (or for the ops named)."""
    _check_tier(tier)
    unknown = sorted(set(ops_ or ()) - set(_REGISTRY))
    if unknown:
        raise ValueError(f"ops must be among {', '.join(_REGISTRY)}; got {', '.join(unknown)}")
    return [c for op in (ops_ or _REGISTRY) for c in _REGISTRY[op][0](seed) if tier == "full" or c.tier == "quick"]


def timing_case(op, tier="quick", seed=0):
    _check_tier(tier)
    return _REGISTRY[op][1](tier, seed)


# softmax family: rows of logits -------------------------------------------------------

SOFTMAX_OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs")
ROW_SHAPES = {"quick": ((8, 1000), (4, 32000), (1, 151936)),
              "full": ((3, 63), (64, 1025), (16, 16385), (8, 32000), (4, 151936))}
# Every row kind runs on these shapes; the quick tier keeps them small because the cuda backend
# runs in the Triton interpreter and ascend in a host emulation on a machine without GPU or NPU.
KIND_SHAPES = {"quick": ((8, 1000),), "full": ROW_SHAPES["full"]}
ADVERSARIAL_SHAPE = {"quick": (4, 1000), "full": (64, 32000)}
# Batch x vocab of real RL runs (Llama-2 32000, Llama-3 128256, Qwen2 151936), on random logits.
VOCAB_SHAPES = {"quick": ((4, 32000), (1, 128256), (1, 151936)), "full": ((256, 32000), (64, 128256), (256, 151936))}
SOFTMAX_TIMING_SHAPE = {"quick": (16, 32000), "full": (64, 32000)}
TEMPERATURES = (1.0, 0.7)


def _softmax_inputs(op, kind, rows, n, temperature, seed):
    if kind in ADVERSARIAL_KINDS:
        x, mask = make_adversarial(kind, rows, n, seed), None
    else:
        x, mask = make_logits(kind, rows, n, seed)
    args = (x, make_tokens(x, seed)) if op == "token_logprobs" else (x, mask)
    return args, ({} if op == "sum" else {"temperature": temperature})


def _softmax_case(op, tier, kind, rows, n, temperature, seed):
    shapes = {"x": [rows, n]}
    if op == "token_logprobs":
        shapes["tokens"] = [rows]
    elif kind == "masked":
        shapes["mask"] = [rows, n]
    name = f"{op}/{kind}/{rows}x{n}" + ("" if temperature == 1.0 else f"/T{temperature:g}")
    return Case(name, op, tier, shapes, partial(_softmax_inputs, op, kind, rows, n, temperature, seed))


def _softmax_cases(op, seed):
    kinds = [k for k in ROW_KINDS if not (op == "token_logprobs" and k == "masked")]   # it takes no mask
    temps = (1.0,) if op == "sum" else TEMPERATURES
    for tier in TIERS:
        for rows, n in KIND_SHAPES[tier]:
            for kind in kinds:
                for temperature in (temps if kind == "random" else (1.0,)):
                    yield _softmax_case(op, tier, kind, rows, n, temperature, seed)
        for kind in ADVERSARIAL_KINDS:
            for temperature in temps:
                yield _softmax_case(op, tier, kind, *ADVERSARIAL_SHAPE[tier], temperature, seed)
        for rows, n in VOCAB_SHAPES[tier]:
            for temperature in temps:
                yield _softmax_case(op, tier, "random", rows, n, temperature, seed)


def _softmax_timing(op, tier, seed):
    return _softmax_case(op, tier, "random", *SOFTMAX_TIMING_SHAPE[tier], 1.0, seed)


# element-wise exp and log ----------------------------------------------------------------

ELEMENTWISE_OPS = ("exp", "log")
ELEMENTWISE_N = {"quick": 1 << 16, "full": 1 << 22}


def _elementwise_case(op, tier, kind, n, seed):
    make = make_elementwise if kind == "sweep" else make_subnormal_elementwise
    size = n + len(ELEMENTWISE_SPECIALS) if kind == "sweep" else n
    return Case(f"{op}/{kind}/{n}", op, tier, {"x": [size]}, lambda: ((make(op, n, seed),), {}))


def _elementwise_cases(op, seed):
    yield _elementwise_case(op, "quick", "sweep", ELEMENTWISE_N["quick"], seed)
    yield _elementwise_case(op, "quick", "subnormal", 4096, seed)
    yield _elementwise_case(op, "full", "sweep", ELEMENTWISE_N["full"], seed)


def _elementwise_timing(op, tier, seed):
    return _elementwise_case(op, tier, "sweep", ELEMENTWISE_N[tier], seed)


# RL operators on [batch, T] response batches -------------------------------------------

RL_OPS = ("gae", "masked_mean", "masked_whiten", "kl_penalty", "ppo_policy_loss")
RL_SHAPES = {"quick": ((4, 1000), (2, 8192)), "full": ((64, 512), (256, 4096), (256, 8192))}
RL_ADVERSARIAL_SHAPE = {"quick": (4, 512), "full": (64, 8192)}
RL_TIMING_SHAPE = {"quick": (64, 512), "full": (256, 4096)}

# Each op's variants: name -> (positional arguments after the tensors, keyword arguments).
RL_VARIANTS = {
    "gae": {"carry-g1-l1": ((1.0, 1.0), {}), "carry-g0.99-l0.95": ((0.99, 0.95), {}),
            "zero-g0.99-l0.95": ((0.99, 0.95), {"mask_mode": "zero"})},
    "masked_mean": {"all": ((), {}), "rows": ((), {"dim": -1})},
    "masked_whiten": {"unbiased": ((), {}), "biased-unshifted": ((), {"unbiased": False, "shift_mean": False}),
                      "biased-clamp": ((), {"unbiased": False, "eps_mode": "clamp"})},
    "kl_penalty": {**{k: ((k,), {}) for k in ops.KL_KINDS},
                   "low_var_kl": (("k3",), {"log_ratio_clamp": 20.0, "clamp": 10.0})},
    "ppo_policy_loss": {**{agg: ((), {"agg": agg}) for agg in ops.PPO_AGGS},
                        "dual-clip3": ((), {"dual_clip": 3.0})},
}
RL_TENSORS = {"gae": ("rewards", "values", "mask"), "masked_mean": ("advantages", "mask"),
              "masked_whiten": ("advantages", "mask"), "kl_penalty": ("logp", "ref_logp"),
              "ppo_policy_loss": ("logp", "old_logp", "advantages", "mask")}


def _rl_inputs(op, variant, kind, rows, t, seed):
    rl = (make_rl_batch if kind == "padded" else make_rl_adversarial)(rows, t, seed)
    extra, kwargs = RL_VARIANTS[op][variant]
    return tuple(rl[name] for name in RL_TENSORS[op]) + extra, dict(kwargs)


def _rl_case(op, tier, variant, kind, rows, t, seed):
    return Case(f"{op}/{variant}/{kind}/{rows}x{t}", op, tier, {name: [rows, t] for name in RL_TENSORS[op]},
                partial(_rl_inputs, op, variant, kind, rows, t, seed))


def _rl_cases(op, seed):
    for tier in TIERS:
        for variant in RL_VARIANTS[op]:
            for rows, t in RL_SHAPES[tier]:
                yield _rl_case(op, tier, variant, "padded", rows, t, seed)
            yield _rl_case(op, tier, variant, "adversarial", *RL_ADVERSARIAL_SHAPE[tier], seed)


def _rl_timing(op, tier, seed):
    return _rl_case(op, tier, next(iter(RL_VARIANTS[op])), "padded", *RL_TIMING_SHAPE[tier], seed)


# selection and sampling (spec 19-23) -----------------------------------------------------

SAMPLING_OPS = ("topk", "filter_logits", "sample", "beam_search_step")
SELECT_SHAPES = {"quick": ((8, 1000), (2, 32000), (1, 151936)), "full": ((256, 32000), (64, 128256), (64, 151936))}
SELECT_KINDS = ("random", "equal", "peaked", "specials")
TOPK_KS = (1, 50)
# Filter settings (keyword arguments of filter_logits and sample); "per-row" gives every row its own.
FILTERS = {"k50-p0.9-T0.7": {"temperature": 0.7, "top_k": 50, "top_p": 0.9},
           "p0.5": {"top_p": 0.5},
           "minp0.1-T1.3": {"temperature": 1.3, "min_p": 0.1},
           "k1": {"top_k": 1},
           "per-row": None}
BEAM_SHAPES = {"quick": ((1, 4, 1000), (2, 4, 32000)), "full": ((8, 8, 32000), (4, 8, 151936))}
SAMPLING_TIMING_SHAPE = {"quick": (16, 32000), "full": (64, 151936)}


def _per_row_filters(rows):
    """Every row its own temperature (some greedy, for sample), top-k, top-p and min-p."""
    r = torch.arange(rows)
    return {"temperature": torch.tensor([0.0, 0.7, 1.0, 1.5])[r % 4],
            "top_k": torch.tensor([0, 5, 50, 0, 1])[r % 5],
            "top_p": torch.tensor([1.0, 0.9, 0.5, 1e-6, 0.95, 1.0])[r % 6],
            "min_p": torch.tensor([0.0, 0.0, 0.1])[r % 3]}


def _sampling_inputs(op, variant, kind, rows, n, seed):
    x, _ = make_logits(kind, rows, n, seed)
    if op == "topk":
        return (x, variant), {}
    kwargs = _per_row_filters(rows) if FILTERS[variant] is None else dict(FILTERS[variant])
    if op == "filter_logits":
        if variant == "per-row":
            kwargs["temperature"] = torch.where(kwargs["temperature"] == 0, 1.0, kwargs["temperature"])
        return (x,), kwargs
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 + seed
    positions = torch.arange(rows, dtype=torch.int64) * 31 + 2**33
    return (x, seeds, positions), kwargs


def _sampling_case(op, tier, variant, kind, rows, n, seed):
    shapes = {"logits": [rows, n]} if op != "topk" else {"x": [rows, n]}
    if op == "sample":
        shapes.update(seeds=[rows], positions=[rows])
    name = f"{op}/{'k' if op == 'topk' else ''}{variant}/{kind}/{rows}x{n}"
    return Case(name, op, tier, shapes, partial(_sampling_inputs, op, variant, kind, rows, n, seed))


def _sampling_cases(op, seed):
    variants = TOPK_KS if op == "topk" else tuple(FILTERS)
    for tier in TIERS:
        for i, (rows, n) in enumerate(SELECT_SHAPES[tier]):
            for kind in (SELECT_KINDS if i == 0 else ("random",)):
                # Long rows: one top-k and one top-p-only setting (the two search paths of spec 21).
                for variant in (variants if i == 0 else variants[:2]):
                    yield _sampling_case(op, tier, variant, kind, rows, n, seed)


def _sampling_timing(op, tier, seed):
    variant = TOPK_KS[1] if op == "topk" else next(iter(FILTERS))
    return _sampling_case(op, tier, variant, "random", *SAMPLING_TIMING_SHAPE[tier], seed)


def _beam_inputs(requests, width, vocab, seed):
    rng = np.random.default_rng([seed, requests, width, vocab, 5])
    logits = torch.from_numpy((rng.standard_normal((requests, width, vocab)) * 3).astype(np.float32))
    scores = torch.from_numpy(-np.abs(rng.standard_normal((requests, width)) * 4).astype(np.float32))
    scores[0, 1:] = -np.inf                  # request 0 at its first step: one live beam, the others -inf
    return (scores, logits, width), {}


def _beam_case(tier, requests, width, vocab, seed):
    return Case(f"beam_search_step/{requests}x{width}x{vocab}", "beam_search_step", tier,
                {"beam_scores": [requests, width], "logits": [requests, width, vocab]},
                partial(_beam_inputs, requests, width, vocab, seed))


def _beam_cases(seed):
    for tier in TIERS:
        for shape in BEAM_SHAPES[tier]:
            yield _beam_case(tier, *shape, seed)


def _beam_timing(tier, seed):
    return _beam_case(tier, *BEAM_SHAPES[tier][-1], seed)


# model building blocks (spec 24) ----------------------------------------------------------

MODEL_OPS = ("linear", "rms_norm", "rotary", "attention", "silu_mul", "moe")
# Each op's cases per tier, (kind, shape), the shape in the op's own terms:
#   linear (M, K, N); rms_norm (M, D); rotary (T, H, D); attention (B, H, Tq, Tk, D); silu_mul (n,);
#   moe (M, D, E, I, k).
# K and D = 1100 cross spec 3's 1024-lane chunk and 16385 a segment. The quick tier stays small: in CI the
# cuda backend runs in the Triton interpreter and ascend in a host emulation.
_ADVERSARIAL_ROWS = ("subnormal", "huge", "signed_zero")
MODEL_CASES = {
    "linear": {"quick": [("random", (5, 63, 33)), ("bias", (3, 1100, 17)), ("random", (1, 64, 9)),
                         ("specials", (8, 64, 9)), *((kind, (4, 64, 9)) for kind in _ADVERSARIAL_ROWS)],
               "full": [("random", (64, 4096, 256)), ("bias", (257, 1025, 130)), ("random", (4, 16385, 8)),
                        *((kind, (64, 1100, 64)) for kind in ("specials", *_ADVERSARIAL_ROWS))]},
    "rms_norm": {"quick": [("random", (8, 64)), ("random", (3, 1100)),
                           *((kind, (8, 64)) for kind in ("specials", *_ADVERSARIAL_ROWS))],
                 "full": [("random", (256, 4096)), ("random", (8, 16385)),
                          *((kind, (64, 1100)) for kind in ("specials", *_ADVERSARIAL_ROWS))]},
    "rotary": {"quick": [("random", (5, 4, 16)), ("random", (3, 2, 130)), ("specials", (8, 1, 64))],
               "full": [("random", (256, 32, 128)), ("specials", (64, 4, 128))]},
    "attention": {"quick": [("prefill", (2, 2, 9, 9, 16)), ("decode", (3, 2, 1, 40, 16)),
                            ("noncausal", (2, 2, 5, 11, 8)), ("specials", (2, 2, 8, 8, 16))],
                  "full": [("prefill", (4, 8, 256, 256, 64)), ("decode", (32, 8, 1, 2048, 64)),
                           ("noncausal", (2, 4, 64, 1100, 64)), ("specials", (2, 4, 64, 64, 64))]},
    "silu_mul": {"quick": [("sweep", (1 << 14,)), ("subnormal", (1024,))],
                 "full": [("sweep", (1 << 22,))]},
    "moe": {"quick": [("random", (6, 16, 8, 12, 2)), ("tied", (5, 16, 8, 12, 2))],
            "full": [("random", (64, 256, 8, 128, 2)), ("random", (32, 1100, 16, 64, 4)),
                     ("tied", (64, 64, 8, 32, 2))]},
}
# The case each op's cost is measured on: (kind, shape per tier).
MODEL_TIMING = {"linear": ("random", {"quick": (16, 256, 64), "full": (64, 1024, 1024)}),
                "rms_norm": ("random", {"quick": (16, 1024), "full": (256, 4096)}),
                "rotary": ("random", {"quick": (16, 4, 64), "full": (256, 32, 128)}),
                "attention": ("prefill", {"quick": (1, 2, 16, 16, 32), "full": (2, 8, 128, 128, 64)}),
                "silu_mul": ("sweep", {"quick": (1 << 14,), "full": (1 << 20,)}),
                "moe": ("random", {"quick": (8, 32, 8, 16, 2), "full": (64, 256, 8, 128, 2)})}
RMS_EPS = 1e-6


def _normal(rng, shape, scale=1.0):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def _rows_of_kind(kind, rows, n, seed):
    """float32 [rows, n] of a row kind (ROW_KINDS; "bias" rows are "random") or an adversarial kind."""
    if kind in ADVERSARIAL_KINDS:
        return make_adversarial(kind, rows, n, seed)
    return make_logits("random" if kind == "bias" else kind, rows, n, seed)[0]


def _linear_inputs(rng, kind, shape, seed):
    """x of the kind; weight [N, K] with row 0 non-negative, so that x's all -0.0 rows (signed_zero) give an
    all -0.0 product row, whose exact zero is +0.0 (spec 24.1, 2.0.0); specials add a half -0.0 row and a subnormal
    weight."""
    m, k, n = shape
    x = _rows_of_kind(kind, m, k, seed)
    weight = _normal(rng, (n, k), 1.0 / np.sqrt(k))
    weight[0] = weight[0].abs()
    if kind == "specials":
        weight[1, : k // 2] = -0.0
        weight[2, 0] = 1e-40
    bias = _normal(rng, (n,)) if kind == "bias" else None
    return (x, weight, bias), {}


def _rms_norm_inputs(rng, kind, shape, seed):
    return (_rows_of_kind(kind, *shape, seed), _normal(rng, shape[1:]) + 1.0, RMS_EPS), {}


def _rotary_inputs(rng, kind, shape, seed):
    """x [T, H, D] and cos, sin [T, 1, D/2] (broadcast over heads) on the unit circle, position 0 the identity.
    The tables come from uniforms and binary64's correctly rounded sqrt, not from a libm cos and sin, so every
    host builds the same bits (ops.rotary_tables may differ in the last bit between libms, spec 24.3)."""
    t, h, d = shape
    x = _rows_of_kind(kind, t * h, d, seed).reshape(t, h, d)
    c = rng.uniform(-1.0, 1.0, (t, 1, d // 2))
    s = np.sqrt(1.0 - c * c) * np.where(rng.random(c.shape) < 0.5, -1.0, 1.0)
    c[0], s[0] = 1.0, 0.0
    return (x, torch.from_numpy(c.astype(np.float32)), torch.from_numpy(s.astype(np.float32))), {}


def _attention_inputs(rng, kind, shape, seed):
    """q [B, H, Tq, D], k and v [B, H, Tk, D]; kv_lengths in [1, Tk] per batch row, row 0 full.
    decode: one query against a KV cache whose slots past each length hold NaN (k) and inf (v), which must
    change no bit; specials: NaN, +-inf and +-0 in the queries of batch row 0 (NaN or inf reaches only its own
    query), and the keys of batch row 1 scaled by 100, so that its softmax is nearly one-hot and most exp terms
    underflow."""
    b, h, tq, tk, d = shape
    q, k, v = _normal(rng, (b, h, tq, d)), _normal(rng, (b, h, tk, d)), _normal(rng, (b, h, tk, d))
    lengths = torch.from_numpy(rng.integers(1, tk + 1, b).astype(np.int64))
    lengths[0] = tk
    if kind == "decode":
        unused = (torch.arange(tk)[None, :] >= lengths[:, None])[:, None, :, None].expand_as(k)    # [B, H, Tk, D]
        k[unused], v[unused] = float("nan"), float("inf")
    if kind == "specials":
        q[0] = torch.from_numpy(_specials(rng, q[0].reshape(-1, d).numpy().copy()).reshape(q.shape[1:]))
        k[1:2] *= 100.0
    return (q, k, v), {"causal": kind != "noncausal", "kv_lengths": lengths}


def _silu_mul_inputs(rng, kind, shape, seed):
    """gate: the element-wise specials, then uniforms over exp's range [-110, 95] (sweep), or signed subnormals;
    up: standard normal."""
    (n,) = shape
    if kind == "sweep":
        gate = np.concatenate([ELEMENTWISE_SPECIALS, rng.uniform(-110.0, 95.0, n - len(ELEMENTWISE_SPECIALS))])
    else:
        gate = np.where(rng.random(n) < 0.5, -1.0, 1.0) * np.exp(rng.uniform(np.log(1.4e-45), np.log(1.1e-38), n))
    return (torch.from_numpy(gate.astype(np.float32)), _normal(rng, (n,))), {}


def _moe_inputs(rng, kind, shape, seed):
    """x [M, D] and Qwen3-MoE weights. tied: router rows 5 and 7 copy row 2 and row 6 copies row 3, so every token
    ties those experts (a token whose best expert is 2 has a three-way tie across the top-2 boundary), and token 0
    is all zeros (every expert ties at 0): the lowest-index rule decides which experts count and their order."""
    m, d, e, inter, k = shape
    x = _normal(rng, (m, d))
    router = _normal(rng, (e, d), 1.0 / np.sqrt(d))
    if kind == "tied":
        router[5], router[7], router[6] = router[2], router[2], router[3]
        x[0] = 0.0
    gate, up = _normal(rng, (e, inter, d), 1.0 / np.sqrt(d)), _normal(rng, (e, inter, d), 1.0 / np.sqrt(d))
    down = _normal(rng, (e, d, inter), 1.0 / np.sqrt(inter))
    return (x, router, gate, up, down, k), {}


_MODEL_BUILDERS = {"linear": _linear_inputs, "rms_norm": _rms_norm_inputs, "rotary": _rotary_inputs,
                   "attention": _attention_inputs, "silu_mul": _silu_mul_inputs, "moe": _moe_inputs}


def model_inputs(op, kind, shape, seed=0):
    """(args, kwargs) of ops.<op> for a model case of kind and shape (MODEL_CASES gives the shapes' terms)."""
    rng = np.random.default_rng([seed, *shape, MODEL_OPS.index(op), 200])
    return _MODEL_BUILDERS[op](rng, kind, shape, seed)


def _model_shapes(op, kind, shape):
    """Input name -> shape, for the tensors of a model case in argument order (keyword tensors last)."""
    if op == "linear":
        m, k, n = shape
        return {"x": [m, k], "weight": [n, k], **({"bias": [n]} if kind == "bias" else {})}
    if op == "rms_norm":
        return {"x": list(shape), "weight": [shape[1]]}
    if op == "rotary":
        t, h, d = shape
        return {"x": [t, h, d], "cos": [t, 1, d // 2], "sin": [t, 1, d // 2]}
    if op == "attention":
        b, h, tq, tk, d = shape
        return {"q": [b, h, tq, d], "k": [b, h, tk, d], "v": [b, h, tk, d], "kv_lengths": [b]}
    if op == "silu_mul":
        return {"gate": list(shape), "up": list(shape)}
    m, d, e, inter, _ = shape
    return {"x": [m, d], "router_weight": [e, d], "gate_proj": [e, inter, d], "up_proj": [e, inter, d],
            "down_proj": [e, d, inter]}


def _model_case(op, tier, kind, shape, seed):
    return Case(f"{op}/{kind}/{'x'.join(map(str, shape))}", op, tier, _model_shapes(op, kind, shape),
                partial(model_inputs, op, kind, shape, seed))


def _model_cases(op, seed):
    for tier in TIERS:
        for kind, shape in MODEL_CASES[op][tier]:
            yield _model_case(op, tier, kind, shape, seed)


def _model_timing(op, tier, seed):
    kind, shapes = MODEL_TIMING[op]
    return _model_case(op, tier, kind, shapes[tier], seed)


for _op in SOFTMAX_OPS:
    register(_op, partial(_softmax_cases, _op), partial(_softmax_timing, _op))
for _op in ELEMENTWISE_OPS:
    register(_op, partial(_elementwise_cases, _op), partial(_elementwise_timing, _op))
for _op in RL_OPS:
    register(_op, partial(_rl_cases, _op), partial(_rl_timing, _op))
for _op in SAMPLING_OPS[:3]:
    register(_op, partial(_sampling_cases, _op), partial(_sampling_timing, _op))
register("beam_search_step", _beam_cases, _beam_timing)
for _op in MODEL_OPS:
    register(_op, partial(_model_cases, _op), partial(_model_timing, _op))
