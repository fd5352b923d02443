"""Cost report: each op on each backend against torch's native op and the copy bandwidth of the same device.

For every op, shape and backend one row gives the median time with its
spread (quartiles, min and max), the ratio to the `native` backend (torch's
own ops) on the same device, and the throughput in GB/s of the bytes the op
must move (every input read once, every output written once) next to the
device's copy bandwidth, measured in the same run by a large torch copy_.
The gradient ops (compare/grad_cases.py) are timed the same way: "<op>.backward" is torch.autograd.grad of the
op's output at the shape, on a graph built once (the backward alone), against torch autograd through torch's op;
the training steps (AdamW.step, SGD.step, clip_grad_norm_, GradientFold) are their conformance case of the tier
(3 optimizer steps of a parameter of TRAIN_N elements, ...) against torch.optim and torch's clip, whole.  Their
bytes are the inputs and the upstream gradient read once and the gradients written once.
Clocks: CUDA events on a GPU, NPU events on Ascend, perf_counter on the CPU
(compare/timing.py).  The `cuda` backend without a GPU runs in the Triton
interpreter and `ascend` without an NPU in the host emulation, both on the
CPU: their rows time those test doubles, not a GPU or an NPU.
"""

import json

import torch
from tabulate import tabulate

from .. import ops
from ..backends import availability, device_type
from . import cases, grad_cases
from .cli_common import Progress
from .run import ALL_OPS, ELEMENTWISE_OPS, GRAD_OPS, MODEL_OPS, SAMPLING_OPS, SOFTMAX_OPS, interpreted
from .timing import measure

BENCH_BACKENDS = ("cpu", "cuda", "ascend")

# Shapes per tier: [rows, vocab] for the softmax family and the sampling ops (beam_search_step: rows
# are 4-beam requests' beams), [n] for exp/log, [B, T] for the RL ops; each model op has its own entry,
# in the terms of cases.MODEL_CASES (linear (M, K, N), attention (B, H, Tq, Tk, D), ...).
SHAPES = {
    "quick": {"softmax": ((16, 32000),), "elementwise": ((1 << 20,),), "rl": ((64, 512),),
              "sampling": ((16, 32000),),
              "linear": ((64, 1024, 1024),), "rms_norm": ((64, 4096),), "rotary": ((64, 32, 128),),
              "attention": ((1, 8, 128, 128, 64), (8, 8, 1, 512, 64)), "silu_mul": ((1 << 20,),),
              "moe": ((64, 256, 8, 128, 2),), "embedding": ((512, 32000, 256),)},
    "full": {"softmax": ((64, 151936), (4096, 32000), (256, 151936)), "elementwise": ((1 << 24,),),
             "rl": ((256, 4096), (4096, 512)), "sampling": ((64, 151936),),
             "linear": ((1, 4096, 4096), (256, 4096, 4096)), "rms_norm": ((4096, 4096),),
             "rotary": ((4096, 32, 128),), "attention": ((4, 32, 512, 512, 128), (64, 32, 1, 2048, 128)),
             "silu_mul": ((1 << 24,),), "moe": ((512, 1024, 32, 512, 4),), "embedding": ((4096, 151936, 1024),)},
}
# The sampling ops' settings: the suite's vLLM-style top-k 50, top-p 0.9 at T = 0.7; beams of 4.
SAMPLING_FILTERS = cases.FILTERS["k50-p0.9-T0.7"]
BEAMS = 4
REPEATS = {"quick": 5, "full": 20}
WARMUP = {"quick": 1, "full": 3}
BUDGET_S = 2.0                  # per measurement: stop repeating after this much time (at least 3 runs)
COPY_BYTES = {"cpu": 1 << 28, "cuda": 1 << 30, "npu": 1 << 30}    # bytes each side of the copy


def family(op):
    """The key of op's shapes in SHAPES: a model op has its own; "<op>.backward" takes op's; the training steps
    time their conformance case (grad_cases.timing_case) and take no shape ("steps")."""
    if op in grad_cases.STEP_OPS:
        return "steps"
    op = op.removesuffix(".backward")
    if op in MODEL_OPS or op == "embedding":
        return op
    if op in SOFTMAX_OPS:
        return "softmax"
    if op in SAMPLING_OPS:
        return "sampling"
    return "elementwise" if op in ELEMENTWISE_OPS else "rl"


def default_shapes(op, tier):
    if family(op) == "steps":
        return (tuple(next(iter(grad_cases.timing_case(op, tier).shapes.values()))),)
    return SHAPES[tier][family(op)]


