"""exp: each platform's exp and log round differently; bitparity's are the same bits everywhere.

exp and log are not IEEE basic operations: every library approximates them
its own way (its own polynomial, table, range reduction), so two libraries
on one machine, or one library on two machines, can return different float32
bits for the same input.  This topic measures the error of numpy's float32
and torch's exp and log on this machine against float64, next to bitparity's
portable ones (spec 5, 6: built only from IEEE add, multiply, compares and
integer operations), and checks that bitparity's agree bit for bit on every
backend here.
"""

import numpy as np
import torch
from tabulate import tabulate

from .. import ops
from ..compare.metrics import ulp_error
from . import plots
from .common import available_canonical_backends, heading

POINTS = 1_000_000
EXP_RANGE = (-103.9, 88.7)     # exp's whole finite, non-zero float32 range (spec 5), subnormal results included
LOG_RANGE = (-87.0, 88.0)      # log's inputs are exp(u) for u uniform here: every binade from 1e-38 to 1e38
BACKEND_CHECK = 1 << 16        # inputs on which every canonical backend is compared bit for bit

EXPLANATION = f"""
{2 * POINTS:,} float32 inputs per function (half evenly spaced, half random), each function's
float32 result against float64 numpy, in float32 ulps of the exact result.  A correctly
rounded result is within 0.5 ulp.
"""


def _inputs(rng):
    grid = np.linspace(*EXP_RANGE, POINTS, dtype=np.float32)
    x_exp = np.concatenate([grid, rng.uniform(*EXP_RANGE, POINTS).astype(np.float32)])
    u = np.concatenate([np.linspace(*LOG_RANGE, POINTS), rng.uniform(*LOG_RANGE, POINTS)])
    return x_exp, np.exp(u).astype(np.float32)


def _implementations(name):
    """(key, label, float32 numpy array -> float32 numpy array) for exp or log."""
    return (
        ("numpy", f"numpy float32 np.{name}", getattr(np, name)),
        ("torch", f"torch.{name} (CPU)", lambda x: getattr(torch, name)(torch.from_numpy(x)).numpy()),
        ("bitparity", f"bitparity.{name}", lambda x: getattr(ops, name)(torch.from_numpy(x), backend="cpu").numpy()),
    )


def _backend_mismatches(name, x):
    """Elements where a canonical backend's bits differ from the numpy backend's, per backend."""
    t = torch.from_numpy(x)
    want = getattr(ops, name)(t, backend="numpy").view(torch.int32)
    return {backend: int((getattr(ops, name)(t, backend=backend).view(torch.int32) != want).sum())
            for backend, _ in available_canonical_backends()}


def run(plots_dir=None):
    heading("exp: the platform's exp and log against portable ones", EXPLANATION)
    x_exp, x_log = _inputs(np.random.default_rng(0))
    table, result, curves = [], {}, {}
    for name, x in (("exp", x_exp), ("log", x_log)):
        truth = getattr(np, name)(x.astype(np.float64))
        bits, max_ulp = {}, {}
        for key, label, fn in _implementations(name):
            y = fn(x)
            err = ulp_error(y, truth)
            bits[key] = y.view(np.uint32)
            max_ulp[key] = float(err.max())
            curves[(name, key)] = (label, err)
            table.append((name, label, f"{err.max():.3f}", f"{x[err.argmax()]:.9g}",
                          f"{100 * (err > 0.5).mean():.2f}%"))
        result[name] = {"max_ulp": max_ulp,
                        "numpy_torch_differ_share": float((bits["numpy"] != bits["torch"]).mean()),
                        "backend_mismatches": _backend_mismatches(name, x[:: len(x) // BACKEND_CHECK])}
    print(tabulate(table, headers=("function", "implementation", "max ulp", "at x", "not correctly rounded"),
                   disable_numparse=True))
    for name in ("exp", "log"):
        share = result[name]["numpy_torch_differ_share"]
        mismatches = result[name]["backend_mismatches"]
        print(f"\n{name}: numpy and torch, on the same CPU, return different bits for {100 * share:.2f}% of inputs.")
        print(f"{name}: bitparity on {', '.join(mismatches)}, {BACKEND_CHECK:,} inputs: "
              f"{sum(mismatches.values())} elements differ from the numpy backend.")
    print("\nbitparity's exp and log are not the most accurate here; they are below 1 ulp and the same bits on "
          "every backend, because they use only operations IEEE 754 rounds exactly.")
    if plots_dir is not None:
        result["plot"] = _plot(plots_dir, x_exp, x_log, curves)
    return result


def _plot(plots_dir, x_exp, x_log, curves):
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {"numpy": plots.NATIVE, "torch": plots.OTHER, "bitparity": plots.CANONICAL}
    # Each legend where its curves leave room: between numpy's exp and the others; above log's curves.
    for ax, name, x, log_axis, corner in ((axes[0], "exp", x_exp, False, "center right"),
                                          (axes[1], "log", x_log, True, "upper right")):
        coordinate = np.log10(x.astype(np.float64)) if log_axis else x.astype(np.float64)
        edges = np.linspace(coordinate.min(), coordinate.max(), 241)
        which = np.clip(np.digitize(coordinate, edges) - 1, 0, len(edges) - 2)
        centres = (edges[:-1] + edges[1:]) / 2
        for key, colour in colours.items():
            label, err = curves[(name, key)]
            worst = np.full(len(centres), np.nan)
            np.fmax.at(worst, which, err)       # the largest error in each bin of x
            ax.plot(centres, worst, color=colour, linewidth=1.2, label=f"{label} (max {np.nanmax(worst):.2f})")
        ax.axhline(0.5, color="k", linestyle=":", linewidth=0.8, label="0.5 ulp: correctly rounded")
        ax.set_xlabel("log10(x)" if log_axis else "x")
        ax.set_ylabel("largest error in the bin, ulps")
        ax.set_title(f"float32 {name}(x) against float64", fontsize=10)
        ax.set_ylim(0, None)
        ax.legend(fontsize=8, loc=corner)
    fig.tight_layout()
    return plots.save(fig, plots_dir, "exp")
