"""batch: a row's result should not depend on which other rows share its batch.

A kernel library picks its blocking, its split of a reduction and its
instruction path from the shape it is called with.  When the batch size
changes, so can the order in which one row's numbers are added, and with it
that row's bits.  This topic measures that on this machine: torch's own
matmul and log_softmax at several batch sizes, a split reduction whose split
count follows the batch size (the policy of split-K/split-KV GPU kernels,
simulated here and labelled so), and bitparity's sum (as a dot product) and
log_softmax, whose order is a function of the row length only.
"""

import torch
from tabulate import tabulate

from .. import ops
from . import plots
from .common import heading

BATCH_SIZES = (1, 2, 3, 4, 8, 16, 32, 64)
HIDDEN, OUT, VOCAB = 1024, 64, 8192
SPLIT_TARGET = 12       # the simulated kernel cuts each row into max(1, 12 // B) parts, to fill 12 cores

EXPLANATION = f"""
Every op below computes rows that do not interact, so row i of a batch of B rows should
equal row i of a batch of {BATCH_SIZES[-1]}.  For each op and batch size B the table gives the share
of the B rows' result elements whose bits differ from the same rows computed in a batch of
{BATCH_SIZES[-1]} (torch on the CPU, {torch.get_num_threads()} threads).
"""


def split_row_sum(x):
    """SIMULATED split reduction: each row cut into max(1, SPLIT_TARGET // B) parts, partials added in order.

    This is how split-K and split-KV kernels keep a GPU busy when the batch is
    small; here each part is a torch.sum, so only the split differs between batch sizes.
    """
    parts = max(1, SPLIT_TARGET // x.shape[0])
    partials = [piece.sum(-1) for piece in x.tensor_split(parts, dim=-1)]
    total = partials[0]
    for partial in partials[1:]:
        total = total + partial
    return total


def canonical_dot(h, w):
    """h @ w with each dot product as bitparity.sum of float32 products: [B, K] @ [K, N] -> [B, N]."""
    return ops.sum(h[:, None, :] * w.T[None, :, :], backend="cpu")


def _ops(h, w, logits):
    """(key, label, kind, function of a batch size B -> the first B rows' results)."""
    return (
        ("native_matmul", "torch matmul h @ W", "native", lambda b: h[:b] @ w),
        ("native_log_softmax", "torch log_softmax", "native", lambda b: torch.log_softmax(logits[:b], -1)),
        ("split_reduction", f"row sum in {SPLIT_TARGET} // B parts", "simulated",
         lambda b: split_row_sum(logits[:b])),
        ("bitparity_dot", "bitparity.sum as h @ W", "bitparity", lambda b: canonical_dot(h[:b], w)),
        ("bitparity_log_softmax", "bitparity.log_softmax", "bitparity",
         lambda b: ops.log_softmax(logits[:b], backend="cpu")),
    )


def run(plots_dir=None):
    heading("batch: the same row in batches of different sizes", EXPLANATION)
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(BATCH_SIZES[-1], HIDDEN, generator=generator)
    w = torch.randn(HIDDEN, OUT, generator=generator)
    logits = torch.randn(BATCH_SIZES[-1], VOCAB, generator=generator) * 4

    table, shares, result = [], {}, {"batch_sizes": list(BATCH_SIZES)}
    for key, label, kind, fn in _ops(h, w, logits):
        bits = {b: fn(b).view(torch.int32) for b in BATCH_SIZES}
        full = bits[BATCH_SIZES[-1]]
        share = [float((bits[b] != full[:b]).double().mean()) for b in BATCH_SIZES]
        # Distinct bit patterns of row 0 over every batch size: 1 means batch-invariant.
        distinct = len({bits[b][0].numpy().tobytes() for b in BATCH_SIZES})
        shares[label] = (kind, share)
        result[key] = {"label": label, "kind": kind, "distinct_row0": distinct, "share_differing": share}
        table.append((label, kind, distinct, *(f"{100 * s:.0f}%" for s in share)))
    print(tabulate(table, headers=("op", "kind", "distinct row 0", *(f"B={b}" for b in BATCH_SIZES)),
                   disable_numparse=True))

    varying = [label for label, (kind, share) in shares.items() if kind == "native" and any(share)]
    print("\nOn this machine, torch ops whose rows change with the batch size: " +
          (", ".join(varying) if varying else "none; the simulated split reduction shows the effect GPU kernels have") +
          ".")
    print("bitparity's rows are the same bits in every batch: the order is a function of the row length only.")
    result["native_varying_here"] = varying
    if plots_dir is not None:
        result["plot"] = _plot(plots_dir, shares)
    return result


def _plot(plots_dir, shares):
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"native": plots.NATIVE, "simulated": plots.OTHER, "bitparity": plots.CANONICAL}
    # Large hollow markers first, so the lines that sit at 0 stay visible under the later ones.
    styles = iter(({"marker": "o", "markersize": 7}, {"marker": "s", "markersize": 12, "markerfacecolor": "none"},
                   {"marker": "^", "markersize": 7, "linestyle": "--"}, {"marker": "D", "markersize": 8},
                   {"marker": "v", "markersize": 5, "linestyle": ":", "markerfacecolor": "white"}))
    for label, (kind, share) in shares.items():
        ax.plot(BATCH_SIZES, [100 * s for s in share], color=colours[kind], label=f"{label} [{kind}]", **next(styles))
    ax.set_xscale("log", base=2)
    ax.set_xticks(BATCH_SIZES, [str(b) for b in BATCH_SIZES])
    ax.set_xlabel("batch size B (rows computed together)")
    ax.set_ylabel(f"% of result bits that differ from B = {BATCH_SIZES[-1]}")
    ax.set_ylim(-5, 105)
    ax.set_title("Same rows, different batch sizes: torch CPU vs bitparity")
    ax.legend(fontsize=8, loc="center right")
    return plots.save(fig, plots_dir, "batch")
