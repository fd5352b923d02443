"""What only the cpu backend's linear (spec 24.1) has: its three exact paths (linear.c's fused AVX-512 VNNI kernel
where the CPU has VNNI, else torch._int_mm where a probe proves it exact, else the C int8 GEMM), the probe, rows
longer than one int32 chunk, every ISA build, and the weight cache.

Every result is compared bit for bit with the numpy reference. The two other paths are forced by replacing the
VNNI check's and the probe's answers, so all three run on this machine.
"""

import numpy as np
import pytest
import torch

from bitparity.backends import cpu
from bitparity.backends import numpy as reference
from bitparity.backends.cpu import int_linear
from bitparity.compare.metrics import canonical_bits

LEVELS = tuple(range(cpu.isa_level() + 1))


def _case(m, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, 1)))
    x[:, :: max(1, k // 8)] *= 1000.0                                  # outlier channels
    w = rng.standard_normal((n, k)) * 0.05
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(w.astype(np.float32))


# Short products go to the C GEMM whatever the probe says (int_linear.INT_MM_MIN_ROWS); 40 and 64 rows of x make
# 200 and 320 rows of digit slices, which torch._int_mm multiplies where the probe passed. For the fused kernel:
# k not a multiple of 4 (zero padding), n not a multiple of 16 (a partial panel), m not a multiple of 3 (the 1- and
# 2-row tiles), and rows spanning several cache blocks (40 rows of k = 4100: blocks of 9).
SHAPES = [(1, 1, 1), (1, 1, 7), (3, 2, 1), (5, 33, 9), (17, 300, 40), (2, 4100, 3), (40, 300, 40), (64, 1, 5),
          (40, 4100, 17)]
PATHS = ("fused", "int_mm", "fallback")


def _force(monkeypatch, path):
    """Makes linear take `path`: the fused kernel needs VNNI (skipped without it); the others are forced off it."""
    if path == "fused":
        if not int_linear.vnni(cpu.build()._lib):
            pytest.skip("this CPU has no AVX-512 VNNI: the fused kernel does not run here")
        return
    monkeypatch.setattr(int_linear, "vnni", lambda lib: False)
    if path == "fallback":
        monkeypatch.setattr(int_linear, "int_mm_is_exact", lambda: False)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_each_path_gives_the_reference_bits(monkeypatch, path, m, k, n):
    _force(monkeypatch, path)
    x, w = _case(m, k, n, [m, k, n])
    bias = torch.linspace(-1, 1, n)
    calls = []
    monkeypatch.setattr(int_linear, "_int_mm", lambda a, b, real=int_linear._int_mm: calls.append(1) or real(a, b))
    fused = []
    monkeypatch.setattr(int_linear, "fused_linear",
                        lambda *a, real=int_linear.fused_linear: fused.append(1) or real(*a))
    for level in LEVELS:
        got = cpu.build(level).linear(x, w.clone(), bias)          # a fresh weight: no cached digits
        assert torch.equal(canonical_bits(got), canonical_bits(reference.linear(x, w, bias))), level
    assert bool(fused) == (path == "fused")
    assert bool(calls) == (path == "int_mm" and int_linear.X_SLICES * m >= int_linear.INT_MM_MIN_ROWS)


def test_the_probe_finds_int_mm_exact_here():
    # This machine has AVX-512 VNNI, where oneDNN's s8 x s8 products sum exactly in int32 (docs/benchmarks.md);
    # a CPU without it fails the probe and takes the fallback, which the test above runs.
    assert int_linear.int_mm_is_exact()


def test_the_probe_rejects_a_gemm_that_saturates(monkeypatch):
    # The negative control: oneDNN without VNNI saturates u8 x s8 pair sums at int16 (127 * 127 * 2 -> 255).
    def saturating(a, b):
        products = a.to(torch.int64)[:, None, :] * b.to(torch.int64)[None, :, :]
        pairs = torch.nn.functional.pad(products, (0, products.shape[-1] % 2)).reshape(*products.shape[:2], -1, 2)
        return pairs.sum(-1).clamp(-2 ** 15, 2 ** 15 - 1).sum(-1).to(torch.int32)
    int_linear.int_mm_is_exact.cache_clear()
    monkeypatch.setattr(int_linear, "_int_mm", saturating)
    monkeypatch.setattr(int_linear, "CHUNK_K", 64)               # keeps the emulated GEMM small
    try:
        assert not int_linear.int_mm_is_exact()
    finally:
        int_linear.int_mm_is_exact.cache_clear()


@pytest.mark.parametrize("path", PATHS)
def test_rows_longer_than_one_int32_chunk(monkeypatch, path):
    # K = CHUNK_K + 5 with every digit product at its largest: the int32 chunks are added in 128 bits (the fused
    # kernel's chunks are 16384 terms: eight and a remainder here).
    _force(monkeypatch, path)
    k = int_linear.CHUNK_K + 5
    top = np.float32(np.nextafter(np.float32(2), np.float32(0)))
    x = torch.full((2, k), float(top))
    x[1, ::2] = -float(top)
    w = torch.full((1, k), float(top))
    assert torch.equal(canonical_bits(cpu.linear(x, w, None)), canonical_bits(reference.linear(x, w, None)))


@pytest.mark.parametrize("path", PATHS)
def test_a_sticky_bit_below_binary64_precision_breaks_the_tie(monkeypatch, path):
    # S = 2^64 + 2^40 + 16 (x's Q = [2^37, 2^13, 16] against the weight's [2^27, 2^27, 1]): 2^40 is half of the
    # result's last place and 16 lies below binary64's 53 bits, so a binary64 sum rounded again to binary32 ties
    # to even (down: the negative control below); the fused kernel's round-to-odd step and the 128-bit rounding
    # keep the sticky bit and round up.
    _force(monkeypatch, path)
    x = torch.tensor([[2.0 ** 33, 2.0 ** 9, 1.0], [-2.0 ** 33, -2.0 ** 9, -1.0], [2.0 ** 33, 2.0 ** 9, 0.0]])
    w = torch.tensor([[1.0, 1.0, 2.0 ** -27]])
    got = cpu.linear(x, w, None)
    assert torch.equal(canonical_bits(got), canonical_bits(reference.linear(x, w, None)))
    assert got[:, 0].tolist() == [2.0 ** 33 + 2.0 ** 10, -(2.0 ** 33 + 2.0 ** 10), 2.0 ** 33]
    assert float(np.float32(np.float64(2 ** 64 + 2 ** 40 + 16) * 2.0 ** -31)) == 2.0 ** 33      # the trap


@pytest.mark.parametrize("path", ("fused", "int_mm"))
def test_the_weight_gradient_blocks_give_the_reference_bits(monkeypatch, path):
    # weight_grad's 32-row blocks: the fused kernel (uncached, vector rounding) where VNNI runs, else short_linear's
    # binary64 products; rows out of order, blocks partly filled, one block without rows.
    _force(monkeypatch, path)
    x, g = _case(70, 40, 24, 7)[0], _case(70, 24, 1, 8)[0]
    positions = torch.from_numpy(np.random.default_rng(7).permutation(128)[:70])
    got = cpu.weight_grad(x, g, positions, 160)
    assert torch.equal(canonical_bits(got), canonical_bits(reference.weight_grad(x, g, positions, 160)))


@pytest.mark.parametrize("path", PATHS)
def test_subnormal_results_do_not_depend_on_flush_to_zero(monkeypatch, path):
    # Without a bias, linear's rounding is integer work, so torch.set_flush_denormal (FTZ and DAZ on x86) changes no
    # bit: the fused kernel leaves results below 2^-126 to the 128-bit rounding instead of vcvtpd2ps, which FTZ
    # would flush to 0.
    _force(monkeypatch, path)
    x, w = _case(6, 40, 20, 11)
    x = x * 2.0 ** -80
    w = w * 2.0 ** -60
    want = reference.linear(x, w, None)
    assert ((want != 0) & (want.abs() < 2.0 ** -126)).sum() > 20                     # subnormal results
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        got = cpu.linear(x, w.clone(), None)
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(canonical_bits(got), canonical_bits(want))


def test_the_weight_cache_never_serves_stale_digits():
    x, w = _case(4, 64, 8, 0)
    weight = torch.nn.Parameter(w.clone())
    first = cpu.linear(x, weight.detach(), None)
    assert torch.equal(cpu.linear(x, weight.detach(), None), first)                  # a hit: same bits
    with torch.no_grad():
        weight.data.copy_(w * 2)                   # in place, without bumping weight._version
    got = cpu.linear(x, weight.detach(), None)
    assert torch.equal(canonical_bits(got), canonical_bits(reference.linear(x, w * 2, None)))
    assert not torch.equal(got, first)
    weight.data[3, 5] = float("nan")               # one element: the whole weight is compared
    got = cpu.linear(x, weight.detach(), None)
    assert torch.isnan(got[:, 3]).all() and not torch.isnan(got[:, :3]).any()


def test_the_weight_cache_is_bounded(monkeypatch):
    cache = int_linear.WeightCache(limit=3 * 8 * 64)
    monkeypatch.setattr(int_linear, "WEIGHTS", cache)
    x = torch.randn(2, 8)
    weights = [torch.randn(8, 8) for _ in range(5)]
    for w in weights:
        assert torch.equal(canonical_bits(cpu.linear(x, w, None)), canonical_bits(reference.linear(x, w, None)))
    assert cache._bytes <= cache.limit and len(cache._entries) == 3
