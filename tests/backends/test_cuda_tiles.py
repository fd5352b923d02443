"""The cuda backend's tiles change no bit: its model ops under other geometries than the interpreter's.

layout.py sizes each program's tile of products (INTERPRETER_PRODUCTS in the Triton interpreter,
GPU_PRODUCTS on a GPU).  Rows, outputs and dims are independent, so any tile must give the numpy
reference's bits.  Here the interpreter runs the GPU's tiles (one query per program, the output dims of
attention in several passes, 8 x 8 outputs of linear) and a tiny one (every block of one element), on
shapes that leave partial blocks on every axis.
"""

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from bitparity.backends import _module  # noqa: E402
from bitparity.compare.metrics import canonical_bits  # noqa: E402


def _randn(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def _use_tile(monkeypatch, tile):
    from bitparity.backends.cuda import layout

    monkeypatch.setattr(layout, "INTERPRETER_PRODUCTS", layout.GPU_PRODUCTS if tile == "gpu" else 1)


def _same(a, b):
    assert torch.equal(canonical_bits(a), canonical_bits(b))


@pytest.mark.parametrize("tile", ["gpu", "tiny"])
def test_linear_under_other_tiles(monkeypatch, tile):
    _use_tile(monkeypatch, tile)
    rng = np.random.default_rng(11)
    x, w, bias = _randn(rng, 5, 70), _randn(rng, 11, 70), _randn(rng, 11)
    _same(_module("cuda").linear(x, w, bias), _module("numpy").linear(x, w, bias))


# GPU tiles: 4 x 4 rows by all 8 dims in one program for the first shape; one query per
# program and 32 of the 130 dims per pass (the last pass partial) for the second.  The
# tiny tile: one row, one dim per pass.
@pytest.mark.parametrize("tile,tq,tk,d", [("gpu", 3, 5, 6), ("gpu", 1, 70, 130), ("tiny", 3, 5, 6)])
def test_attention_under_other_tiles(monkeypatch, tile, tq, tk, d):
    _use_tile(monkeypatch, tile)
    rng = np.random.default_rng([tq, tk, d])
    q, k, v = _randn(rng, 3, tq, d), _randn(rng, 3, tk, d), _randn(rng, 3, tk, d)
    lengths = torch.tensor([tk, tq, (tq + tk) // 2])
    _same(_module("cuda").attention(q, k, v, lengths, True, 0.3),
          _module("numpy").attention(q, k, v, lengths, True, 0.3))
