"""Figures of the demo topics: matplotlib, imported only when a plot is asked for."""

from pathlib import Path

from ..compare.plots import pyplot

# Colours and markers of the backends and implementations, the same in every figure.
NATIVE = "tab:red"
OTHER = "tab:orange"
CANONICAL = "tab:blue"


def save(fig, plots_dir, name):
    """Write fig to plots_dir/name.png and close it; returns the path as a string.

    No "Software" entry in the PNG, so a regenerated figure differs from the
    committed one only when its pixels do.
    """
    path = Path(plots_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    print(f"\nwrote {path}")
    return str(path)