def make_call(op, shape, device, seed=0):
    """(args, kwargs) of ops.<op> on inputs of shape on device, from compare/cases.py's generators."""
    if op in SOFTMAX_OPS:
        x, _ = cases.make_logits("random", *shape, seed)
        args = (x, cases.make_tokens(x, seed)) if op == "token_logprobs" else (x,)
        kwargs = {}
    elif op in ELEMENTWISE_OPS:
        args, kwargs = (cases.make_elementwise(op, *shape, seed),), {}
    elif op in SAMPLING_OPS:
        args, kwargs = _sampling_call(op, shape, seed)
    elif op in MODEL_OPS:
        args, kwargs = cases.model_inputs(op, cases.MODEL_TIMING[op][0], shape, seed)
    else:
        rl = cases.make_rl_batch(*shape, seed)
        args, kwargs = {
            "gae": ((rl["rewards"], rl["values"], rl["mask"], 0.99, 0.95), {}),
            "masked_mean": ((rl["advantages"], rl["mask"]), {}),
            "masked_whiten": ((rl["advantages"], rl["mask"]), {}),
            "kl_penalty": ((rl["logp"], rl["ref_logp"], "k3"), {}),
            "ppo_policy_loss": ((rl["logp"], rl["old_logp"], rl["advantages"], rl["mask"]), {}),
        }[op]
    return cases.to_device((args, kwargs), device)


