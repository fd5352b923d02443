"""Exhaustive accuracy sweep of the portable exp and log over every float32 bit pattern.

The values swept are the `cpu` backend's exp and log (compiled elementwise.c).
Each chunk is also compared bit for bit with reference/canonical.py (numpy),
so the accuracy reported is the spec's, and the sweep doubles as an
exhaustive bit-identity check of the cpu backend's exp and log.

Truth: np.exp / np.log in float64 (accurate to well under one float64 ulp),
and "correctly rounded" means that value rounded to float32.  Error is in
float32 ulps of the correctly rounded result: |y - f64| / ulp(cr), with
ulp(v) the spacing of float32 just above |v| (2**-149 for subnormals).
(The float64 truth is itself rounded, so a float32 midpoint within about
2**-29 ulp may be judged the wrong way; at 2**32 inputs that is a handful of
cases at most, invisible in the max ulp.)

Results are grouped by the class of the correctly rounded result: normal,
subnormal, zero, infinite, NaN.  For each class: inputs, how many are exactly
cr (NaNs compare equal to NaNs), the max ulp error and its input.

    python benchmarks/sweep_exp_log.py            # all 2**32 inputs of each (tens of minutes on 2 cores)
    python benchmarks/sweep_exp_log.py --stride 64   # every 64th chunk: a quick look
"""

import argparse
import time

import numpy as np
import torch
from tabulate import tabulate

from bitparity.backends import cpu
from bitparity.reference import canonical

CHUNK = 1 << 24
CLASSES = ("normal", "subnormal", "zero", "inf", "nan")
MIN_NORMAL = np.float32(2.0 ** -126)


def nan_canonical_bits(a):
    bits = a.view(np.uint32).copy()
    bits[np.isnan(a)] = 0x7FC00000
    return bits


class Tally:
    """Per-class counts, exact matches and max ulp error (with its input) for one function."""

    def __init__(self):
        self.count = dict.fromkeys(CLASSES, 0)
        self.exact = dict.fromkeys(CLASSES, 0)
        self.max_ulp = dict.fromkeys(CLASSES, 0.0)
        self.argmax = dict.fromkeys(CLASSES, None)
        self.reference_mismatches = 0
        self.inputs = 0

    def add(self, x, y, reference_y, truth):
        self.inputs += x.size
        y_bits = nan_canonical_bits(y)
        self.reference_mismatches += int(np.count_nonzero(y_bits != nan_canonical_bits(reference_y)))
        with np.errstate(over="ignore", invalid="ignore"):
            cr = truth.astype(np.float32)
        exact = y_bits == nan_canonical_bits(cr)
        magnitude = np.abs(cr)
        classes = {
            "nan": np.isnan(cr),
            "inf": np.isinf(cr),
            "zero": cr == 0,
            "subnormal": (magnitude > 0) & (magnitude < MIN_NORMAL),
            "normal": (magnitude >= MIN_NORMAL) & np.isfinite(cr),
        }
        for name, sel in classes.items():
            n = int(np.count_nonzero(sel))
            if n == 0:
                continue
            self.count[name] += n
            self.exact[name] += int(np.count_nonzero(exact & sel))
            if name in ("normal", "subnormal"):
                ulp = np.spacing(magnitude[sel]).astype(np.float64)
                with np.errstate(invalid="ignore"):
                    err = np.abs(y[sel].astype(np.float64) - truth[sel]) / ulp
                err = np.where(np.isnan(err), np.inf, err)    # a NaN where a number belongs
                i = int(np.argmax(err))
                if err[i] > self.max_ulp[name]:
                    self.max_ulp[name] = float(err[i])
                    self.argmax[name] = x[sel][i]

    def rows(self):
        out = []
        for name in CLASSES:
            if self.count[name] == 0:
                continue
            arg = self.argmax[name]
            where = "" if arg is None else f"{float(arg):.9g} (0x{int(np.float32(arg).view(np.uint32)):08x})"
            ulp = f"{self.max_ulp[name]:.4f}" if name in ("normal", "subnormal") else "-"
            out.append((name, self.count[name], self.count[name] - self.exact[name],
                        f"{self.exact[name] / self.count[name]:.6f}", ulp, where))
        return out


def sweep(stride):
    functions = {
        "exp": (cpu.exp, canonical.exp, np.exp),
        "log": (cpu.log, canonical.log, np.log),
    }
    tallies = {name: Tally() for name in functions}
    chunks = range(0, 1 << 32, CHUNK * stride)
    start = time.time()
    for done, first in enumerate(chunks, 1):
        x = np.arange(first, first + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        with np.errstate(invalid="ignore"):             # signalling NaNs quieten in the cast
            x64 = x.astype(np.float64)
        for name, (fast, reference, truth) in functions.items():
            y = fast(torch.from_numpy(x)).numpy()
            with np.errstate(all="ignore"):
                tallies[name].add(x, y, reference(x), truth(x64))
        if done % 16 == 0 or done == len(chunks):
            elapsed = time.time() - start
            print(f"  {done}/{len(chunks)} chunks, {elapsed:.0f} s, "
                  f"~{elapsed / done * (len(chunks) - done):.0f} s left", flush=True)
    return tallies


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1,
                        help="sweep every STRIDE-th chunk of 2**24 bit patterns (default 1: all)")
    args = parser.parse_args()
    ok, how = cpu.availability()
    if not ok:
        raise SystemExit(f"cpu backend unavailable: {how}")
    print(f"exp and log of the cpu backend ({how}) over "
          f"{'all 2**32' if args.stride == 1 else f'1 in {args.stride} chunks of the 2**32'} "
          f"float32 bit patterns, against float64 numpy")
    tallies = sweep(args.stride)
    for name, tally in tallies.items():
        print(f"\n{name}: {tally.inputs} inputs; bits differing from reference/canonical.py: "
              f"{tally.reference_mismatches}")
        print(tabulate(tally.rows(), headers=("correctly rounded result", "inputs", "not exact",
                                              "fraction exact", "max ulp", "at input"),
                       tablefmt="github"))


if __name__ == "__main__":
    main()
