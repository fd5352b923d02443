"""Spec 29.1's row fold over partial sums that arrive left to right: a binary counter.

Used where the partials are computed one at a time and holding them all would cost too much memory:
`optim.GradientFold` (one partial per micro-batch) and `backends/linear_grad.py` (one per block of linear's weight
gradient, spec 29.2). Two partials covering the same number of leaves are added (left + right) as soon as both
exist; what remains is added right to left at the end. That is spec 29.1's pairwise tree over the next power of
two of leaves, padded with -0.0, whose padding is never added. At most log2(partials) partials are held.
"""


def plus(left, right):
    """left + right, one binary32 add per element; None is a leaf of the row fold's -0.0 padding (an identity)."""
    if left is None or right is None:
        return right if left is None else left
    return left + right


class Counter:
    """push() the partials in order, then result(). combine(left, right) adds two partials (default: plus)."""

    def __init__(self, combine=plus):
        self._combine = combine
        self._stack = []                                  # [(level, partial)]: a partial of 2**level leaves

    def empty(self):
        return not self._stack

    def push(self, partial):
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, left = self._stack.pop()
            partial, level = self._combine(left, partial), level + 1
        self._stack.append((level, partial))

    def result(self):
        """The fold of every partial pushed (at least one); the counter is left empty."""
        _, folded = self._stack.pop()
        while self._stack:                                # right to left: the -0.0 padding of spec 29.1
            _, left = self._stack.pop()
            folded = self._combine(left, folded)
        return folded
