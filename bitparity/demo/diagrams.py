"""The guide's explanatory diagrams (docs/learn/img/): drawn from the spec's structure, not measured."""

from .. import spec
from . import plots

PAD = "0.85"          # padding (-0.0) cells
DATA = "#cfe2f3"      # element cells
SUM = "#f9cb9c"       # accumulators and tree nodes


def _box(ax, x, y, text, colour, width=0.9, height=0.6, fontsize=8):
    ax.add_patch(plots.pyplot().Rectangle((x - width / 2, y - height / 2), width, height, facecolor=colour,
                                          edgecolor="0.3", linewidth=0.8))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def reduction_tree(plots_dir):
    """Lanes then halving tree, shrunk to 8 lanes: 20 elements, 3 chunks, the last padded with -0.0."""
    plt = plots.pyplot()
    fig, (grid, tree) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": (1, 1.25)})
    lanes, n = 8, 20
    for c in range(3):
        for j in range(lanes):
            i = c * lanes + j
            _box(grid, j, 3 - c, f"x{i}" if i < n else "-0.0", DATA if i < n else PAD)
        grid.text(-0.8, 3 - c, f"chunk {c}", ha="right", va="center", fontsize=9)
    for j in range(lanes):
        grid.annotate("", (j, 0.35), (j, 0.65), arrowprops={"arrowstyle": "->", "color": "0.3"})
        _box(grid, j, 0, f"acc[{j}]", SUM)
    grid.text(-0.8, 0, "lanes", ha="right", va="center", fontsize=9)
    grid.text(3.5, -0.75, "lane j adds x[j], x[j+8], x[j+16] in that order (left to right in time: chunk 0, 1, 2)",
              ha="center", fontsize=8.5)
    grid.set_title(f"1. Lanes: a row is read in chunks of L lanes (here L = 8; the spec's L = {spec.LANES})",
                   fontsize=10)
    grid.set_xlim(-2.2, 7.6)
    grid.set_ylim(-1.1, 3.6)
    grid.axis("off")

    level = [f"acc[{j}]" for j in range(lanes)]
    xs = [float(j) for j in range(lanes)]
    y = 3.0
    for j, label in enumerate(level):
        _box(tree, xs[j], y, label, SUM, width=0.85)
    h = lanes // 2
    while h >= 1:
        new_xs = [(xs[i] + xs[i + h]) / 2 for i in range(h)]
        for i in range(h):
            for src in (i, i + h):
                tree.plot([xs[src], new_xs[i]], [y - 0.3, y - 0.7], color="0.4", linewidth=0.8)
            _box(tree, new_xs[i], y - 1.0, f"[{i}] + [{i + h}]", SUM, width=0.95)
        tree.text(-0.9, y - 1.0, f"h = {h}", ha="right", va="center", fontsize=9)
        xs, y, h = new_xs, y - 1.0, h // 2
    tree.text(xs[0] + 0.7, y, "the row's sum (or the segment's partial)", ha="left", va="center", fontsize=8.5)
    tree.set_title("2. Halving tree: acc[i] = acc[i] + acc[i + h], h = L/2, ..., 1", fontsize=10)
    tree.set_xlim(-2.0, 8.0)
    tree.set_ylim(-0.6, 3.5)
    tree.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colour, edgecolor="0.3") for colour in (DATA, PAD, SUM)]
    fig.legend(handles, ("a row element", "padding: -0.0, the exact additive identity", "an accumulator / a sum"),
               loc="lower center", ncol=3, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return plots.save(fig, plots_dir, "reduction_tree")


def one_order_three_machines(plots_dir):
    """How the cuda (Triton) and ascend (Ascend C) backends carry out each step of the spec's order."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(14, 6.6))
    steps = ("a row\nof N floats", f"segment:\nS = {spec.SEGMENT} floats", f"chunk:\nL = {spec.LANES} floats",
             f"lanes:\nacc[{spec.LANES}] += chunk", "halving tree:\n10 levels", "partials:\ntree over segments")
    rows = (
        ("spec\n(docs/spec.md 3)", "0.93", (
            "G = ceil(N / S)\nsegments", "16 chunks\nof L lanes", "lane j of chunk c:\nx[gS + cL + j]",
            "one float32 add\nper lane, chunk\nafter chunk", "acc[i] += acc[i+h]\nh = 512 ... 1",
            "G partials, -0.0 padded\nto a power of two,\nsame tree")),
        ("Triton\n(cuda backend)", "#d9ead3", (
            "one program:\nBLOCK_R rows\n(L / W on a GPU)", "a loop inside\nthe program", "one masked tl.load:\n"
            "[BLOCK_R, 1024]\nin registers", "acc + chunk: one\nadd.rn.f32 per\nelement (fusion off)",
            "reshape [R, 2, W/2],\nsplit, lo + hi:\nthe pair (i, i+h)", "a [BLOCK_R, GP] slot\nvector, "
            "same tree")),
        ("Ascend C\n(ascend backend)", "#fce5cd", (
            "rows split over\nAI cores; a row\nstays on one core", "a loop inside\nthe kernel",
            "DataCopy GM -> UB:\n4 KB, double-\nbuffered queue", "Add over 1024 floats:\n16 repeats of\n256 B (64 floats)",
            "Add(acc, acc, acc[h], h)\n512..64: 8..1 repeats\n32..8: part of one\n"
            "4, 2, 1: scalar unit", "partials in a UB\n"
            "buffer, TreeSum")),
    )
    width, height = 2.0, 1.25
    for k, step in enumerate(steps):
        ax.text(1.6 + k * 2.2, 3.35, step, ha="center", va="center", fontsize=9, fontweight="bold")
    for r, (name, colour, cells) in enumerate(rows):
        y = 2.3 - r * 1.5
        ax.text(-0.15, y, name, ha="right", va="center", fontsize=10, fontweight="bold")
        for k, cell in enumerate(cells):
            ax.add_patch(plt.Rectangle((1.6 + k * 2.2 - width / 2, y - height / 2), width, height,
                                       facecolor=colour, edgecolor="0.3"))
            ax.text(1.6 + k * 2.2, y, cell, ha="center", va="center", fontsize=8)
    ax.text(7.1, -2.05, "The same pairs are added in the same order on every row; only who adds them differs: "
            "registers of 4 warps x 32 threads (Triton),\nthe vector unit's 256-byte repeats in the 192 KB Unified "
            "Buffer (Ascend), a C loop (cpu).  Nothing depends on the batch size, the grid or the core count.",
            ha="center", va="center", fontsize=9)
    ax.set_xlim(-1.6, 14.0)
    ax.set_ylim(-2.5, 3.7)
    ax.axis("off")
    ax.set_title("One canonical sum, two kinds of hardware", fontsize=12)
    return plots.save(fig, plots_dir, "one_order_three_machines")
