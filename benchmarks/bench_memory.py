"""Peak memory of the softmax family and sample at [256, 151936] float32 (155.6 MB of logits): the canonical
backends against torch's own ops (the `native` backend) with a scalar and a per-row temperature.

Method (Linux): every case runs in a fresh subprocess. It makes its inputs, calls the op once on a small
slice (so that loading the backend's library is not counted), resets the process's peak resident set size
(writing 5 to /proc/self/clear_refs), calls the op once on the full input and reads the peak back (VmHWM in
/proc/self/status). "peak MB" is that peak minus the resident set size just before the call: every byte the
call touched, its output included, whichever allocator held it (torch's, numpy's, the C backend's malloc).
"beyond output MB" subtracts the output's own size: what the op needs besides the result it returns.
Run: python benchmarks/bench_memory.py [--backends native,cpu,numpy,ascend]
"""

import argparse
import json
import subprocess
import sys

import torch
from tabulate import tabulate

import bitparity as bp

ROWS, VOCAB = 256, 151936
MB = 1e6
FAMILY = ("log_softmax", "softmax", "token_logprobs", "entropy")
SAMPLE_LOGPROBS = ("processed", "scaled", "raw")


def _status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, VOCAB, generator=g) * 3
    return {"x": x,
            "tokens": torch.randint(0, VOCAB, (ROWS,), generator=g),
            "row_temperature": 0.5 + torch.rand(ROWS, generator=g),
            "seeds": torch.arange(ROWS), "positions": torch.arange(ROWS) * 17,
            "top_k": torch.randint(20, 100, (ROWS,), generator=g),
            "top_p": 0.8 + 0.2 * torch.rand(ROWS, generator=g)}


def _call(op, temperature, backend, inp, rows):
    """One call of the case on the first `rows` rows; returns the tensors it produced."""
    x = inp["x"][:rows]
    t = inp["row_temperature"][:rows] if temperature == "per-row" else 0.7
    if op == "token_logprobs":
        return (bp.token_logprobs(x, inp["tokens"][:rows], t, backend=backend),)
    if op in FAMILY:
        return (getattr(bp, op)(x, None, t, backend=backend),)
    kind = op.split(":")[1]
    return bp.sample(x, inp["seeds"][:rows], inp["positions"][:rows], temperature=t,
                     top_k=inp["top_k"][:rows], top_p=inp["top_p"][:rows], logprobs=kind, backend=backend)


def measure_case(op, temperature, backend):
    """Run in the child: (peak MB above the RSS before the call, output MB)."""
    inp = _inputs()
    with torch.no_grad():
        _call(op, temperature, backend, inp, 2)
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        out = _call(op, temperature, backend, inp, ROWS)
        peak = _status_kb("VmHWM")
    return (peak - before) * 1024 / MB, sum(t.numel() * t.element_size() for t in out) / MB


def cases(backends):
    for op in (*FAMILY, *(f"sample:{kind}" for kind in SAMPLE_LOGPROBS)):
        for temperature in (("per-row",) if op.startswith("sample") else ("scalar", "per-row")):
            for backend in backends:
                yield op, temperature, backend


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="native,cpu,numpy,ascend")
    parser.add_argument("--case", help=argparse.SUPPRESS)      # op,temperature,backend: the child's job
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure_case(*args.case.split(","))))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; input [{ROWS}, {VOCAB}] float32 = "
          f"{ROWS * VOCAB * 4 / MB:.1f} MB")
    table = []
    for op, temperature, backend in cases(args.backends.split(",")):
        done = subprocess.run([sys.executable, __file__, "--case", f"{op},{temperature},{backend}"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{op}, {temperature} temperature, {backend}: the case failed\n{done.stderr}")
        peak, output = json.loads(done.stdout.splitlines()[-1])
        beyond = round(peak - output, 1) + 0.0          # + 0.0: no "-0.0" where the two agree to the kB
        table.append((op.replace(":", " logprobs="), temperature, backend, f"{output:.1f}", f"{peak:.1f}",
                      f"{beyond:.1f}"))
        print(*table[-1], sep=" | ", flush=True)
    print("\npeak memory of one call above the resident set before it (sample: per-row temperature, top_k, top_p)")
    print(tabulate(table, headers=("op", "temperature", "backend", "output MB", "peak MB", "beyond output MB"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
