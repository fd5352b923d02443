"""The tensor-parallel linear's exact partial (spec 31.1) on the `cpu` backend: linear's quantisation (linear.c)
and int8 GEMMs (int_linear.py: torch._int_mm where proven exact, else linear.c's), with the 20 slice products
gathered into their digit weights instead of rounded. Its own file, next to int_linear.py, so that linear's
optimisation and this entry point change independently."""

import torch

from ... import spec
from . import int_linear as _linear


def digit_planes(lib, x, weight, threads):
    """x [M, K], weight [N, K] -> int64 [X_SLICES + W_SLICES - 1, M, N]: T_s = sum over slice pairs i + j = s of
    the int8 GEMM of x's slice i with the weight's slice j, so that S = sum_s 256^s T_s exactly (nothing is
    rounded). linear's quantisation and GEMMs, in passes of rows as in linear; the weight is not taken from
    WEIGHTS, since the tensor-parallel caller passes a fresh tensor each call. Each pair's int32 chunk is exact
    (|d d'| <= 2^14, CHUNK_K terms) and at most four pairs share a diagonal, so T_s stays below 2^33 per chunk;
    chunks add in int64."""
    (m, k), n = x.shape, weight.shape[0]
    planes = torch.zeros((_linear.X_SLICES + _linear.W_SLICES - 1, m, n), dtype=torch.int64)
    if m == 0 or n == 0:
        return planes
    w_digits, _, _ = _linear.quantise(lib, weight, spec.LINEAR_BW, threads)
    w_slices = w_digits.reshape(_linear.W_SLICES * n, k)
    rows = max(-(-_linear.INT_MM_MIN_ROWS // _linear.X_SLICES),
               _linear.PARTIAL_BYTES // (4 * _linear.X_SLICES * _linear.W_SLICES * n))
    for start in range(0, m, rows):
        xs = x[start:start + rows]
        mb = xs.shape[0]
        x_digits, _, _ = _linear.quantise(lib, xs, spec.LINEAR_BX, threads)
        x_slices = x_digits.reshape(_linear.X_SLICES * mb, k)
        for c in range(0, k, _linear.CHUNK_K):
            p = _linear._gemm(lib, x_slices[:, c:c + _linear.CHUNK_K].contiguous(),
                              w_slices[:, c:c + _linear.CHUNK_K].contiguous(), threads)
            p = p.reshape(_linear.X_SLICES, mb, _linear.W_SLICES, n)
            for i in range(_linear.X_SLICES):
                for j in range(_linear.W_SLICES):
                    planes[i + j, start:start + mb] += p[i, :, j, :]
    return planes
