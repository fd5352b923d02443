"""linear's weight gradient (spec 29.2) from a backend's own linear, for the backends that run it as a sequence
of linear calls: the rows fall in blocks of spec.LINEAR_GRAD_BLOCK positions; each block with rows is
linear(g_b^T, x_b^T), the exact sum over the block's rows rounded once; the blocks are row-folded (spec 29.1).

The fold is a binary counter over the blocks in order: two subtrees of the same size are added (left + right,
one binary32 add per element) as soon as both exist, and what remains is added right to left at the end, which
is spec 29.1's tree over 2^ceil(log2 blocks) leaves padded with -0.0. A block without rows is a -0.0 leaf, the
identity, so it is carried as None and never added. At most log2(blocks) partial gradients are held.
"""

import torch

from .. import spec


def _plus(left, right):
    if left is None or right is None:
        return right if left is None else left
    return left + right


def weight_grad(linear, x, g, positions, rows):
    """x [M, K], g [M, N], positions int64 [M] (distinct, below rows) -> [N, K] float32, by `linear`."""
    block = positions // spec.LINEAR_GRAD_BLOCK
    n_blocks = -(-int(rows) // spec.LINEAR_GRAD_BLOCK)
    present = set(torch.unique(block).tolist())
    stack = []                                       # [(leaves, partial or None)]
    for j in range(n_blocks):
        part = None
        if j in present:
            sel = torch.nonzero(block == j, as_tuple=True)[0]
            part = linear(g[sel].t().contiguous(), x[sel].t().contiguous(), None)
        leaves = 1
        while stack and stack[-1][0] == leaves:
            _, left = stack.pop()
            part, leaves = _plus(left, part), leaves * 2
        stack.append((leaves, part))
    folded = None
    while stack:
        _, left = stack.pop()
        folded = _plus(left, folded)
    if folded is None:
        return torch.full((g.shape[1], x.shape[1]), -0.0, dtype=torch.float32, device=g.device)
    return folded
