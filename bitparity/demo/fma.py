"""fma: a*b + c rounded once or twice.

A fused multiply-add computes a*b + c exactly and rounds once; a multiply
then an add rounds a*b first, then the sum.  Compilers contract the second
into the first when allowed (Triton does by default, gcc with
-ffp-contract=fast), so the same source line gives different bits on
different builds.  This topic compiles Triton's a*b + c offline for sm_90
with fusion on and off and shows the PTX, then computes both roundings on
crafted and random inputs: the exactly rounded fused result from exact
rational arithmetic (numpy has no fma, and Python 3.11's math has none),
the twice-rounded one from numpy float32, and what torch.addcmul gives here.
"""

from fractions import Fraction

import numpy as np
import torch
from tabulate import tabulate

from ..compare.probe import round_to_float32
from . import plots
from .common import heading, hex32

RANDOM_TRIPLES = 20_000

EXPLANATION = """
a*b + c in float32, computed two ways:
  fused    RN(a*b + c): the exact value rounded once (an FMA instruction);
  unfused  RN(RN(a*b) + c): the product rounded, then the sum (IEEE multiply, then add).
The difference is at most the product's rounding error, but when c cancels most of a*b that
error is all that is left.
"""


def fused(a, b, c):
    """RN32(a*b + c) with one rounding, from exact rational arithmetic."""
    return round_to_float32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def unfused(a, b, c):
    """RN32(RN32(a*b) + c): numpy float32 multiply, then add (numpy never contracts)."""
    return np.float32(np.float32(a) * np.float32(b)) + np.float32(c)


def _crafted():
    """(description, a, b, c) where one rounding and two differ visibly."""
    one_plus = np.float32(1 + 2.0 ** -12)
    rng = np.random.default_rng(1)
    a, b = rng.uniform(1, 2, 2).astype(np.float32)
    return [
        ("(1+2^-12)^2 - (1+2^-11)", one_plus, one_plus, np.float32(-(1 + 2.0 ** -11))),
        ("a*b - RN(a*b), a, b in [1, 2)", a, b, -(a * b)),
        ("1e4 * 1e-4 - 1", np.float32(1e4), np.float32(1e-4), np.float32(-1.0)),
    ]


def _random(rng):
    """Fused and unfused results of random triples, half of them with c = -RN(a*b) (full cancellation)."""
    a = rng.standard_normal(RANDOM_TRIPLES).astype(np.float32)
    b = rng.standard_normal(RANDOM_TRIPLES).astype(np.float32)
    c = rng.standard_normal(RANDOM_TRIPLES).astype(np.float32)
    half = RANDOM_TRIPLES // 2
    c[half:] = -(a[half:] * b[half:])
    one = np.array([fused(*t) for t in zip(a, b, c)], dtype=np.float32)
    two = a * b + c                                   # numpy float32: two roundings, never contracted
    addcmul = torch.addcmul(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b)).numpy()
    return half, one, two, addcmul


def _ptx():
    """The PTX lines of a*b + c compiled offline for sm_90, with fp fusion on and off."""
    from ..backends.cuda import ptx

    job = ("bitparity.backends.cuda.ptx", "multiply_add_kernel", ptx.MULTIPLY_ADD_SIGNATURE, {"BLOCK": 256})
    compiled = ptx.compile_offline({"fusion on": (*job, True), "fusion off": (*job, False)})
    return {name: [" ".join(line.split()) for line in out["ptx"].splitlines()
                   if ".f32" in line and "ld." not in line and "st." not in line] for name, out in compiled.items()}


def run(plots_dir=None):
    heading("fma: a*b + c rounded once or twice", EXPLANATION)
    crafted = []
    for description, a, b, c in _crafted():
        one, two = fused(a, b, c), unfused(a, b, c)
        crafted.append((description, f"{one:.9g}", hex32(one), f"{two:.9g}", hex32(two)))
    print(tabulate(crafted, headers=("inputs", "fused", "bits", "unfused", "bits"), disable_numparse=True))

    half, one, two, addcmul = _random(np.random.default_rng(0))
    differ = one.view(np.uint32) != two.view(np.uint32)
    general, cancelling = float(differ[:half].mean()), float(differ[half:].mean())
    addcmul_fused = float((addcmul.view(np.uint32) == one.view(np.uint32)).mean())
    addcmul_unfused = float((addcmul.view(np.uint32) == two.view(np.uint32)).mean())
    print(f"\n{half:,} random standard normal triples: fused and unfused bits differ in {100 * general:.1f}%.")
    print(f"{half:,} triples with c = -RN(a*b): they differ in {100 * cancelling:.1f}% "
          "(unfused gives 0; fused gives the product's rounding error).")
    print(f"torch.addcmul(c, a, b) on this CPU equals the fused result in {100 * addcmul_fused:.1f}% "
          f"and the unfused one in {100 * addcmul_unfused:.1f}% of all {RANDOM_TRIPLES:,} triples.")

    print("\nTriton, out = a*b + c compiled offline for sm_90 (PTX; no GPU used), float instructions:")
    lines = _ptx()
    for name, found in lines.items():
        print(f"  {name:10s} " + "  ".join(found))
    print("bitparity launches every kernel with enable_fp_fusion=False, and its tests reject any fma in the PTX.")

    result = {
        "crafted": [dict(zip(("inputs", "fused", "fused_bits", "unfused", "unfused_bits"), row)) for row in crafted],
        "random_differ_share": general,
        "cancelling_differ_share": cancelling,
        "addcmul_matches_fused_share": addcmul_fused,
        "addcmul_matches_unfused_share": addcmul_unfused,
        "ptx_fusion_on": lines["fusion on"],
        "ptx_fusion_off": lines["fusion off"],
    }
    if plots_dir is not None:
        result["plot"] = _plot(plots_dir, half, one, two)
    return result


def _plot(plots_dir, half, one, two):
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    # Relative difference |fused - unfused| / |fused|, where they differ: 1 means every digit is lost.
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(one.astype(np.float64) - two.astype(np.float64)) / np.abs(one.astype(np.float64))
    bins = np.logspace(-9, 1, 51)
    for part, label, colour in ((slice(None, half), "random a, b, c", plots.OTHER),
                                (slice(half, None), "c = -RN(a*b): cancellation", plots.NATIVE)):
        g = gap[part][np.isfinite(gap[part]) & (gap[part] > 0)]
        ax.hist(g, bins=bins, histtype="step", linewidth=2, color=colour,
                label=f"{label}: {len(g):,} of {len(gap[part]):,} differ")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("relative difference |fused - unfused| / |fused|   (float32's ulp is about 1e-7 relative)")
    ax.set_ylabel("number of triples (log scale)")
    ax.set_title("a*b + c: one rounding (FMA) against two, float32")
    ax.legend(fontsize=8)
    return plots.save(fig, plots_dir, "fma")
