"""`bitparity demo`: runnable lessons on why float32 results differ and how to make them not differ.

Each topic is a module with one function, ``run(plots_dir=None)``, that
prints a short explanation and its measured numbers, returns the key numbers
as a dict (what tests assert on and ``--json`` writes), and, given a folder,
saves a figure there.  docs/learn/ is the guide that goes with them.
"""

from . import batch, elementary, fma, order, rl

TOPICS = {
    "order": order.run,
    "batch": batch.run,
    "fma": fma.run,
    "exp": elementary.run,
    "rl": rl.run,
}