def _sampling_call(op, shape, seed):
    rows, vocab = shape
    x, _ = cases.make_logits("random", rows, vocab, seed)
    if op == "topk":
        return (x, 50), {}
    if op == "filter_logits":
        return (x,), dict(SAMPLING_FILTERS)
    if op == "sample":
        return (x, torch.arange(rows), torch.zeros(rows, dtype=torch.int64)), dict(SAMPLING_FILTERS)
    requests = max(1, rows // BEAMS)
    logits = x[:requests * BEAMS].reshape(requests, BEAMS, vocab)
    return (torch.zeros(requests, BEAMS), logits, BEAMS), {}


def _nbytes(values):
    parts = values if isinstance(values, tuple) else (values,)
    return sum(p.numel() * p.element_size() for p in parts if isinstance(p, torch.Tensor))


def copy_bandwidth(device, warmup=1, repeats=5):
    """GB/s of dst.copy_(src) on device: bytes read plus bytes written, over the median time."""
    n = COPY_BYTES.get(device, COPY_BYTES["cpu"]) // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, warmup, repeats)
    return 2 * src.numel() * 4 / (t.median_ms * 1e6)


def where(backend):
    """What runs a backend's timed calls here, in a few words."""
    if backend == "native":
        return "torch"
    dev = device_type(backend)
    if interpreted(backend):
        # With TRITON_INTERPRET=1 on a GPU box the tensors live on the GPU but every launch is
        # interpreted on the host: the time is the interpreter's, whatever clock measured it.
        return "Triton interpreter (CPU)" if dev == "cpu" else "Triton interpreter (CPU, GPU tensors)"
    if backend == "ascend" and dev == "cpu":
        return "host emulation (CPU)"
    return {"cpu": "CPU", "cuda": "GPU", "npu": "NPU"}[dev]


def _row(op, shape, backend, device, t, nbytes, native_ms, copy_gbs):
    gbs = nbytes / (t.median_ms * 1e6)
    return {"op": op, "shape": list(shape), "backend": backend, "where": where(backend), "device": device,
            "clock": t.clock, "runs": t.runs, "median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms,
            "min_ms": t.min_ms, "max_ms": t.max_ms, "ratio_to_native": t.median_ms / native_ms,
            "bytes": nbytes, "gb_per_s": gbs, "copy_gb_per_s": copy_gbs, "fraction_of_copy": gbs / copy_gbs}


def check(backends, ops_, tier, repeats, warmup):
    """Raise ValueError naming the argument if a request cannot run here (before any timing)."""
    if tier not in SHAPES:
        raise ValueError(f"tier must be one of {', '.join(SHAPES)}; got {tier!r}")
    for b in backends:
        if b not in BENCH_BACKENDS:
            raise ValueError(f"backends must be among {', '.join(BENCH_BACKENDS)}; got {b!r}")
    for op in ops_:
        if op not in ALL_OPS:
            raise ValueError(f"ops must be among {', '.join(ALL_OPS)}; got {op!r}")
    if repeats is not None and (not isinstance(repeats, int) or repeats < 1):
        raise ValueError(f"repeats must be an integer >= 1; got {repeats!r}")
    if warmup is not None and (not isinstance(warmup, int) or warmup < 0):
        raise ValueError(f"warmup must be an integer >= 0; got {warmup!r}")
    for b in backends:
        available, reason = availability(b)
        if not available:
            raise ValueError(f"backend {b!r} is not available here: {reason}")


def run(backends=None, ops_=ALL_OPS, shapes=None, tier="quick", repeats=None, warmup=None, progress=True, seed=0):
    """Time ops on backends; a list of dicts, one per (op, shape, backend), native rows included.

    backends: names from BENCH_BACKENDS (default: every available one).  shapes: {op: [shape, ...]}
    for the ops it names; the others take the tier's shapes.  repeats and warmup default by tier.
    """
    backends = list(backends or [b for b in BENCH_BACKENDS if availability(b)[0]])
    check(backends, ops_, tier, repeats, warmup)
    repeats = REPEATS[tier] if repeats is None else repeats
    warmup = WARMUP[tier] if warmup is None else warmup
    plan = [(op, tuple(shape)) for op in ops_ for shape in (shapes or {}).get(op, default_shapes(op, tier))]
    devices = sorted({device_type(b) for b in backends})
    copy = {d: copy_bandwidth(d) for d in devices}
    rows = []
    with Progress(len(plan) * (len(backends) + len(devices)), "bench", enabled=progress) as bar:
        for op, shape in plan:
            timer = _time_grad_op if op in GRAD_OPS else _time_op
            timer(op, shape, backends, devices, copy, warmup, repeats, seed, rows, bar, tier)
    return rows


def grad_inputs(op, shape, seed=0, tier="quick"):
    """A gradient op's case inputs (grad_cases' (args, kwargs, upstream) for "<op>.backward" at shape, on the
    CPU; for a training step, its timing case's)."""
    if op in grad_cases.STEP_OPS:
        return grad_cases.timing_case(op, tier, seed).inputs()
    forward = op.removesuffix(".backward")
    if forward == "embedding":
        return grad_cases._embedding_grad_inputs("random", shape, False, seed)
    return grad_cases._with_upstream(lambda: make_call(forward, shape, "cpu", seed), forward, seed, 0)


def _prepare(op, backend, inputs, tier, seed):
    if op in grad_cases.STEP_OPS:
        return grad_cases.timing_case(op, tier, seed).prepare(backend, inputs)
    return grad_cases._backward_prepare(op.removesuffix(".backward"), backend, inputs)


def _time_grad_op(op, shape, backends, devices, copy, warmup, repeats, seed, rows, bar, tier):
    """Append the native (torch autograd) row and each backend's row of a gradient op at shape, device by
    device."""
    inputs = grad_inputs(op, shape, seed, tier)
    for dev in devices:
        calls = {b: _prepare(op, b, inputs, tier, seed) for b in ["native"] + [b for b in backends
                                                                                if device_type(b) == dev]}
        nbytes = _nbytes(_flat_tensors(inputs)) + _nbytes(tuple(calls["native"]().values()))
        native = measure(calls["native"], dev, warmup, repeats, BUDGET_S)
        rows.append(_row(op, shape, "native", dev, native, nbytes, native.median_ms, copy[dev]))
        bar.step(f"{op} {list(shape)} native")
        for b in (b for b in calls if b != "native"):
            t = measure(calls[b], dev, warmup, repeats, BUDGET_S)
            rows.append(_row(op, shape, b, dev, t, nbytes, native.median_ms, copy[dev]))
            bar.step(f"{op} {list(shape)} {b}")


def _flat_tensors(value):
    """Every tensor in nested tuples, lists and dicts, as one tuple."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, dict):
        value = tuple(value.values())
    if isinstance(value, (tuple, list)):
        return tuple(t for v in value for t in _flat_tensors(v))
    return ()


def _time_op(op, shape, backends, devices, copy, warmup, repeats, seed, rows, bar, tier=None):
    """Append the native row and each backend's row of op at shape, device by device."""
    for dev in devices:
        args, kwargs = make_call(op, shape, dev, seed)
        fn = getattr(ops, op)
        nbytes = _nbytes(args) + _nbytes(fn(*args, **kwargs, backend="native"))
        native = measure(lambda: fn(*args, **kwargs, backend="native"), dev, warmup, repeats, BUDGET_S)
        rows.append(_row(op, shape, "native", dev, native, nbytes, native.median_ms, copy[dev]))
        bar.step(f"{op} {list(shape)} native")
        for b in (b for b in backends if device_type(b) == dev):
            t = measure(lambda: fn(*args, **kwargs, backend=b), dev, warmup, repeats, BUDGET_S)
            rows.append(_row(op, shape, b, dev, t, nbytes, native.median_ms, copy[dev]))
            bar.step(f"{op} {list(shape)} {b}")


HEADERS = ("op", "shape", "backend", "runs on", "median ms", "IQR ms", "min-max ms", "x native", "GB/s",
           "% of copy")


def render(rows, fmt):
    if fmt == "json":
        return json.dumps(rows, indent=2)
    table = [(r["op"], "x".join(map(str, r["shape"])), r["backend"], r["where"], f"{r['median_ms']:.3g}",
              f"{r['q1_ms']:.3g}-{r['q3_ms']:.3g}", f"{r['min_ms']:.3g}-{r['max_ms']:.3g}",
              f"{r['ratio_to_native']:.3g}", f"{r['gb_per_s']:.3g}", f"{100 * r['fraction_of_copy']:.1f}")
             for r in rows]
    copies = sorted({(r["device"], r["copy_gb_per_s"], r["clock"]) for r in rows})
    note = "; ".join(f"{d} copy bandwidth {g:.3g} GB/s ({c})" for d, g, c in copies)
    return f"{tabulate(table, headers=HEADERS, tablefmt='github' if fmt == 'markdown' else 'simple')}\n\n{note}"
