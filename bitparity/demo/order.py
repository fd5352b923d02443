"""order: one float32 vector summed in many orders gives many results.

Floating-point addition rounds after every step, so (a + b) + c and
a + (b + c) can differ in the last bits: the sum of a vector depends on the
order of its additions.  This topic sums one vector every way a library
might (left to right, reversed, sorted, pairwise, numpy, torch, the
canonical lane-and-tree structure with other lane and segment counts, random
permutations), counts the distinct results and measures their spread in
ulps of the correctly rounded sum; then it repeats bitparity's canonical sum
on every backend here and finds one result.
"""

import numpy as np
import torch
from tabulate import tabulate

from .. import ops, spec
from ..compare.probe import round_to_float32
from ..reference import canonical
from . import plots
from .common import available_canonical_backends, exact_sum, heading, hex32, ulps_from

N = 100_003                 # more than six segments of 16384, and not a power of two
PERMUTATIONS = 200
REPEATS = 3
# (lanes, segment) of the demo's variants of the canonical structure; the first is the spec's.
TREE_PARAMETERS = ((spec.LANES, spec.SEGMENT), (256, 4096), (64, 16384), (32, 1024), (8, 8192))

EXPLANATION = f"""
One vector of {N:,} float32 values (standard normal, seed 0) is summed in many orders.
In exact arithmetic every order gives the same number; in float32 each addition rounds,
so each order rounds differently.  The error of each result is in ulps (units in the last
place) of the correctly rounded sum: the exact sum (integer arithmetic), rounded once.
"""


def sequential(x):
    """x[0] + x[1] + ... left to right, one float32 rounding per addition."""
    return np.add.accumulate(x)[-1]


def adjacent_pairwise(x):
    """Pairwise tree over neighbours: (x0 + x1) + (x2 + x3), ..., padded with -0.0 to a power of two."""
    v = np.full(1 << (len(x) - 1).bit_length(), canonical.NEG_ZERO, dtype=np.float32)
    v[:len(x)] = x
    while len(v) > 1:
        v = v[0::2] + v[1::2]
    return v[0]


