"""linear (spec 24.1, 2.0.0) on a backend's device against torch's own matmul there (issue 24): the canonical
`linear` against torch bf16 and float32 `F.linear` (cuBLAS on a GPU), forward and forward + backward, in
TFLOP/s-equivalent.

The canonical linear does 20 int8 slice products per output (spec 24.1: five digits of x by four of the weight),
so its "TFLOP/s-equivalent" is the useful work of one float matmul over its time: 2·M·N·K per forward, three times
that for forward + backward (y, dx and dW are each an M·N·K product), over the median time. torch's float32 runs
with TF32 off (torch.backends.cuda.matmul.fp32_precision = "ieee", restored afterwards: IEEE float32 products, the
precision the canonical linear is compared with); its bf16 runs with torch's defaults.

Shapes (M, K, N), x [M, K] · W[N, K]ᵀ, no bias: 4096³; an lm_head, [128, 1024] × [32768, 1024]; and Qwen3-0.6B's
lm_head, [128, 1024] × [151936, 1024] (hidden_size 1024, vocab_size 151936: the model's config.json,
huggingface.co/Qwen/Qwen3-0.6B). A shape that does not fit in the device's memory is recorded as such, not fatal.
Forward + backward is torch.autograd.grad of the output with respect to x and W (no .grad accumulation), through
bitparity's autograd (dx the same product, dW exact over blocks of 32 rows then row-folded: spec 29.2) and through
torch's.

Clocks: compare/timing.py, interleaved (each round times the three calls once), after one warm-up call of each
(Triton compiles its kernels there): CUDA events on a GPU, perf_counter on the CPU. Each measurement stops after
`repeats` runs, or after BUDGET_S seconds once it has three, so the hardware shapes stay under a minute.
Without a GPU the `cuda` backend is the Triton interpreter on the CPU and torch's matmul is the CPU's: those rows
time a test double and say nothing about a GPU; each row's `where` says what ran.
"""

import torch
from tabulate import tabulate

from .. import ops
from ..backends import device_type
from .bench import where
from .timing import measure_interleaved

SHAPES = {"hardware": ((4096, 4096, 4096), (128, 1024, 32768), (128, 1024, 151936)),
          "small": ((4, 32, 16),)}
PASSES = {"forward": 1, "forward+backward": 3}        # M·N·K products per pass: y; y, dx and dW
IMPLS = ("bitparity", "torch bf16", "torch float32")
BUDGET_S = 1.0
WARMUP = 1


def _calls(backend, shape, device, seed):
    """{pass: {impl: fn}} for x [M, K] · W[N, K]ᵀ on device."""
    m, k, n = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, generator=gen)
    w = torch.randn(n, k, device=device, generator=gen) / k ** 0.5
    g = torch.randn(m, n, device=device, generator=gen)
    xb, wb, gb = x.bfloat16(), w.bfloat16(), g.bfloat16()

    def linear(a, b):
        return ops.linear(a, b, backend=backend)
    forward = {"bitparity": lambda: linear(x, w), "torch bf16": lambda: torch.nn.functional.linear(xb, wb),
               "torch float32": lambda: torch.nn.functional.linear(x, w)}
    xl, wl, xbl, wbl = (t.clone().requires_grad_() for t in (x, w, xb, wb))
    both = {"bitparity": lambda: torch.autograd.grad(linear(xl, wl), (xl, wl), g),
            "torch bf16": lambda: torch.autograd.grad(torch.nn.functional.linear(xbl, wbl), (xbl, wbl), gb),
            "torch float32": lambda: torch.autograd.grad(torch.nn.functional.linear(xl, wl), (xl, wl), g)}
    return {"forward": forward, "forward+backward": both}


def _rows(backend, shape, device, repeats, seed):
    m, k, n = shape
    rows = []
    for pass_, fns in _calls(backend, shape, device, seed).items():
        flop = 2 * PASSES[pass_] * m * n * k
        timings = measure_interleaved(fns, device, WARMUP, repeats, BUDGET_S)
        for impl, t in timings.items():
            rows.append({"shape": list(shape), "pass": pass_, "impl": impl,
                         "where": where(backend) if impl == "bitparity" else where("native"), "device": device,
                         "clock": t.clock, "runs": t.runs, "median_ms": t.median_ms, "q1_ms": t.q1_ms,
                         "q3_ms": t.q3_ms, "flop": flop, "tflops": flop / (t.median_ms * 1e9)})
    return rows


def run(backend, small, repeats, seed=0):
    """The rows of every shape of the tier ("small" or "hardware"): one per shape, pass and impl, or one per shape
    with `error` where the device's memory did not hold it."""
    device = device_type(backend)
    matmul = torch.backends.cuda.matmul
    precision = matmul.fp32_precision
    matmul.fp32_precision = "ieee"                   # TF32 off: torch's float32 baseline multiplies in float32
    try:
        rows = []
        for shape in SHAPES["small" if small else "hardware"]:
            try:
                rows += _rows(backend, shape, device, repeats, seed)
            except torch.OutOfMemoryError as e:      # Qwen3-0.6B's lm_head on a small GPU: record it, go on
                rows.append({"shape": list(shape), "device": device, "error": f"out of memory: {e}".split("\n")[0]})
            if device == "cuda":
                torch.cuda.empty_cache()
        return rows
    finally:
        matmul.fp32_precision = precision


def render(rows, fmt):
    """One line per shape and pass: each impl's median ms and TFLOP/s-equivalent, and bitparity's time over each
    torch baseline's; a shape the device could not hold, its error. fmt: a tabulate format ("github" for Markdown,
    "simple" for a terminal)."""
    lines, measured = [], {}
    for r in rows:
        shape = "[{0}, {1}] × [{2}, {1}]".format(*r["shape"])
        if "error" in r:
            lines.append([shape, "not run", r["error"]] + [""] * (len(IMPLS) + 1))
        elif (shape, r["pass"]) in measured:
            measured[(shape, r["pass"])][r["impl"]] = r
        else:
            measured[(shape, r["pass"])] = {r["impl"]: r}
            lines.append((shape, r["pass"]))                 # filled in below, in the rows' order
    for i, line in enumerate(lines):
        if isinstance(line, tuple):
            by_impl = measured[line]
            ours = by_impl["bitparity"]["median_ms"]
            lines[i] = [*line, *(f"{by_impl[m]['median_ms']:.3g} ms ({by_impl[m]['tflops']:.3g})" for m in IMPLS),
                        f"{ours / by_impl['torch bf16']['median_ms']:.2f}×",
                        f"{ours / by_impl['torch float32']['median_ms']:.2f}×"]
    headers = ["x · Wᵀ", "pass", *(f"{m}: time (TFLOP/s-eq.)" for m in IMPLS), "bitparity / bf16 time",
               "bitparity / float32 time"]
    return tabulate(lines, headers=headers, tablefmt=fmt)
