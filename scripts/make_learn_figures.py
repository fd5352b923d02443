"""Regenerate every figure of docs/learn/: the demo topics' plots and the two diagrams.

    python3 scripts/make_learn_figures.py [DIR]      (default: docs/learn/img)

The topic plots are what `bitparity demo all --plots DIR` writes; the numbers
in them are measured on the machine that runs this.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))    # the checkout, installed or not

from bitparity.cli import main  # noqa: E402 - after the path
from bitparity.demo import diagrams  # noqa: E402


def make(out):
    main(["demo", "all", "--plots", str(out)])
    diagrams.reduction_tree(out)
    diagrams.one_order_three_machines(out)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "learn" / "img")