def lane_tree_sum(x, lanes, segment):
    """NOT the spec unless (lanes, segment) = (LANES, SEGMENT): the spec 3 structure with other counts.

    Segments of `segment` elements; lane j of a segment adds x[j], x[j + lanes], ...
    in sequence; the lanes, then the segment partials, are folded by the halving
    tree; padding is -0.0.  For the demo only: the spec's constants are fixed.
    """
    n_segments = -(-len(x) // segment)
    padded = np.full(n_segments * segment, canonical.NEG_ZERO, dtype=np.float32)
    padded[:len(x)] = x
    chunks = padded.reshape(n_segments, segment // lanes, lanes)
    acc = chunks[:, 0, :]
    for c in range(1, chunks.shape[1]):
        acc = acc + chunks[:, c, :]
    partials = np.full(1 << (n_segments - 1).bit_length(), canonical.NEG_ZERO, dtype=np.float32)
    partials[:n_segments] = canonical._halving_tree(acc)     # the spec's own tree, acc[i] += acc[i + h]
    return canonical._halving_tree(partials[None, :])[0]


def _named_orders(x):
    """[(label, family, float32 sum)] of the deterministic orders."""
    rows = [
        ("left to right", "loop", sequential(x)),
        ("right to left", "loop", sequential(x[::-1])),
        ("ascending |x|", "loop", sequential(x[np.argsort(np.abs(x), kind="stable")])),
        ("descending |x|", "loop", sequential(x[np.argsort(-np.abs(x), kind="stable")])),
        ("pairwise, neighbours", "tree", adjacent_pairwise(x)),
        ("numpy np.sum", "library", np.sum(x)),
        ("torch.sum (CPU)", "library", torch.from_numpy(x).sum().numpy()),
    ]
    for lanes, segment in TREE_PARAMETERS:
        label = f"lanes {lanes}, segment {segment}" + (" (the spec)" if (lanes, segment) == TREE_PARAMETERS[0]
                                                     else " (not the spec)")
        rows.append((label, "canonical structure", lane_tree_sum(x, lanes, segment)))
    return [(label, family, np.float32(value)) for label, family, value in rows]


def _canonical_repeats(x, rng):
    """{backend: [sum bits of each repeat]}: x alone, then as row i of a batch of random rows."""
    results = {}
    t = torch.from_numpy(x)
    for name, _ in available_canonical_backends():
        bits = []
        for repeat in range(REPEATS):
            batch = torch.from_numpy(rng.standard_normal((repeat + 1, N)).astype(np.float32))
            batch[repeat] = t
            bits.append(hex32(ops.sum(batch, backend=name)[repeat].item()))
        results[name] = bits
    return results


def run(plots_dir=None):
    heading("order: one vector, many summation orders", EXPLANATION)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    exact = round_to_float32(exact_sum(x))               # the correctly rounded sum

    named = _named_orders(x)
    permuted = np.array([sequential(x[rng.permutation(N)]) for _ in range(PERMUTATIONS)], dtype=np.float32)
    everything = np.concatenate([[value for _, _, value in named], permuted])
    distinct = np.unique(everything.view(np.uint32)).size
    spread = ulps_from(everything, exact)

    table = [(label, family, hex32(value), f"{value:.9g}", f"{ulps_from(value, exact):+.0f}")
             for label, family, value in named]
    table.append((f"{PERMUTATIONS} random permutations, left to right", "loop",
                  f"{np.unique(permuted.view(np.uint32)).size} distinct", "",
                  f"{ulps_from(permuted, exact).min():+.0f} .. {ulps_from(permuted, exact).max():+.0f}"))
    print(f"correctly rounded sum: {exact:.9g} ({hex32(exact)}); 1 ulp there = {np.spacing(np.abs(exact)):.3g}\n")
    print(tabulate(table, headers=("order", "kind", "bits", "value", "ulps from exact"), disable_numparse=True))

    repeats = _canonical_repeats(x, rng)
    canonical_bits = {bits for runs in repeats.values() for bits in runs}
    spec_sum = lane_tree_sum(x, spec.LANES, spec.SEGMENT)
    print(f"\n{len(everything)} sums in {len(everything)} orders: {distinct} distinct float32 results, "
          f"spread {spread.max() - spread.min():.0f} ulps ({spread.min():+.0f} .. {spread.max():+.0f}).")
    print(f"bitparity.sum, the canonical order, {REPEATS} times on each backend (alone and as a row of "
          f"batches of random rows): {len(canonical_bits)} distinct result(s), {', '.join(sorted(canonical_bits))}.")
    for name, how in available_canonical_backends():
        print(f"  {name:7s} {how}")

    result = {
        "n": N,
        "orders": len(everything),
        "distinct_across_orders": int(distinct),
        "spread_ulps": float(spread.max() - spread.min()),
        "canonical_backends": sorted(repeats),
        "canonical_runs": sum(len(runs) for runs in repeats.values()),
        "distinct_across_canonical_runs": len(canonical_bits),
        "canonical_bits": sorted(canonical_bits),
        "spec_variant_bits": hex32(spec_sum),
    }
    if plots_dir is not None:
        result["plot"] = _plot(plots_dir, named, permuted, spec_sum, exact)
    return result


def _plot(plots_dir, named, permuted, spec_sum, exact):
    plt = plots.pyplot()
    permuted_ulps, spec_ulps = ulps_from(permuted, exact), ulps_from(spec_sum, exact)
    fig, (hist, dots) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": (3, 2)})
    edges = np.arange(np.floor(permuted_ulps.min() / 25) * 25, permuted_ulps.max() + 25, 25)
    hist.hist(permuted_ulps, bins=edges, color="0.7", edgecolor="0.4",
              label=f"{len(permuted_ulps)} random orders, left to right")
    hist.axvline(spec_ulps, color=plots.CANONICAL, linewidth=2.5,
                 label=f"bitparity canonical: {spec_ulps:+.0f} ulps, every backend, every run")
    hist.set_xlabel("error of the float32 sum, in ulps of the correctly rounded sum")
    hist.set_ylabel("number of random orders (bins of 25 ulps)")
    hist.set_title(f"{N:,} standard normal float32 values, summed in random orders", fontsize=10)
    hist.legend(fontsize=8, loc="upper left")

    colours = {"loop": plots.NATIVE, "tree": plots.NATIVE, "library": plots.NATIVE,
               "canonical structure": plots.OTHER}
    for row, (label, family, value) in enumerate(named):
        colour = plots.CANONICAL if "(the spec)" in label else colours[family]
        dots.plot(ulps_from(value, exact), row, "o", color=colour, markersize=7)
    dots.set_yticks(range(len(named)), [label for label, _, _ in named], fontsize=8)
    dots.invert_yaxis()
    dots.axvline(0, color="k", linewidth=0.8, linestyle=":")
    dots.set_xlabel("error in ulps of the correctly rounded sum")
    dots.set_title("Named orders", fontsize=10)
    dots.plot([], [], "o", color=plots.NATIVE, label="loops, pairwise, numpy, torch")
    dots.plot([], [], "o", color=plots.OTHER, label="lane/segment tree, other counts (not the spec)")
    dots.plot([], [], "o", color=plots.CANONICAL, label="lane/segment tree of the spec (1024, 16384)")
    dots.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.4, -0.14), ncol=1)
    fig.tight_layout()
    return plots.save(fig, plots_dir, "order")
