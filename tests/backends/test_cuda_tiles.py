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


# Rows and elements per program of the row and elementwise kernels (layout.block_rows,
# layout.block_elements) change no bit either.  The backward kernels (spec 26) under a
# tile of 2 rows of 7 and of 1 row of 1000, and 16 and 1024 elements per program of the
# elementwise ones: several programs each time, the last one partial.
@pytest.mark.parametrize("n_rows,n,tile", [(5, 7, 16), (3, 1000, 1024)])
def test_backward_under_other_tiles(monkeypatch, n_rows, n, tile):
    from bitparity.backends.cuda import layout

    monkeypatch.setattr(layout, "INTERPRETER_TILE", tile)
    cuda, numpy = _module("cuda"), _module("numpy")
    rng = np.random.default_rng([n_rows, n])
    x, g, other = _randn(rng, n_rows, n), _randn(rng, n_rows, n), _randn(rng, n_rows, n)
    g_row = _randn(rng, n_rows)
    mask = torch.from_numpy(rng.random((n_rows, n)) < 0.7)
    mask[-1] = False
    tokens = torch.from_numpy(rng.integers(0, n, n_rows))
    scale = 1 / torch.linspace(0.5, 1.5, n_rows)                        # one per row
    y, p, h = numpy.log_softmax(x, mask, scale), numpy.softmax(x, mask, scale), numpy.entropy(x, mask, scale)
    cases = [("logsumexp_backward", x, mask, scale, g_row), ("log_softmax_backward", y, mask, scale, g),
             ("softmax_backward", p, mask, scale, g), ("entropy_backward", x, mask, scale, h, g_row),
             ("token_logprobs_backward", x, tokens, scale, g_row), ("masked_mean_backward", mask, g_row),
             ("masked_whiten_backward", x, mask, True, True, 1e-8, "add", g),
             ("masked_whiten_backward", x, mask, False, False, 0.5, "clamp", g),
             ("kl_penalty_backward", x.reshape(-1), other.reshape(-1), "k3", 10.0, 0.5, g.reshape(-1))]
    cases += [("ppo_policy_loss_backward", x, other, g, mask, 0.8, 1.28, 3.0, 0.3, agg, torch.tensor([0.7]))
              for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
    for name, *args in cases:
        _same(getattr(cuda, name)(*args), getattr(numpy, name)(*args))
