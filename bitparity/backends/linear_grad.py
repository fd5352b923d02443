"""linear's weight gradient (spec 29.2) from a backend's own linear, for the backends that run it as a sequence
of linear calls: the rows fall in blocks of spec.LINEAR_GRAD_BLOCK positions; each block with rows is
linear(g_b^T, x_b^T), the exact sum over the block's rows rounded once; the blocks are row-folded (spec 29.1) by
row_fold.Counter in block order. A block without rows is a -0.0 leaf, the identity, so it is carried as None and
never added.
"""

import torch

from .. import row_fold, spec


def weight_grad(linear, x, g, positions, rows):
    """x [M, K], g [M, N], positions int64 [M] (distinct, below rows) -> [N, K] float32, by `linear`."""
    block = positions // spec.LINEAR_GRAD_BLOCK
    n_blocks = -(-int(rows) // spec.LINEAR_GRAD_BLOCK)
    present = set(torch.unique(block).tolist())
    counter = row_fold.Counter()
    for j in range(n_blocks):
        part = None
        if j in present:
            sel = torch.nonzero(block == j, as_tuple=True)[0]
            part = linear(g[sel].t().contiguous(), x[sel].t().contiguous(), None)
        counter.push(part)
    folded = None if counter.empty() else counter.result()
    if folded is None:
        return torch.full((g.shape[1], x.shape[1]), -0.0, dtype=torch.float32, device=g.device)
    return folded
