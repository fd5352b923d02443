"""The report's plots, drawn from a run document (report.document) with matplotlib.

matplotlib is imported here only, when plots are asked for (`compare --plots DIR`): the extra
`bitparity[plots]` installs it.
"""

from pathlib import Path

import numpy as np

from .report import _value

DPI = 100
FILES = {"agreement": "agreement.png", "ulp": "ulp_histograms.png", "cost": "cost_ratio.png"}


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (files only: no display is needed or wanted)."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: python3 -m pip install 'bitparity[plots]'") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _grid(doc, key):
    """(ops, backends, values[backend, op]) of one result field, NaN where missing."""
    ops = list(dict.fromkeys(r["op"] for r in doc["results"]))
    names = doc["backends"]
    values = np.full((len(names), len(ops)), np.nan)
    for r in doc["results"]:
        values[names.index(r["backend"]), ops.index(r["op"])] = _value(r[key])
    return ops, names, values


def _backend_labels(doc):
    """The backends' names, each that ran a subset of the suite with how many of its cases."""
    partial = {s["backend"] for s in doc["subsets"]}
    return [f"{b}\n({sum(b in c['digests'] for c in doc['cases'])} of {len(doc['cases'])} cases)" if b in partial
            else b for b in doc["backends"]]


def agreement(doc, path):
    plt = pyplot()
    ops, names, exact = _grid(doc, "exact_percent")
    fig, ax = plt.subplots(figsize=(max(6.4, 1.6 + 0.75 * len(ops)), 2.4 + 0.45 * len(names)))
    image = ax.imshow(exact, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    for (i, j), v in np.ndenumerate(exact):
        ax.text(j, i, "-" if v != v else f"{v:.0f}" if v in (0, 100) else f"{v:.1f}",
                ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(ops)), ops, rotation=40, ha="right")
    ax.set_yticks(range(len(names)), _backend_labels(doc))
    ax.set_xlabel("op")
    ax.set_ylabel("backend")
    ax.set_title(f"Agreement: % of elements whose bits equal the canonical result\n"
                 f"({doc['tier']} tier, spec {doc['spec_version']})", fontsize=10)
    fig.colorbar(image, ax=ax, label="exact %")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def ulp_histograms(doc, path):
    """One panel per op that has a float64 meaning (the selection and sampling ops return token ids and
    kept sets, judged by the rules of spec 21-23, not in ulps: they have no histogram to draw)."""
    plt = pyplot()
    ops = list(dict.fromkeys(r["op"] for r in doc["results"] if sum(r["ulp_histogram"])))
    names = doc["backends"]
    labels = doc["ulp_bins"]
    cols = min(4, len(ops))
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows + 0.8), squeeze=False)
    width = 0.8 / len(names)
    counts = {(r["op"], r["backend"]): np.asarray(r["ulp_histogram"], dtype=float) for r in doc["results"]}
    for ax, op in zip(axes.flat, ops):
        for k, b in enumerate(names):
            c = counts[(op, b)]
            share = 100.0 * c / max(c.sum(), 1.0)
            ax.bar(np.arange(len(labels)) + (k - (len(names) - 1) / 2) * width, share, width, label=b)
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 150)
        ax.set_title(op)
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        ax.set_ylabel("% of elements")
        ax.set_xlabel("error vs float64 (ulps)")
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    handles, legend_labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, legend_labels, loc="upper right", ncol=len(names), title="backend")
    fig.suptitle(f"Error against the float64 meaning, in the op's ulp measure ({doc['tier']} tier)", x=0.02,
                 ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def cost(doc, path):
    """Each backend's median time over native's, with whiskers from its first to its third quartile (over
    the same native median): where the whiskers of two bars overlap, their order is within the noise."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ops, names, ratio = _grid(doc, "ratio_to_native")
    _, _, median = _grid(doc, "median_ms")
    _, _, q1 = _grid(doc, "q1_ms")
    _, _, q3 = _grid(doc, "q3_ms")
    timed = [k for k in range(len(names)) if not np.isnan(ratio[k]).all()]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.5 + 0.8 * len(ops)), 4.8))
    width = 0.8 / len(timed)
    for slot, k in enumerate(timed):
        whiskers = ratio[k] * np.stack([1 - q1[k] / median[k], q3[k] / median[k] - 1])
        ax.bar(np.arange(len(ops)) + (slot - (len(timed) - 1) / 2) * width, ratio[k], width, yerr=whiskers,
               capsize=1.5, error_kw={"linewidth": 0.8}, label=names[k])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if np.nanmax(ratio) / np.nanmin(ratio) < 30 else NullFormatter())
    ax.set_xticks(range(len(ops)), ops, rotation=40, ha="right")
    ax.set_xlabel("op")
    ax.set_ylabel("median time / native time (log scale)")
    untimed = [names[k] for k in range(len(names)) if k not in timed]
    notes = ([] if doc["device"]["npu"] or "ascend" not in names else ["ascend = host emulation"]) + \
        ([f"not timed: {', '.join(untimed)}"] if untimed else [])
    ax.set_title("Cost: median time relative to torch on the same device (1 = native), whiskers: quartiles" +
                 (f"\n{'; '.join(notes)}" if notes else "") +
                 ("\nWARNING: the machine was busy, times unreliable" if doc["warnings"] else ""), fontsize=10)
    ax.legend(title="backend", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write(doc, directory):
    """Draw every plot into directory; returns {kind: path}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {kind: directory / name for kind, name in FILES.items()}
    agreement(doc, paths["agreement"])
    ulp_histograms(doc, paths["ulp"])
    cost(doc, paths["cost"])
    return paths
